import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    globalSetup: ['test/harness/global-teardown.ts'],
    include: ['test/**/*.test.ts', 'packages/*/src/**/*.test.ts', 'api/src/**/*.test.ts', 'scheduler/src/**/*.test.ts', 'gateway/src/**/*.test.ts', 'runner-daemon/src/**/*.test.ts'],
    pool: 'forks',
    poolOptions: { forks: { maxForks: 2, minForks: 1 } },
    testTimeout: 60_000,
    hookTimeout: 90_000,
    reporters: ['default', 'json'],
    outputFile: { json: 'test-results.json' },
  },
});

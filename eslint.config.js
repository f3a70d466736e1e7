import tseslint from 'typescript-eslint';
import importX from 'eslint-plugin-import-x';

export default tseslint.config(
  { ignores: ['**/dist/**', 'console/src/generated/**', 'test-output/**', '**/node_modules/**', 'docker/build/**', '.data/**', 'coverage/**'] },
  {
    files: ['**/*.ts', '**/*.tsx'],
    extends: [tseslint.configs.base],
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    plugins: { 'import-x': importX },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: false }],
      '@typescript-eslint/await-thenable': 'error',
      '@typescript-eslint/no-explicit-any': 'error',
      'import-x/no-cycle': ['error', { maxDepth: 10, ignoreExternal: true }],
      'import-x/no-self-import': 'error',
    },
  },
  {
    // Processes stand on packages: none imports another process's code. The api and the runner
    // are processes; what more than one process needs lives in packages/ (the Run life cycle in
    // @agentplane/domain; the runner's config-dir files and exit codes in @agentplane/protocol;
    // sandbox labels, the Docker client and the reaper in @agentplane/sandbox). Starting a
    // process by its entry file (the platform's supervisor) is not importing it.
    files: ['packages/**/*.ts', 'api/**/*.ts', 'scheduler/**/*.ts', 'gateway/**/*.ts', 'runner-daemon/**/*.ts', 'platform/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', {
        paths: [{ name: '@agentplane/api', message: 'the api is a process: move shared logic into a package (e.g. @agentplane/domain)' }],
        patterns: [
          { group: ['@agentplane/runner-daemon', '@agentplane/runner-daemon/*'], message: 'the runner is a process: move what another process needs of it into a package (e.g. @agentplane/sandbox, @agentplane/protocol)' },
          { group: ['@agentplane/scheduler', '@agentplane/scheduler/*', '@agentplane/platform', '@agentplane/platform/*'], message: 'processes do not import other processes' },
        ],
      }],
    },
  },
);

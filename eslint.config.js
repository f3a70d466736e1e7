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
    // Processes stand on packages: none imports another process's code. The api is a process;
    // what more than one process needs lives in packages/ (the Run life cycle in @agentplane/domain).
    files: ['packages/**/*.ts', 'scheduler/**/*.ts', 'gateway/**/*.ts', 'runner-daemon/**/*.ts', 'platform/**/*.ts'],
    rules: {
      'no-restricted-imports': ['error', {
        paths: [{ name: '@agentplane/api', message: 'the api is a process: move shared logic into a package (e.g. @agentplane/domain)' }],
        patterns: [{ group: ['@agentplane/scheduler', '@agentplane/platform'], message: 'processes do not import other processes' }],
      }],
    },
  },
);

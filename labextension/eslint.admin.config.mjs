// The hub service's admin panel script (plain JavaScript served as is, no build step).
import js from '@eslint/js';
import globals from 'globals';

export default [
  {
    files: ['**/*.js'],
    ...js.configs.recommended,
    languageOptions: { ecmaVersion: 2022, sourceType: 'script', globals: globals.browser },
    rules: { ...js.configs.recommended.rules, eqeqeq: 'error', curly: ['error', 'multi-line'] }
  }
];

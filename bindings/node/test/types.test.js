'use strict';
// The generated declarations (native/index.d.ts from napi, types/ from lib's JSDoc)
// type-check a strict TypeScript consumer of the package: `tsc --noEmit`.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { execFileSync } = require('node:child_process');

test('a strict TypeScript program type-checks against the declarations', { timeout: 120_000 }, () => {
  const pkg = path.dirname(require.resolve('phalanx/package.json'));
  const tsc = require.resolve('typescript/bin/tsc', { paths: [pkg] });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'phalanx-types-'));
  try {
    fs.mkdirSync(path.join(dir, 'node_modules'));
    fs.symlinkSync(pkg, path.join(dir, 'node_modules', 'phalanx'), 'dir');
    fs.copyFileSync(path.join(__dirname, 'consumer.ts'), path.join(dir, 'consumer.ts'));
    const config = {
      compilerOptions: {
        strict: true, noEmit: true, target: 'es2022', module: 'nodenext', moduleResolution: 'nodenext',
        types: ['node'], typeRoots: [path.join(pkg, 'node_modules', '@types')], skipLibCheck: false,
      },
      files: ['consumer.ts'],
    };
    fs.writeFileSync(path.join(dir, 'tsconfig.json'), JSON.stringify(config));
    try {
      execFileSync(process.execPath, [tsc, '-p', dir], { encoding: 'utf8' });
    } catch (e) {
      assert.fail(`tsc --noEmit failed:\n${e.stdout}${e.stderr}`);
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

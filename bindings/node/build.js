#!/usr/bin/env node
// Builds the package from source, as `npm install` runs it: the addon (napi build, a
// release build by cargo that reuses CARGO_TARGET_DIR) with its generated declarations
// (native/index.d.ts), then the declarations of lib/ from its JSDoc (tsc).
//
// npm installs a folder dependency as a link and runs this before it has installed the
// folder's own dependencies, so the build tools are installed here first when missing.
// `node build.js --debug` builds the addon unoptimised.
'use strict';
const { execFileSync } = require('node:child_process');
const path = require('node:path');

const root = __dirname;
const run = (cmd, args) => execFileSync(cmd, args, { cwd: root, stdio: 'inherit' });
const tool = (pkg, bin) => {
  try {
    return path.join(path.dirname(require.resolve(`${pkg}/package.json`, { paths: [root] })), bin);
  } catch {
    return null;
  }
};

if (!tool('@napi-rs/cli', 'dist/cli.js') || !tool('typescript', 'bin/tsc') || !tool('@types/node', 'package.json')) {
  const npm = process.platform === 'win32' ? 'npm.cmd' : 'npm';
  run(npm, ['install', '--no-save', '--no-package-lock', '--ignore-scripts', '--no-audit', '--no-fund', '--loglevel=error']);
}
const release = process.argv.includes('--debug') ? [] : ['--release'];
run(process.execPath, [tool('@napi-rs/cli', 'dist/cli.js'), 'build', ...release, '--output-dir', 'native', '--dts', 'index.d.ts', '--no-const-enum']);
run(process.execPath, [tool('typescript', 'bin/tsc'), '-p', 'tsconfig.json']);

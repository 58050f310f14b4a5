// @ts-check
'use strict';
// The addon `npm install` built (napi build, into native/).
const path = require('node:path');

/** @type {typeof import('../native/index')} */
let native;
try {
  native = require(path.join(__dirname, '..', 'native', 'phalanx.node'));
} catch (e) {
  const err = new Error(
    `phalanx: the native addon is missing or does not load (${e instanceof Error ? e.message : e}); ` +
      'build it with `npm install` in bindings/node (needs Rust and a C compiler)',
  );
  throw Object.assign(err, { cause: e });
}
module.exports = native;

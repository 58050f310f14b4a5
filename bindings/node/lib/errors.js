// @ts-check
'use strict';
/**
 * The errors Phalanx throws: `Error` subclasses with a stable `code`. The addon throws
 * plain errors whose `code` names their kind; `rethrow` turns them into these classes,
 * and napi's argument errors into `TypeError`s.
 */

class PhalanxError extends Error {
  /**
   * @param {string} message
   * @param {string} [code]
   */
  constructor(message, code) {
    super(message);
    this.name = new.target.name;
    /** The kind of error, stable across versions. */
    this.code = code ?? /** @type {any} */ (new.target).CODE ?? 'PHALANX_ERROR';
  }
}
/** A node or cluster configuration was rejected. */
class ConfigError extends PhalanxError {
  static CODE = 'PHALANX_CONFIG';
}
/** `handle` refused an input the caller got wrong; bytes from the network never cause it. */
class HandleError extends PhalanxError {
  static CODE = 'PHALANX_HANDLE';
  /** `handleMany`: the outputs of the whole batch. @type {import('../native/index').Output[] | undefined} */
  outputs;
  /** `handleMany`: the inputs refused. @type {import('../native/index').Refusal[] | undefined} */
  refusals;
}
/** The request queue is full: retry once outstanding requests complete. */
class BackpressureError extends HandleError {
  static CODE = 'PHALANX_BACKPRESSURE';
}
/** A trace file is malformed, of another version, or has a bad configuration. */
class TraceError extends PhalanxError {
  static CODE = 'PHALANX_TRACE';
}
/** Replaying a trace produced something other than what was recorded. */
class DivergenceError extends TraceError {
  static CODE = 'PHALANX_DIVERGENCE';
}
/** The write-ahead log could not be read or written, or is corrupt. */
class StorageError extends PhalanxError {
  static CODE = 'PHALANX_STORAGE';
}
/** A key-value result did not decode, or reports an invalid operation. */
class KvError extends PhalanxError {
  static CODE = 'PHALANX_KV';
}
/** A host stopped: the core refused the host's own input, or the application failed. */
class HostError extends PhalanxError {
  static CODE = 'PHALANX_HOST';
}
/** An operation did not complete in time (no quorum of matching replies). */
class TimeoutError extends PhalanxError {
  static CODE = 'PHALANX_TIMEOUT';
}

/** @type {Record<string, new (message: string) => PhalanxError>} */
const BY_CODE = {};
for (const c of [ConfigError, HandleError, BackpressureError, TraceError, DivergenceError, StorageError, KvError, HostError, TimeoutError]) {
  BY_CODE[c.CODE] = c;
}
BY_CODE.PHALANX_IO = PhalanxError;

/** napi's codes for an argument of the wrong type, and ours. */
const TYPE_CODES = new Set([
  'ERR_INVALID_ARG_TYPE', 'InvalidArg', 'ObjectExpected', 'StringExpected', 'NameExpected', 'FunctionExpected',
  'NumberExpected', 'BooleanExpected', 'ArrayExpected', 'BigintExpected', 'DateExpected', 'ArrayBufferExpected',
  'DetachableArraybufferExpected',
]);

/**
 * The package's error for an error from the addon (others pass through).
 * @param {unknown} e
 * @returns {unknown}
 */
function convert(e) {
  if (!(e instanceof Error) || e instanceof PhalanxError) return e;
  const code = /** @type {{code?: unknown}} */ (e).code;
  if (typeof code !== 'string') return e;
  const cls = BY_CODE[code];
  if (cls) {
    const err = new cls(e.message);
    if (code === 'PHALANX_IO') err.code = code;
    return err;
  }
  if (TYPE_CODES.has(code)) {
    const err = new TypeError(e.message);
    Object.assign(err, { code: 'ERR_INVALID_ARG_TYPE' });
    return err;
  }
  return e;
}

/**
 * An error of `code` saying `message` (as the addon reports them in round results).
 * @param {{code: string, message: string}} e
 */
function fromCode(e) {
  return /** @type {Error} */ (convert(Object.assign(new Error(e.message), { code: e.code })));
}

/**
 * Calls `fn`, throwing the package's error classes.
 * @template T
 * @param {() => T} fn
 * @returns {T}
 */
function guard(fn) {
  try {
    return fn();
  } catch (e) {
    throw convert(e);
  }
}

module.exports = {
  PhalanxError, ConfigError, HandleError, BackpressureError, TraceError, DivergenceError, StorageError, KvError,
  HostError, TimeoutError, convert, fromCode, guard,
};

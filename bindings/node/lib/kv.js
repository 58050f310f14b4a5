// @ts-check
'use strict';
/** The key-value application phalanxd replicates: encoders, result decoding, the store. */
const native = require('./native');
const { KvError, guard } = require('./errors');
const { KvStore } = require('./kvstore');

/** @typedef {{ swapped: boolean, before: Buffer | null }} CasResult */

/** put(key, value); its result is the value before. @param {Uint8Array} key @param {Uint8Array} value */
const put = (key, value) => guard(() => native.kvPut(key, value));
/** get(key); its result is the current value. @param {Uint8Array} key */
const get = (key) => guard(() => native.kvGet(key));
/** delete(key); its result is the value before. @param {Uint8Array} key */
const del = (key) => guard(() => native.kvDelete(key));
/**
 * Compare-and-swap: write `next` if the value is `expected` (`null`: absent).
 * @param {Uint8Array} key @param {Uint8Array | null} expected @param {Uint8Array} next
 */
const cas = (key, expected, next) => guard(() => native.kvCas(key, expected, next));

/**
 * Decodes a result; throws `KvError` for an invalid-operation result.
 * @param {Uint8Array} reply
 * @returns {import('../native/index').KvReply}
 */
const decodeReply = (reply) => guard(() => native.kvDecodeReply(reply));

/** The value a put, get or delete returned (`null`: absent). @param {Uint8Array} reply @returns {Buffer | null} */
function decodeValue(reply) {
  const r = decodeReply(reply);
  if (r.type !== 'value') throw new KvError(`expected a value result, got a ${r.type} result`);
  return r.value ?? null;
}

/** What a cas returned. @param {Uint8Array} reply @returns {CasResult} */
function decodeCas(reply) {
  const r = decodeReply(reply);
  if (r.type !== 'cas') throw new KvError(`expected a cas result, got a ${r.type} result`);
  return { swapped: r.swapped, before: r.before ?? null };
}

module.exports = { put, get, delete: del, cas, decodeReply, decodeValue, decodeCas, KvStore };

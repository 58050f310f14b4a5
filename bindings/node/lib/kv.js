// @ts-check
'use strict';
/** The key-value application phalanxd replicates: encoders, result decoding, the store. */
const native = require('./native');
const { KvError, guard } = require('./errors');

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

/**
 * The store phalanxd replicates, as a replica application (`execute`, `query`,
 * `snapshot`, `restore`): a JavaScript replica running it agrees byte for byte with
 * native ones.
 */
class KvStore {
  #kv = new native.KvStore();

  /** @param {Uint8Array} op @returns {Buffer} */
  execute(op) {
    return guard(() => this.#kv.execute(op));
  }

  /** A read-only op (a get), evaluated without changing the store. @param {Uint8Array} op @returns {Buffer} */
  query(op) {
    return guard(() => this.#kv.query(op));
  }

  /** @returns {Buffer} */
  snapshot() {
    return this.#kv.snapshot();
  }

  /** Throws `KvError` for a snapshot that does not decode. @param {Uint8Array} snapshot */
  restore(snapshot) {
    guard(() => this.#kv.restore(snapshot));
  }

  /** @param {Uint8Array} key @returns {Buffer | null} */
  get(key) {
    return guard(() => this.#kv.get(key));
  }

  /** @returns {number} */
  get size() {
    return this.#kv.size;
  }
}

exports.put = put;
exports.get = get;
exports.delete = del;
exports.cas = cas;
exports.decodeReply = decodeReply;
exports.decodeValue = decodeValue;
exports.decodeCas = decodeCas;
exports.KvStore = KvStore;

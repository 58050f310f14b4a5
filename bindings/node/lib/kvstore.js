// @ts-check
'use strict';
const native = require('./native');
const { guard } = require('./errors');

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

module.exports = { KvStore };

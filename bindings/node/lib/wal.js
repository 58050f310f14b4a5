// @ts-check
'use strict';
const native = require('./native');
const { guard } = require('./errors');

/**
 * phalanxd's write-ahead log in directory `dir` (`dir/wal.log`), for hosts that drive a
 * `Node` themselves: append each `persist` record, `sync`, then feed `persisted`; after
 * a restart feed `takeRecovered()` back as `recover` inputs. A torn tail is truncated;
 * other damage throws `StorageError` naming the file and offset, unless `repair`.
 */
class Wal {
  #wal;

  /** @param {string} dir @param {{ repair?: boolean }} [options] */
  constructor(dir, { repair = false } = {}) {
    this.#wal = guard(() => new native.Wal(dir, repair));
  }

  /** The records found at opening, oldest first (handed out once). @returns {Buffer[]} */
  takeRecovered() {
    return this.#wal.takeRecovered();
  }

  /** @param {Uint8Array} record */
  append(record) {
    guard(() => this.#wal.append(record));
  }

  /** Makes every appended record durable (one `fdatasync`). */
  sync() {
    guard(() => this.#wal.sync());
  }

  /** Drops the first `n` records. @param {number} n */
  compactBefore(n) {
    guard(() => this.#wal.compactBefore(n));
  }

  /** Records in the log, appended ones included. @returns {number} */
  get length() {
    return this.#wal.length;
  }
}

module.exports = { Wal };

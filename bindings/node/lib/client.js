// @ts-check
'use strict';
const path = require('node:path');
const { Host } = require('./host');
const { ClusterFile } = require('./config');
const kv = require('./kv');
const { BackpressureError, PhalanxError, TimeoutError, fromCode } = require('./errors');

/**
 * @typedef {import('./host').Replicas} Replicas
 * @typedef {import('../native/index').Input} Input
 * @typedef {{ storage?: string | null, timeout?: number }} ClientOptions
 */

/**
 * A Promise-based client of a PBFT cluster (phalanxd replicas, JavaScript `Replica`s, or
 * both). The core client node decides when a result stands: a quorum of matching
 * replies (2f+1 at n = 3f+1) for an ordered op (`execute`), 2f+1 matching answers for a
 * read-only one (`read`).
 *
 * Request numbers: the core persists a lease on them before the first request leaves.
 * With `storage` (a directory: phalanxd's write-ahead log, synced before acknowledging)
 * a restarted client never reuses one; `fromClusterFile` keeps it in `data/client-<id>`
 * beside the cluster file, where `phalanxd client` keeps its own.
 */
class Client {
  #host;
  #timeout;
  /** @type {Map<bigint, { resolve: (r: Buffer) => void }>} */
  #pending = new Map();
  /** Completions that came before their request number was known here (bounded). @type {Map<bigint, Buffer>} */
  #early = new Map();
  /** @type {Set<() => void>} */
  #completedWaiters = new Set();
  /** @type {Promise<void> | null} */
  #starting = null;

  /**
   * @param {Uint8Array} config this client's encoded configuration
   * @param {Replicas} replicas every replica's address
   * @param {ClientOptions} [options] `timeout` in milliseconds (default 10,000)
   */
  constructor(config, replicas, { storage = null, timeout = 10_000 } = {}) {
    this.#host = new Host(config, replicas, { storage, onOutput: (o) => this.#onOutput(o) });
    const { protocol, role } = this.#host.native;
    if (protocol !== 'pbft' || role !== 'client') {
      throw new PhalanxError(`node ${this.#host.id} is a ${protocol} ${role}, not a PBFT client`);
    }
    this.#timeout = timeout;
  }

  /**
   * A client of the cluster in `file` (`cluster.toml` from `phalanxd keygen`); `id`
   * defaults to the first client, `storage` to `data/client-<id>` beside the file
   * (`null`: in memory).
   * @param {string} file
   * @param {{ id?: number, storage?: string | null, timeout?: number }} [options]
   */
  static fromClusterFile(file, { id, storage, timeout } = {}) {
    const cluster = ClusterFile.load(file);
    const client = id ?? cluster.clients[0];
    if (client === undefined) throw new PhalanxError(`${cluster.path}: the cluster file lists no client`);
    const dir = storage === undefined ? path.join(path.dirname(path.resolve(file)), 'data', `client-${client}`) : storage;
    return new Client(cluster.nodeConfig(client), cluster.replicas, { storage: dir, timeout });
  }

  get id() {
    return this.#host.id;
  }

  /** Fault evidence seen: `"node:kind"` → count. */
  get faults() {
    return new Map(this.#host.faults);
  }

  /** Connects (and recovers its request-number lease). Requests start it too. */
  start() {
    this.#starting ??= this.#host.start();
    return this.#starting;
  }

  async close() {
    await this.#host.close();
  }

  /** @param {import('../native/index').Output} o */
  #onOutput(o) {
    if (o.type !== 'completed') return;
    const p = this.#pending.get(o.request);
    if (p) {
      this.#pending.delete(o.request);
      p.resolve(o.result);
    } else if (this.#early.size < 1024) {
      this.#early.set(o.request, o.result);
    }
    for (const w of this.#completedWaiters) w();
    this.#completedWaiters.clear();
  }

  /**
   * Orders `op` and resolves to its result once a quorum of replicas agree. Rejects with
   * `TimeoutError` after `timeout` ms.
   * @param {Uint8Array} op
   * @param {{ timeout?: number }} [options]
   * @returns {Promise<Buffer>}
   */
  execute(op, { timeout } = {}) {
    return this.#request({ type: 'submit', op }, timeout, 'no quorum of matching replies');
  }

  /**
   * Evaluates the read-only `op` at the replicas without ordering it, and resolves to its
   * result once 2f+1 agree; when they disagree or do not answer in time, the core has
   * `op` ordered instead, under the same request number.
   * @param {Uint8Array} op
   * @param {{ timeout?: number }} [options]
   * @returns {Promise<Buffer>}
   */
  read(op, { timeout } = {}) {
    return this.#request({ type: 'read', op }, timeout, 'no 2f+1 matching answers nor a quorum of matching replies');
  }

  /**
   * @param {Input & { op: Uint8Array }} input
   * @param {number | undefined} timeout
   * @param {string} missing
   */
  async #request(input, timeout, missing) {
    if (!(input.op instanceof Uint8Array)) {
      throw new TypeError(`op must be a Uint8Array or Buffer, got ${typeof input.op}`);
    }
    const ms = timeout ?? this.#timeout;
    const deadline = Date.now() + ms;
    await this.start();
    for (;;) {
      const { request, refusal } = await this.#host.feed(input);
      if (refusal === null && request !== null) return this.#await(request, deadline, ms, missing);
      const err = refusal ? fromCode(refusal) : new PhalanxError('the core numbered no request');
      if (!(err instanceof BackpressureError)) throw err;
      // `clientQueue` requests are outstanding: wait for one to complete.
      await new Promise((resolve, reject) => {
        const t = setTimeout(() => {
          this.#completedWaiters.delete(wake);
          reject(new TimeoutError(`client ${this.id}: ${this.#pending.size} requests outstanding and none completed within ${ms} ms (is a quorum of replicas running?)`));
        }, Math.max(0, deadline - Date.now()));
        const wake = () => {
          clearTimeout(t);
          resolve(undefined);
        };
        this.#completedWaiters.add(wake);
      });
    }
  }

  /**
   * @param {bigint} request
   * @param {number} deadline
   * @param {number} ms
   * @param {string} missing
   * @returns {Promise<Buffer>}
   */
  #await(request, deadline, ms, missing) {
    const early = this.#early.get(request);
    if (early) {
      this.#early.delete(request);
      return Promise.resolve(early);
    }
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => {
        this.#pending.delete(request);
        reject(new TimeoutError(`client ${this.id}: request ${request}: ${missing} within ${ms} ms (is a quorum of replicas running and reachable?)`));
      }, Math.max(0, deadline - Date.now()));
      this.#pending.set(request, {
        resolve: (r) => {
          clearTimeout(t);
          resolve(r);
        },
      });
    });
  }

  /** Writes `value` at `key`; resolves to the value before (`null`: absent). @param {Uint8Array} key @param {Uint8Array} value @param {{ timeout?: number }} [o] */
  async put(key, value, o) {
    return kv.decodeValue(await this.execute(kv.put(key, value), o));
  }

  /** Reads `key` through consensus (`null`: absent). @param {Uint8Array} key @param {{ timeout?: number }} [o] */
  async get(key, o) {
    return kv.decodeValue(await this.execute(kv.get(key), o));
  }

  /** Deletes `key`; resolves to the value before. @param {Uint8Array} key @param {{ timeout?: number }} [o] */
  async delete(key, o) {
    return kv.decodeValue(await this.execute(kv.delete(key), o));
  }

  /**
   * Writes `next` if the value is `expected` (`null`: absent).
   * @param {Uint8Array} key @param {Uint8Array | null} expected @param {Uint8Array} next @param {{ timeout?: number }} [o]
   */
  async cas(key, expected, next, o) {
    return kv.decodeCas(await this.execute(kv.cas(key, expected, next), o));
  }
}

module.exports = { Client };

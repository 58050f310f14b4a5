// @ts-check
'use strict';
const { Host } = require('./host');
const { ClusterFile } = require('./config');
const { PhalanxError } = require('./errors');
const records = require('./records');

/**
 * @typedef {import('./host').Replicas} Replicas
 * @typedef {import('./host').Address} Address
 * @typedef {import('../native/index').AppHooks} AppHooks
 * @typedef {{ seq: bigint, client: number, request: bigint }} Ordered where an operation
 *   was ordered: its batch, and the client's request number
 * @typedef {{
 *   execute(op: Buffer, ordered: Ordered): Uint8Array,
 *   snapshot(): Uint8Array,
 *   restore(snapshot: Buffer): void,
 *   query?(op: Buffer): Uint8Array,
 * }} Application
 * @typedef {{ storage?: string | null, repair?: boolean, listen?: Address | null, maxConnections?: number, log?: (message: string, error?: unknown) => void }} ReplicaOptions
 *   `maxConnections`: most connections accepted at once (default 1024; see `lib/host.js`)
 */

/** @param {unknown} v */
const isBytes = (v) => v instanceof Uint8Array;

/**
 * A PBFT replica whose state machine is a JavaScript object, `app`:
 * - `execute(op, { seq, client, request })` runs one ordered operation (of batch `seq`,
 *   client `client`'s request `request`) and returns its result (deterministic!);
 * - `snapshot()` captures the state at checkpoints; `restore(snapshot)` replaces it
 *   (state transfer, restart);
 * - optionally `query(op)` evaluates a client's read-only op without changing the
 *   state (`Client.read`); without it the replica answers no read, and clients have
 *   their reads ordered after `client_retry_ns`.
 *
 * It listens on its own address in `replicas` (or `listen`), dials the others and speaks
 * phalanxd's framing, so JavaScript and native replicas form one cluster. The core, its
 * storage and its cryptography run off the event loop; `app` runs on it, one batch at a
 * time. With `storage` (a directory) the core's records go to phalanxd's write-ahead log,
 * synced before they are acknowledged, and a restarted replica recovers from it; without
 * it they live in memory (a restarted replica rejoins empty, as a lagging one).
 *
 * An exception from `execute`, or a result that is not bytes, is logged and the
 * operation's result is empty; one from `query` is logged and answered with an empty
 * result (the client sees the disagreement and has the op ordered). An exception from
 * `snapshot` or `restore` stops the replica (`stopped` rejects): its state is unknown.
 */
class Replica {
  #host;
  #app;
  #log;
  /** @type {Promise<void> | null} */
  #starting = null;
  /** @type {Promise<Error>} */
  stopped;
  executedOps = 0;
  answeredQueries = 0;

  /**
   * @param {Uint8Array} config this replica's encoded configuration
   * @param {Replicas} replicas every replica's address (its own included)
   * @param {Application} app
   * @param {ReplicaOptions} [options]
   */
  constructor(config, replicas, app, { storage = null, repair = false, listen = null, maxConnections, log } = {}) {
    for (const name of ['execute', 'snapshot', 'restore']) {
      if (typeof (/** @type {any} */ (app)?.[name]) !== 'function') {
        throw new TypeError(`the application must have an ${name}() method`);
      }
    }
    this.#app = app;
    this.#log = log ?? ((m, e) => console.error(`phalanx: ${m}`, e ?? ''));
    this.#host = new Host(config, replicas, { storage, repair, app: this.#hooks(), onOutput: () => {}, listen: listen ?? true, maxConnections });
    const { protocol, role } = this.#host.native;
    if (protocol !== 'pbft' || role !== 'replica') {
      throw new PhalanxError(`node ${this.#host.id} is a ${protocol} ${role}, not a PBFT replica`);
    }
    this.stopped = new Promise((resolve) => (this.#host.onFailure = resolve));
  }

  /** Replica `id` of the cluster in `file` (`cluster.toml` from `phalanxd keygen`). @param {string} file @param {number} id @param {Application} app @param {ReplicaOptions} [options] */
  static fromClusterFile(file, id, app, options) {
    const cluster = ClusterFile.load(file);
    return new Replica(cluster.nodeConfig(id), cluster.replicas, app, options);
  }

  /** The hooks the native host calls the application through; they never throw. @returns {AppHooks} */
  #hooks() {
    const app = this.#app;
    return {
      execute: (batch) => {
        const { seq, ops } = records.decodeExecute(batch);
        return ops.map((/** @type {import('../native/index').Operation} */ o) => {
          this.executedOps++;
          try {
            const r = app.execute(o.op, { seq, client: o.client, request: o.request });
            if (isBytes(r)) return r;
            this.#log(`execute returned ${typeof r}, not bytes, in batch ${seq}; result empty`);
          } catch (e) {
            this.#log(`execute threw in batch ${seq}; result empty`, e);
          }
          return Buffer.alloc(0);
        });
      },
      snapshot: () => {
        try {
          const s = app.snapshot();
          if (isBytes(s)) return s;
          this.#log(`snapshot returned ${typeof s}, not bytes: stopping`);
        } catch (e) {
          this.#log('snapshot threw: stopping', e);
        }
        // Not bytes: the host fails the round and stops.
        return /** @type {any} */ (null);
      },
      restore: ({ seq, snapshot }) => {
        try {
          app.restore(snapshot);
          return null;
        } catch (e) {
          return `restore threw at batch ${seq}: ${e instanceof Error ? e.message : e}`;
        }
      },
      query:
        typeof app.query === 'function'
          ? ({ op }) => {
              try {
                const r = /** @type {(op: Buffer) => unknown} */ (app.query).call(app, op);
                if (isBytes(r)) {
                  this.answeredQueries++;
                  return r;
                }
                this.#log(`query returned ${typeof r}, not bytes`);
              } catch (e) {
                this.#log('query threw', e);
              }
              return null;
            }
          : undefined,
    };
  }

  get id() {
    return this.#host.id;
  }

  get app() {
    return this.#app;
  }

  /** Fault evidence seen: `"node:kind"` → count. */
  get faults() {
    return new Map(this.#host.faults);
  }

  /** Gauges and counters after the last round (view, primary, executed, stable, …). */
  status() {
    return this.#host.native.status();
  }

  /** Recovers from its log, listens and dials the other replicas. */
  start() {
    this.#starting ??= this.#host.start();
    return this.#starting;
  }

  /** Closes its connections (the log stays, for a restart). */
  async stop() {
    await this.#host.close();
  }
}

module.exports = { Replica };

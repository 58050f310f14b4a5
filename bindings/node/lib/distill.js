// @ts-check
'use strict';
const native = require('./native');
const { convert, guard } = require('./errors');

/** @typedef {import('../native/index').Delivered} Delivered */

/**
 * A client of a distillation deployment (`phalanxd keygen --protocol distill`): one of
 * its generated directory's clients, broadcasting messages through the brokers over UDP
 * in total order. It is phalanxd's own client, as `phalanxd client submit` runs it,
 * on a thread of its own: `submit` never blocks the event loop, and a client's
 * submissions go one at a time, in the order they were made.
 *
 * It keeps its seq range and last height record in phalanxd's write-ahead log (`dataDir`,
 * by default `data/client-<id>` beside the cluster file, shared with `phalanxd client`),
 * so a restarted client goes on from there.
 */
class DistillClient {
  #client;
  #timeout;
  /** @type {Promise<void> | null} */
  #closing = null;

  /**
   * Use `DistillClient.fromClusterFile`.
   * @param {import('../native/index').DistillClient} client
   * @param {number} timeout milliseconds
   */
  constructor(client, timeout) {
    this.#client = client;
    this.#timeout = timeout;
  }

  /**
   * Client `index` of the directory of the deployment in `file` (its `cluster.toml`).
   * Throws `ConfigError` for a file that is not a distillation deployment's, or an index
   * outside its directory.
   * @param {string} file
   * @param {{ index?: number, dataDir?: string, timeout?: number }} [options] `timeout`:
   *   milliseconds a submission may wait for its delivery (default 10,000)
   */
  static fromClusterFile(file, { index = 0, dataDir, timeout = 10_000 } = {}) {
    return new DistillClient(guard(() => native.DistillClient.start(file, index, dataDir)), timeout);
  }

  /** The client's node id (`2^31 + index`). @returns {number} */
  get id() {
    return this.#client.id;
  }

  /** The directory index it signs as. @returns {number} */
  get index() {
    return this.#client.index;
  }

  /**
   * Broadcasts `message` (a string is sent as UTF-8) and resolves to where it was
   * delivered once a broker hands back a certified delivery. Rejects with `TimeoutError`
   * when none came within `timeout` ms of its turn; the message may still be delivered
   * (the client resubmits it through the next broker meanwhile).
   * @param {Uint8Array | string} message
   * @param {{ timeout?: number }} [options]
   * @returns {Promise<Delivered>}
   */
  async submit(message, { timeout } = {}) {
    const bytes = typeof message === 'string' ? Buffer.from(message) : message;
    try {
      return await this.#client.submit(bytes, timeout ?? this.#timeout);
    } catch (e) {
      throw convert(e);
    }
  }

  /** Stops the client once the submissions made before have settled; later ones reject with `HostError`. */
  close() {
    this.#closing ??= this.#client.close().catch((e) => {
      throw convert(e);
    });
    return this.#closing;
  }
}

module.exports = { DistillClient };

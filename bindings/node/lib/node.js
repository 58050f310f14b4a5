// @ts-check
'use strict';
const native = require('./native');
const { HandleError, fromCode, guard } = require('./errors');
const records = require('./records');

/**
 * @typedef {import('../native/index').Input} Input
 * @typedef {import('../native/index').Output} Output
 * @typedef {import('../native/index').TimedInput} TimedInput
 * @typedef {import('../native/index').Refusal} Refusal
 * @typedef {import('../native/index').Stats} Stats
 */

/**
 * A Phalanx node (broker, publisher, subscriber, PBFT replica or client: the
 * configuration decides) behind the sans-IO shape: `handle(now, input)` feeds one input,
 * `poll()` drains outputs until `null` (iterating the node drains too), `pollTimeout()`
 * gives the next deadline at which to feed `{ type: 'timeout' }`. Time is an input: `now`
 * is in nanoseconds from any monotonic clock.
 */
class Node {
  #node;

  /** @param {Uint8Array} config an encoded configuration (`generateCluster`, `ClusterFile.nodeConfig`, `Trace.nodeConfig`) */
  constructor(config) {
    this.#node = guard(() => new native.Node(config));
  }

  /**
   * Feeds one input at `now` (ns). Throws `HandleError` (`BackpressureError` when the
   * request queue is full) for an input the caller got wrong; never for bytes from the
   * network.
   * @param {bigint | number} now
   * @param {Input} input
   */
  handle(now, input) {
    const batch = records.encodeInputs([{ now, input }]);
    guard(() => this.#node.feedRaw(batch));
    if (this.#node.refused > 0) throw fromCode(this.#node.refusals()[0]);
  }

  /**
   * Feeds every `{ now, input }` in order as one round (a host's gathered inputs, or a
   * trace's round), then drains: every output they produced, in order, in one call (the
   * sends of the round to one receiver share frames). A refused input does not stop the
   * others: the refusals are appended to `refusals` when it is given, and thrown
   * otherwise, after the whole batch, as a `HandleError` carrying `outputs` and `refusals`.
   * @param {readonly TimedInput[]} inputs
   * @param {Refusal[]} [refusals]
   * @returns {Output[]}
   */
  handleMany(inputs, refusals) {
    const batch = records.encodeInputs(inputs);
    const outputs = records.decodeOutputs(this.#received((out) => this.#node.roundRaw(batch, out)));
    if (this.#node.refused === 0) return outputs;
    const refused = this.#node.refusals();
    if (refusals) {
      refusals.push(...refused);
      return outputs;
    }
    const err = new HandleError(refused.map((r) => `input ${r.index}: ${r.message}`).join('; '));
    err.outputs = outputs;
    err.refusals = refused;
    throw err;
  }

  /** The next output, or `null` when drained. @returns {Output | null} */
  poll() {
    const record = this.#received((out) => this.#node.pollRaw(out));
    return record.length === 0 ? null : records.decodeOutput(record);
  }

  /** Every output waiting, in order. @returns {Output[]} */
  drain() {
    return records.decodeOutputs(this.#received((out) => this.#node.drainRaw(out)));
  }

  /**
   * What the addon answered into the shared buffer (see `records.received`).
   * @param {(out: Buffer) => number} call
   */
  #received(call) {
    return records.received((out) => guard(() => call(out)), (out) => this.#node.takeRaw(out));
  }

  /** Drains the node. @returns {IterableIterator<Output>} */
  *[Symbol.iterator]() {
    for (let o = this.poll(); o !== null; o = this.poll()) yield o;
  }

  /** The next deadline (ns), or `null`. @returns {bigint | null} */
  pollTimeout() {
    return this.#node.pollTimeout();
  }

  /** PBFT client: the request number the next accepted `submit` or `read` gets. @returns {bigint | null} */
  nextRequest() {
    return this.#node.nextRequest();
  }

  /**
   * Whether `frame` (one frame's bytes, without its length prefix) carries a valid MAC
   * from node `sender` to this node: for a host telling a peer that holds keys from a
   * stranger claiming its id.
   * @param {number} sender
   * @param {Uint8Array} frame
   * @returns {boolean}
   */
  authentic(sender, frame) {
    return guard(() => this.#node.authentic(sender, frame));
  }

  /**
   * A frame (without its length prefix) carrying nothing, with this node's MAC for node
   * `to`: what a host sends first on a connection it opens, so `to` can tell it from a
   * stranger before it has anything to say. `null` without a key for `to`.
   * @param {number} to
   * @returns {Buffer | null}
   */
  proof(to) {
    return this.#node.proof(to);
  }

  /** Gauges, counters and flags by the core's names in camelCase. @returns {Record<string, bigint | boolean>} */
  status() {
    return this.#node.status();
  }

  /** Input dropped without fault, and requests refused at a bound. @returns {Stats} */
  stats() {
    return this.#node.stats();
  }

  /** @returns {number} */
  get id() {
    return this.#node.id;
  }

  /** 'broker', 'publisher', 'subscriber' (pub/sub), 'replica' or 'client' (PBFT). @returns {string} */
  get role() {
    return this.#node.role;
  }

  /** 'pbft' or 'pubsub'. @returns {string} */
  get protocol() {
    return this.#node.protocol;
  }

  /** @returns {number} */
  get f() {
    return this.#node.f;
  }

  /** The replicas' (brokers') ids, ascending. @returns {number[]} */
  get replicaIds() {
    return this.#node.replicaIds;
  }
}

module.exports = { Node };

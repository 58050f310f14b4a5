// @ts-check
'use strict';
const { isDeepStrictEqual, inspect } = require('node:util');
const native = require('./native');
const { Node } = require('./node');
const { DivergenceError, HandleError, guard } = require('./errors');
const records = require('./records');

/**
 * @typedef {import('../native/index').TraceRecord} TraceRecord
 * @typedef {import('../native/index').ReplaySummary} ReplaySummary
 * @typedef {import('../native/index').Output} Output
 * @typedef {import('../native/index').Refusal} Refusal
 */

/** @param {unknown} v */
const show = (v) => inspect(v, { depth: 4, maxArrayLength: 8, breakLength: Infinity });

/**
 * A trace file (DESIGN §3): a node's configuration and every `{ now, input }` it
 * received, with the outputs it answered. `Trace.load(path)` or `Trace.parse(bytes)`;
 * throws `TraceError` for a malformed file.
 */
class Trace {
  #trace;
  /** @type {TraceRecord[] | undefined} */
  #records;

  /** @param {import('../native/index').Trace} trace */
  constructor(trace) {
    this.#trace = trace;
  }

  /** @param {string} path */
  static load(path) {
    return new Trace(guard(() => native.Trace.load(path)));
  }

  /** @param {Uint8Array} bytes */
  static parse(bytes) {
    return new Trace(guard(() => native.Trace.parse(bytes)));
  }

  /** The node's encoded configuration, for `new Node(trace.nodeConfig)`. @returns {Buffer} */
  get nodeConfig() {
    return this.#trace.nodeConfig;
  }

  /** @returns {string} */
  get label() {
    return this.#trace.label;
  }

  /** @returns {number} */
  get length() {
    return this.#trace.length;
  }

  /** Every record as JavaScript values (converted once). @returns {TraceRecord[]} */
  get records() {
    this.#records ??= guard(() => this.#trace.recordsRaw()).map(records.decodeTraceRecord);
    return this.#records;
  }

  /** @returns {IterableIterator<TraceRecord>} */
  [Symbol.iterator]() {
    return this.records[Symbol.iterator]();
  }

  /**
   * Replays the trace through this package's `Node` and checks every record: the
   * refusal, each output (equal field by field, in order) and the next deadline. With
   * `batch`, every input goes in with one `handleMany` call and the concatenated outputs
   * and refusals are compared. Returns the summary `phalanxd trace replay` prints (its
   * `text`), with the digest of the outputs as this API gave them; throws
   * `DivergenceError` at the first difference.
   * @param {{ batch?: boolean }} [options]
   * @returns {ReplaySummary}
   */
  replay({ batch = false } = {}) {
    const recorded = this.records;
    const node = new Node(this.nodeConfig);
    const summary = new native.SummaryDigest(recorded.length);
    if (batch) {
      /** @type {Refusal[]} */
      const refusals = [];
      const got = node.handleMany(recorded, refusals);
      const expected = recorded.flatMap((r) => r.outputs);
      const want = recorded.flatMap((r, index) => (r.error == null ? [] : [{ index, message: r.error }]));
      const seen = refusals.map(({ index, message }) => ({ index, message }));
      if (!isDeepStrictEqual(seen, want)) {
        throw new DivergenceError(`refusals: expected ${show(want)}, got ${show(seen)}`);
      }
      compareOutputs('the batch', expected, got);
      guard(() => summary.add(records.encodeOutputs(got), false));
      for (let i = 0; i < refusals.length; i++) guard(() => summary.add(records.encodeOutputs([]), true));
      return guard(() => summary.finish());
    }
    recorded.forEach((r, i) => {
      /** @type {string | null} */
      let error = null;
      try {
        node.handle(r.now, r.input);
      } catch (e) {
        if (!(e instanceof HandleError)) throw e;
        error = e.message;
      }
      if (error !== (r.error ?? null)) {
        throw new DivergenceError(`record ${i}: handle: expected ${r.error ?? 'Ok'}, got ${error ?? 'Ok'}`);
      }
      const got = node.drain();
      compareOutputs(`record ${i}`, r.outputs, got);
      const timeout = node.pollTimeout();
      if (timeout !== (r.nextTimeout ?? null)) {
        throw new DivergenceError(`record ${i}: next timeout: expected ${r.nextTimeout}, got ${timeout}`);
      }
      guard(() => summary.add(records.encodeOutputs(got), error !== null));
    });
    return guard(() => summary.finish());
  }

  /** The core's own replay in Rust (the reference). @returns {ReplaySummary} */
  replayNative() {
    return guard(() => this.#trace.replayNative());
  }

  /**
   * Seconds the core alone takes to run every input through `nodes` fresh nodes, one
   * after the other (made beforehand, untimed): the benchmark's baseline.
   */
  timeNative(nodes = 1) {
    return guard(() => this.#trace.timeNative(nodes));
  }

  /** A human-readable listing (as `phalanxd trace show`). @returns {string} */
  dump() {
    return this.#trace.dump();
  }
}

/**
 * @param {string} where
 * @param {Output[]} expected
 * @param {Output[]} got
 */
function compareOutputs(where, expected, got) {
  if (isDeepStrictEqual(expected, got)) return;
  let i = 0;
  while (i < expected.length && i < got.length && isDeepStrictEqual(expected[i], got[i])) i++;
  throw new DivergenceError(
    `${where}: output ${i}: expected ${show(expected[i] ?? null)}, got ${show(got[i] ?? null)} ` +
      `(${expected.length} recorded, ${got.length} produced)`,
  );
}

module.exports = { Trace };

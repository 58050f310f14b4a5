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
   * refusal, each output (equal field by field, in order) and the next deadline (a
   * deferred record's input goes in without a poll: its round's outputs come with the
   * round's last record). With `batch`, each round goes in with one `handleMany` call and
   * its outputs and refusals are compared. Returns the summary `phalanxd trace replay` prints (its
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
      let first = 0;
      for (const round of rounds(recorded)) {
        const last = round[round.length - 1];
        const at = `records ${first}..${first + round.length - 1}`;
        /** @type {Refusal[]} */
        const refusals = [];
        const got = node.handleMany(round, refusals);
        const want = round.flatMap((r, index) => (r.error == null ? [] : [{ index, message: r.error }]));
        const seen = refusals.map(({ index, message }) => ({ index, message }));
        if (!isDeepStrictEqual(seen, want)) {
          throw new DivergenceError(`${at}: refusals: expected ${show(want)}, got ${show(seen)}`);
        }
        for (let i = 0; i < refusals.length; i++) guard(() => summary.add(records.encodeOutputs([]), true));
        first += round.length;
        // A trace cut inside a round: its host never polled it.
        if (last.deferred) break;
        compareOutputs(at, last.outputs, got);
        if (node.pollTimeout() !== (last.nextTimeout ?? null)) {
          throw new DivergenceError(`${at}: next timeout: expected ${last.nextTimeout}, got ${node.pollTimeout()}`);
        }
        guard(() => summary.add(records.encodeOutputs(got), false));
      }
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
      if (r.deferred) {
        if (r.outputs.length > 0 || r.nextTimeout != null) {
          throw new DivergenceError(`record ${i}: a deferred record with outputs or a next timeout`);
        }
        guard(() => summary.add(records.encodeOutputs([]), error !== null));
        return;
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
 * A trace's rounds, as its host fed them: each record with the deferred ones before it
 * (the last round may end deferred, in a trace cut short).
 * @param {TraceRecord[]} recorded
 * @returns {TraceRecord[][]}
 */
function rounds(recorded) {
  /** @type {TraceRecord[][]} */
  const all = [];
  /** @type {TraceRecord[]} */
  let round = [];
  for (const r of recorded) {
    round.push(r);
    if (!r.deferred) {
      all.push(round);
      round = [];
    }
  }
  if (round.length > 0) all.push(round);
  return all;
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

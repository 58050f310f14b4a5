// @ts-check
'use strict';
/**
 * Perpetual groups (seed 002) hosted on Node.js — replicated services calling replicated
 * services — with the seed's futures API as Promises.
 *
 * A member runs its group's service, `service.run(group)`, an async function written
 * against `Group`: `group.invoke(target, op)` returns an `Invocation` whose `get()`
 * resolves to the agreed reply (or rejects with `CallAborted`); `get({ timeout })` and
 * `cancel()` only *request* an abort, as an abort policy does; `group.nextResult()`
 * takes outcomes in agreement order; serving, `group.nextRequest()` takes the next agreed
 * request and `group.sendResult(request, result)` answers it, now or later. There is no
 * `isDone`: calls complete at different times at different members.
 *
 * The program runs in lock-step with its member's agreed events, as in phalanxd: an event
 * is handed over only when the program awaits something the events so far do not
 * satisfy, so what it does is the same at every correct member, and a checkpoint is taken
 * while it waits — `service.snapshot()` with the agreed events it has not taken yet, in
 * phalanxd's bytes, so JavaScript and native members can share a group. A restore stops
 * the program (its pending `Group` call rejects with `Interrupted`), replaces its state
 * (`service.restore(state)`) and runs it again. A program must not await anything but its
 * `Group` between events (its member waits for it).
 */
const { Host } = require('./host');
const { PhalanxError } = require('./errors');

/** The group agreed to abort the call. */
class CallAborted extends PhalanxError {}

/** The program's state is being replaced (or its member stops): let it propagate out of `run`. */
class Interrupted extends Error {}

/**
 * @typedef {import('./host').Replicas} Replicas
 * @typedef {import('./host').Address} Address
 * @typedef {import('../native/index').Input} Input
 * @typedef {import('../native/index').Output} Output
 * @typedef {import('../native/index').Event} Event
 * @typedef {{ caller: number, call: bigint, op: Buffer }} Incoming a request of another group
 * @typedef {{ call: bigint, value: Buffer | null }} Result an outcome: the reply, `null` if aborted
 * @typedef {{
 *   run(group: Group): Promise<void>,
 *   snapshot(): Uint8Array,
 *   restore(state: Buffer): void,
 * }} Service
 */

/** A call made with `Group.invoke`; its outcome is taken once. */
class Invocation {
  #group;
  /** @param {Group} group @param {bigint} call */
  constructor(group, call) {
    this.#group = group;
    this.call = call;
  }

  /**
   * The reply; rejects with `CallAborted` if the group agreed to abort. With `timeout`
   * (ms), an abort is requested after it — the outcome may still be the reply.
   * @param {{ timeout?: number }} [options]
   * @returns {Promise<Buffer>}
   */
  get(options) {
    return this.#group.outcome(this.call, options?.timeout ?? null);
  }

  /** Requests an abort; `get` says what the group agreed. */
  cancel() {
    this.#group.ask({ type: 'abort', call: this.call });
  }
}

/** The program's side of its member: the seed's API. */
class Group {
  // Agreed, and in checkpoints.
  nextCall = 1n;
  /** @type {Map<bigint, number>} */
  undecidedCalls = new Map();
  /** @type {Incoming[]} */
  requests = [];
  /** @type {Result[]} */
  decided = [];
  // Local.
  #window;
  #ask;
  delivered = 0;
  considered = 0;
  waiting = false;
  interrupted = false;
  /** @type {(() => void)[]} */
  #wakeups = [];
  /** Resolves the member's wait for the program to settle. @type {() => void} */
  settledNow = () => {};
  /** @type {number | null} */
  #policy = null;
  /** @type {Map<number, number | null>} */
  #targetPolicy = new Map();
  /** @type {Map<bigint, NodeJS.Timeout>} */
  #abortTimers = new Map();

  /** @param {number} window @param {(input: Input) => void} ask */
  constructor(window, ask) {
    this.#window = Math.max(1, window);
    this.#ask = ask;
  }

  /**
   * Calls group `target` with `op`, under `abortAfter` ms (default: the policy for
   * `target`, else the group's). Throws `PhalanxError` while the call window is full.
   * @param {number} target @param {Uint8Array} op @param {{ abortAfter?: number | null }} [options]
   */
  invoke(target, op, options) {
    let oldest = this.nextCall;
    for (const c of this.undecidedCalls.keys()) if (c < oldest) oldest = c;
    if (this.nextCall - oldest >= BigInt(this.#window)) {
      throw new PhalanxError(`the call window (${this.#window}) is full: take outcomes first`);
    }
    const call = this.nextCall++;
    this.undecidedCalls.set(call, target);
    const after = options && 'abortAfter' in options ? options.abortAfter : this.#targetPolicy.get(target) ?? this.#policy;
    if (after !== null && after !== undefined) {
      this.#abortTimers.set(call, setTimeout(() => this.ask({ type: 'abort', call }), after));
    }
    this.ask({ type: 'call', target, op });
    return new Invocation(this, call);
  }

  /** @param {number} target @param {Uint8Array} op */
  invokeAndWait(target, op) {
    return this.invoke(target, op).get();
  }

  /** The next outcome in agreement order, of any call not taken yet. @returns {Promise<Result>} */
  nextResult() {
    return this.wait(() => this.decided.shift() ?? null);
  }

  /** A call made before this program's state was restored (see `undecided`). @param {bigint} call */
  invocation(call) {
    return new Invocation(this, call);
  }

  /** The calls without an outcome yet, and their targets. */
  get undecided() {
    return new Map(this.undecidedCalls);
  }

  /**
   * Request an abort of a call that has no outcome `ms` after it was made (`null`: never);
   * for calls to `target`, or by default.
   * @param {number | null} ms @param {number} [target]
   */
  setAbortPolicy(ms, target) {
    if (target === undefined) this.#policy = ms;
    else this.#targetPolicy.set(target, ms);
  }

  /** @returns {Promise<Incoming>} */
  nextRequest() {
    return this.wait(() => this.requests.shift() ?? null);
  }

  /** @param {Incoming} request @param {Uint8Array} result */
  sendResult(request, result) {
    this.ask({ type: 'respond', caller: request.caller, call: request.call, result });
  }

  /** @param {Input} input */
  ask(input) {
    this.#ask(input);
  }

  /**
   * Resolves with what `ready` gives once it gives something, waiting in lock-step.
   * @template T
   * @param {() => T | null} ready
   * @param {number | null} [timeout] ms; then rejects with `'timeout'`
   * @returns {Promise<T>}
   */
  async wait(ready, timeout = null) {
    const end = timeout === null ? null : Date.now() + timeout;
    for (;;) {
      if (this.interrupted) throw new Interrupted('the program is interrupted');
      const got = ready();
      if (got !== null) return got;
      this.waiting = true;
      this.considered = this.delivered;
      this.settledNow();
      /** @type {NodeJS.Timeout | null} */
      let timer = null;
      const timedOut = await new Promise((resolve) => {
        this.#wakeups.push(() => resolve(false));
        if (end !== null) timer = setTimeout(() => resolve(true), Math.max(0, end - Date.now()));
      });
      if (timer) clearTimeout(timer);
      this.waiting = false;
      if (timedOut) throw new Error('timeout');
    }
  }

  /** @param {bigint} call @param {number | null} timeout @returns {Promise<Buffer>} */
  async outcome(call, timeout) {
    const take = () => {
      const i = this.decided.findIndex((r) => r.call === call);
      if (i >= 0) return { value: this.decided.splice(i, 1)[0].value };
      // Never made, or taken before: nothing will come.
      return this.undecidedCalls.has(call) ? null : { value: null };
    };
    let got;
    try {
      got = await this.wait(take, timeout);
    } catch (e) {
      if (e instanceof Interrupted) throw e;
      this.ask({ type: 'abort', call });
      got = await this.wait(take);
    }
    if (got.value === null) throw new CallAborted(`call ${call} was aborted`);
    return got.value;
  }

  wake() {
    for (const w of this.#wakeups.splice(0)) w();
  }

  /** The member hands over one agreed event. @param {Event} event */
  deliver(event) {
    if (event.type === 'request') {
      this.requests.push({ caller: event.caller, call: event.call, op: event.op });
    } else if (event.type === 'reply' || event.type === 'aborted') {
      if (this.undecidedCalls.delete(event.call)) {
        const timer = this.#abortTimers.get(event.call);
        if (timer) clearTimeout(timer);
        this.#abortTimers.delete(event.call);
        this.decided.push({ call: event.call, value: event.type === 'reply' ? event.result : null });
      }
    }
    this.delivered++;
    this.wake();
  }

  /** A checkpoint's executor state, in phalanxd's bytes. @param {Uint8Array} service */
  encode(service) {
    /** @type {Buffer[]} */
    const parts = [];
    const u32 = (/** @type {number} */ v) => {
      const b = Buffer.alloc(4);
      b.writeUInt32LE(v);
      parts.push(b);
    };
    const u64 = (/** @type {bigint} */ v) => {
      const b = Buffer.alloc(8);
      b.writeBigUInt64LE(v);
      parts.push(b);
    };
    const blob = (/** @type {Uint8Array} */ v) => {
      u32(v.length);
      parts.push(Buffer.from(v));
    };
    u64(this.nextCall);
    u32(this.undecidedCalls.size);
    for (const [call, target] of [...this.undecidedCalls].sort((a, b) => (a[0] < b[0] ? -1 : 1))) {
      u64(call);
      u32(target);
    }
    u32(this.requests.length);
    for (const r of this.requests) {
      u32(r.caller);
      u64(r.call);
      blob(r.op);
    }
    u32(this.decided.length);
    for (const d of this.decided) {
      u64(d.call);
      parts.push(Buffer.from([d.value === null ? 0 : 1]));
      if (d.value !== null) blob(d.value);
    }
    parts.push(Buffer.from(service));
    return Buffer.concat(parts);
  }

  /** Takes the agreed part of `state`; returns the service's. Throws on bytes that are not that. @param {Buffer} state */
  decode(state) {
    let at = 0;
    const need = (/** @type {number} */ n) => {
      if (at + n > state.length) throw new PhalanxError('a truncated executor state');
      at += n;
      return at - n;
    };
    const u32 = () => state.readUInt32LE(need(4));
    const u64 = () => state.readBigUInt64LE(need(8));
    const blob = () => {
      const n = u32();
      const from = need(n);
      return Buffer.from(state.subarray(from, from + n));
    };
    const nextCall = u64();
    /** @type {Map<bigint, number>} */
    const undecided = new Map();
    for (let n = u32(); n > 0; n--) {
      const call = u64();
      undecided.set(call, u32());
    }
    /** @type {Incoming[]} */
    const requests = [];
    for (let n = u32(); n > 0; n--) {
      const caller = u32();
      const call = u64();
      requests.push({ caller, call, op: blob() });
    }
    /** @type {Result[]} */
    const decided = [];
    for (let n = u32(); n > 0; n--) {
      const call = u64();
      const kind = state[need(1)];
      if (kind > 1) throw new PhalanxError(`outcome kind ${kind}`);
      decided.push({ call, value: kind === 1 ? blob() : null });
    }
    this.nextCall = nextCall;
    this.undecidedCalls = undecided;
    this.requests = requests;
    this.decided = decided;
    for (const t of this.#abortTimers.values()) clearTimeout(t);
    this.#abortTimers.clear();
    return state.subarray(at);
  }
}

/**
 * A member of a Perpetual group, hosted on Node.js, running `service` (`run(group)`,
 * `snapshot()`, `restore(state)`; see the module doc). It listens on its own address in
 * `members` (every member of every group) and dials the others; `storage` as for
 * `Replica`.
 */
class Member {
  #host;
  /** @type {Event[]} */
  #events = [];
  /** @type {Input[]} */
  #asked = [];
  /** @type {Promise<void> | null} */
  #program = null;
  #programDone = true;
  /** @type {Promise<void> | null} */
  #pump = null;
  #more = () => {};
  #stopped = false;

  /**
   * @param {Uint8Array} config this member's encoded configuration
   * @param {Replicas} members every member's address (its own included)
   * @param {Service} service
   * @param {{ storage?: string | null, listen?: Address | null }} [options]
   */
  constructor(config, members, service, options = {}) {
    this.service = service;
    this.#host = new Host(config, members, {
      storage: options.storage ?? null,
      listen: options.listen ?? true,
      onOutput: (o) => {
        if (o.type === 'event') {
          this.#events.push(o.event);
          this.#more();
        }
      },
    });
    if (this.#host.native.protocol !== 'perpetual') {
      throw new PhalanxError(`node ${this.#host.id} is a ${this.#host.native.protocol} ${this.#host.native.role}, not a Perpetual member`);
    }
    this.group = new Group(this.#host.native.callWindow, (input) => {
      this.#asked.push(input);
      this.#more();
    });
  }

  get id() {
    return this.#host.id;
  }

  /** The core's status (view, executed and stable batches, …). */
  status() {
    return this.#host.native.status();
  }

  async start() {
    // The program starts afresh; a checkpoint the member recovers replaces its state.
    this.#runProgram();
    await this.#settled();
    await this.#host.start();
    this.#pump = this.#serve();
  }

  async stop() {
    this.#stopped = true;
    this.#more();
    await this.#stopProgram();
    if (this.#pump) await this.#pump;
    await this.#host.close();
  }

  #runProgram() {
    this.group.interrupted = false;
    this.#programDone = false;
    this.#program = (async () => {
      try {
        await this.service.run(this.group);
      } catch (e) {
        if (!(e instanceof Interrupted)) console.error(`member ${this.id}: the service's program failed`, e);
      } finally {
        this.#programDone = true;
        this.group.settledNow();
      }
    })();
  }

  async #stopProgram() {
    if (this.#program) {
      this.group.interrupted = true;
      this.group.wake();
      await this.#program;
      this.#program = null;
    }
  }

  #isSettled() {
    const g = this.group;
    return this.#programDone || (g.waiting && g.considered === g.delivered);
  }

  async #settled() {
    while (!this.#isSettled()) {
      await new Promise((resolve) => (this.group.settledNow = () => resolve(undefined)));
    }
  }

  /** Hands the agreed events over one at a time, and what the program asked back. */
  async #serve() {
    while (!this.#stopped) {
      if (this.#events.length === 0 && this.#asked.length === 0) {
        await new Promise((resolve) => (this.#more = () => resolve(undefined)));
        continue;
      }
      const event = this.#events.shift();
      if (event) await this.#deliver(event);
      for (const input of this.#asked.splice(0)) this.#host.feed(input).catch(() => {});
    }
  }

  /** @param {Event} event */
  async #deliver(event) {
    if (event.type === 'checkpoint') {
      this.#asked.push({ type: 'snapshot', seq: event.seq, state: this.group.encode(this.service.snapshot()) });
    } else if (event.type === 'restore') {
      await this.#stopProgram();
      try {
        this.service.restore(this.group.decode(event.state));
      } catch (e) {
        console.error(`member ${this.id}: the state certified at checkpoint ${event.seq} was not restored`, e);
      }
      this.#asked.length = 0;
      this.#runProgram();
      await this.#settled();
    } else {
      this.group.deliver(event);
      await this.#settled();
    }
  }
}

module.exports = { Member, Group, Invocation, CallAborted, Interrupted };

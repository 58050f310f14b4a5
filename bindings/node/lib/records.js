// @ts-check
'use strict';
/**
 * The Node boundary's one conversion. The addon and JavaScript exchange the core's
 * inputs and outputs as the boundary messages of `core/proto/phalanx.proto` (the trace
 * format's `InputRecord` and `OutputRecord`, in an `InputBatch` or a `RoundRecord`), one
 * buffer per call; this module turns them into the plain objects of the API and back.
 * Crossing as one buffer is what keeps a call cheap: building objects property by
 * property through Node-API cost more than the core's own work on most inputs.
 *
 * Each message is described once, as a table of its fields (number, name in the API,
 * kind); the reader and the writer follow the tables. Bytes come out as `Buffer` views
 * of the call's buffer (one per call, never reused), 64-bit numbers as `bigint`.
 */

/** @typedef {import('../native/index').Input} Input */
/** @typedef {import('../native/index').Output} Output */
/** @typedef {import('../native/index').TimedInput} TimedInput */
/** @typedef {import('../native/index').TraceRecord} TraceRecord */

const ALGORITHMS = ['ab', 'bracha', 'chain'];
const MAX_U64 = 2n ** 64n - 1n;

/**
 * A field: its number, its name in the API and its kind. Kinds: 'u32', 'u64', 'bool',
 * 'bytes', 'string', 'algorithm' (an enum), 'bytes?' (optional: null when absent),
 * 'u64?' (optional), 'bytes*' and 'u64*' (repeated), 'ids' and 'msgs' (distillation's
 * packed ids and messages), or a message table (nested) and [table] (repeated).
 * @typedef {[number, string, Kind]} Field
 * @typedef {string | Field[] | [Field[]]} Kind
 */

/** @type {Field[]} */
const OPERATION = [[1, 'client', 'u32'], [2, 'request', 'u64'], [3, 'op', 'bytes']];

/**
 * A oneof: each variant's field number, its `type` in the API and its fields. A variant
 * whose fields are a kind (not a table) is a scalar field holding the API's only field.
 * @typedef {[number, string, Field[] | [string, string]][]} Variants
 */

/** `RequestInput`'s kinds, which the API lists beside the other inputs. @type {Variants} */
const REQUESTS = [
  [1, 'publish', [[1, 'topic', 'u64'], [2, 'payload', 'bytes'], [3, 'algorithm', 'algorithm']]],
  [2, 'subscribe', [[1, 'topics', 'u64*']]],
  [3, 'submit', [[1, 'op', 'bytes']]],
  [4, 'read', [[1, 'op', 'bytes']]],
  [5, 'call', [[1, 'target', 'u32'], [2, 'op', 'bytes']]],
  [6, 'respond', [[1, 'caller', 'u32'], [2, 'call', 'u64'], [3, 'result', 'bytes']]],
  [7, 'abort', [[1, 'call', 'u64']]],
  [8, 'snapshot', [[1, 'seq', 'u64'], [2, 'state', 'bytes']]],
];

/** `InputRecord` (field 2, `RequestInput`, holds the requests above). @type {Variants} */
const INPUTS = [
  [1, 'message', [[1, 'from', 'u32'], [2, 'bytes', 'bytes']]],
  [3, 'timeout', []],
  [4, 'persisted', [[1, 'token', 'u64']]],
  [5, 'executed', [[1, 'seq', 'u64'], [2, 'results', 'bytes*'], [3, 'snapshot', 'bytes?']]],
  [6, 'recover', [[1, 'record', 'bytes']]],
  [7, 'answered', [[1, 'client', 'u32'], [2, 'request', 'u64'], [3, 'result', 'bytes']]],
];
const REQUEST_FIELD = 2;

/** `EventOutput`. @type {Variants} */
const EVENTS = [
  [1, 'request', [[1, 'caller', 'u32'], [2, 'call', 'u64'], [3, 'op', 'bytes']]],
  [2, 'reply', [[1, 'call', 'u64'], [2, 'result', 'bytes']]],
  [3, 'aborted', ['call', 'u64']],
  [4, 'checkpoint', ['seq', 'u64']],
  [5, 'restore', [[1, 'seq', 'u64'], [2, 'state', 'bytes']]],
];

/** `OutputRecord` (field 11, `EventOutput`, holds an event). @type {Variants} */
const OUTPUTS = [
  [1, 'send', [[1, 'to', 'u32'], [2, 'bytes', 'bytes']]],
  [2, 'deliver', [[1, 'publisher', 'u32'], [2, 'topic', 'u64'], [3, 'seq', 'u64'], [4, 'payload', 'bytes'],
    [5, 'algorithm', 'algorithm'], [6, 'fromHistory', 'bool']]],
  [3, 'persist', [[1, 'token', 'u64'], [2, 'record', 'bytes']]],
  [4, 'fault', [[1, 'node', 'u32'], [2, 'kind', 'string']]],
  [5, 'execute', [[1, 'seq', 'u64'], [2, 'ops', [OPERATION]], [3, 'snapshot', 'bool']]],
  [6, 'completed', [[1, 'request', 'u64'], [2, 'result', 'bytes']]],
  [7, 'restore', [[1, 'seq', 'u64'], [2, 'snapshot', 'bytes']]],
  [8, 'compact', [[1, 'token', 'u64']]],
  [9, 'query', [[1, 'client', 'u32'], [2, 'request', 'u64'], [3, 'op', 'bytes']]],
  [10, 'delivered', [[1, 'height', 'u64'], [2, 'ids', 'ids'], [3, 'seqs', 'u64*'], [4, 'msgs', 'msgs']]],
];
const EVENT_FIELD = 11;

/** @param {Variants} variants */
const byType = (variants) => new Map(variants.map((v) => [v[1], v]));
/** @param {Variants} variants */
const byNumber = (variants) => {
  /** @type {(Variants[number] | undefined)[]} */
  const table = [];
  for (const v of variants) table[v[0]] = v;
  return table;
};
const INPUT_TYPES = byType(INPUTS);
const REQUEST_TYPES = byType(REQUESTS);
const EVENT_TYPES = byType(EVENTS);
const OUTPUT_TYPES = byType(OUTPUTS);
const INPUT_NUMBERS = byNumber(INPUTS);
const REQUEST_NUMBERS = byNumber(REQUESTS);
const EVENT_NUMBERS = byNumber(EVENTS);
const OUTPUT_NUMBERS = byNumber(OUTPUTS);

// ------------------------------------------------------------------------ reading

class Malformed extends Error {}

/**
 * Reads protobuf from a `Buffer`. A message is read up to its end (`nested` gives a
 * nested message's); every read stays within the buffer.
 */
class Reader {
  /** @param {Buffer} buf */
  constructor(buf) {
    this.buf = buf;
    this.pos = 0;
  }

  /** A varint of at most 53 bits, as a number. */
  uint() {
    const buf = this.buf;
    let n = 0;
    let mul = 1;
    for (let i = 0; i < 8 && this.pos < buf.length; i++) {
      const b = buf[this.pos++];
      n += (b & 0x7f) * mul;
      if (b < 0x80) return n;
      mul *= 128;
    }
    throw new Malformed('a varint too long or cut short');
  }

  /** A varint of up to 64 bits, as a bigint. */
  u64() {
    const buf = this.buf;
    let n = 0;
    let mul = 1;
    for (let i = 0; i < 7 && this.pos < buf.length; i++) {
      const b = buf[this.pos++];
      n += (b & 0x7f) * mul;
      if (b < 0x80) return BigInt(n);
      mul *= 128;
    }
    let big = BigInt(n);
    for (let shift = 49n; shift < 70n && this.pos < buf.length; shift += 7n) {
      const b = buf[this.pos++];
      big |= BigInt(b & 0x7f) << shift;
      if (b < 0x80) return BigInt.asUintN(64, big);
    }
    throw new Malformed('a varint too long or cut short');
  }

  /** Where the length-delimited field here ends (its bytes start at `pos`). */
  nested() {
    const len = this.uint();
    const end = this.pos + len;
    if (end > this.buf.length) throw new Malformed('a field longer than its message');
    return end;
  }

  bytes() {
    const end = this.nested();
    const start = this.pos;
    this.pos = end;
    return this.buf.subarray(start, end);
  }

  string() {
    const end = this.nested();
    const start = this.pos;
    this.pos = end;
    return this.buf.toString('utf8', start, end);
  }

  algorithm() {
    const a = ALGORITHMS[this.uint() - 1];
    if (a === undefined) throw new Malformed('an unknown algorithm');
    return a;
  }

  /**
   * A repeated varint field's next values onto `list`: one, or a packed run.
   * @param {number} wire
   * @param {bigint[]} list
   */
  u64s(wire, list) {
    if (wire !== 2) {
      list.push(this.u64());
      return list;
    }
    for (const end = this.nested(); this.pos < end;) list.push(this.u64());
    return list;
  }

  /** @param {number} wire */
  skip(wire) {
    if (wire === 0) this.u64();
    else if (wire === 1) this.pos += 8;
    else if (wire === 2) this.pos = this.nested();
    else if (wire === 5) this.pos += 4;
    else throw new Malformed(`wire type ${wire}`);
    if (this.pos > this.buf.length) throw new Malformed('a field cut short');
  }

  /**
   * After a message read up to `end`: a field that ran past it is malformed.
   * @param {number} end
   */
  ended(end) {
    if (this.pos !== end) throw new Malformed('a field longer than its message');
  }
}

const EMPTY = Buffer.alloc(0);

/**
 * The code of a kind's value when its field is absent, and of reading it (`o` is the
 * object being read, `key` the field's name as a literal, `h` the helpers).
 * @type {Record<string, [string, (key: string) => string]>}
 */
const KINDS = {
  u32: ['0', () => 'r.uint()'],
  u64: ['0n', () => 'r.u64()'],
  'u64?': ['null', () => 'r.u64()'],
  bool: ['false', () => 'r.uint() !== 0'],
  bytes: ['h.EMPTY', () => 'r.bytes()'],
  'bytes?': ['null', () => 'r.bytes()'],
  string: ["''", () => 'r.string()'],
  algorithm: ['null', () => 'r.algorithm()'],
  'bytes*': ['[]', (key) => `(o[${key}].push(r.bytes()), o[${key}])`],
  'u64*': ['[]', (key) => `r.u64s(tag & 7, o[${key}])`],
  ids: ['null', () => 'h.packedIds(r, r.nested())'],
  msgs: ['null', () => 'h.messages(r, r.nested())'],
};

/**
 * A reader of one message by its table, compiled once into a function (an object
 * literal with every field, then a switch on the field numbers): objects of one shape
 * and accesses by constant names, which V8 keeps fast, where a loop over the table is
 * several times slower. Unknown fields are skipped.
 * @param {Field[]} fields
 * @param {string} [type] the `type` the object gets first
 * @returns {(r: Reader, end: number) => any}
 */
function compileReader(fields, type) {
  /** @type {Record<string, unknown>} */
  const h = {
    EMPTY,
    packedIds: (/** @type {Reader} */ r, /** @type {number} */ end) => readPackedIds(r, end),
    messages: (/** @type {Reader} */ r, /** @type {number} */ end) => readMessages(r, end),
  };
  const init = type === undefined ? [] : [`type: ${JSON.stringify(type)}`];
  const cases = [];
  for (const [number, name, kind] of fields) {
    const key = JSON.stringify(name);
    if (typeof kind === 'string') {
      const [empty, read] = KINDS[kind];
      init.push(`${key}: ${empty}`);
      cases.push(`case ${number}: o[${key}] = ${read(key)}; break;`);
    } else if (Array.isArray(kind[0])) {
      h[name] = compileReader(/** @type {Field[]} */ (kind[0]));
      init.push(`${key}: []`);
      cases.push(`case ${number}: o[${key}].push(h[${key}](r, r.nested())); break;`);
    } else {
      h[name] = compileReader(/** @type {Field[]} */ (kind));
      init.push(`${key}: null`);
      cases.push(`case ${number}: o[${key}] = h[${key}](r, r.nested()); break;`);
    }
  }
  const body = `
    const o = { ${init.join(', ')} };
    while (r.pos < end) {
      const tag = r.uint();
      switch (tag >>> 3) { ${cases.join(' ')} default: r.skip(tag & 7); }
    }
    r.ended(end);
    return o;`;
  return new Function('h', `return function read(r, end) { ${body} };`)(h);
}

/**
 * A reader of a oneof (`InputRecord`, `OutputRecord`, `EventOutput`, `RequestInput`):
 * an object whose `type` is its variant. `nested` reads the oneofs held one level down
 * (a field number, and what to make of its message).
 * @param {Variants} variants
 * @param {string} what
 * @param {[number, (r: Reader, end: number) => any][]} [nested]
 * @returns {(r: Reader, end: number) => any}
 */
function compileVariants(variants, what, nested = []) {
  /** @type {Record<string, unknown>} */
  const h = { Malformed };
  const cases = [];
  for (const [number, type, fields] of variants) {
    if (typeof fields[0] === 'string') {
      const [name, kind] = /** @type {[string, string]} */ (fields);
      cases.push(`case ${number}: o = { type: ${JSON.stringify(type)}, ${JSON.stringify(name)}: ${KINDS[kind][1]('')} }; break;`);
    } else {
      h[type] = compileReader(/** @type {Field[]} */ (fields), type);
      cases.push(`case ${number}: o = h[${JSON.stringify(type)}](r, r.nested()); break;`);
    }
  }
  for (const [number, read] of nested) {
    h[`nested${number}`] = read;
    cases.push(`case ${number}: o = h.nested${number}(r, r.nested()); break;`);
  }
  const body = `
    let o;
    while (r.pos < end) {
      const tag = r.uint();
      switch (tag >>> 3) { ${cases.join(' ')} default: r.skip(tag & 7); }
    }
    r.ended(end);
    if (o === undefined) throw new h.Malformed(${JSON.stringify(`${what} of no known kind`)});
    return o;`;
  return new Function('h', `return function read(r, end) { ${body} };`)(h);
}

const readRequest = compileVariants(REQUESTS, 'a request');
const readEvent = compileVariants(EVENTS, 'an event');
/** @type {(r: Reader, end: number) => Input} */
const readInput = compileVariants(INPUTS, 'an input', [[REQUEST_FIELD, readRequest]]);
const readOutputRecord = compileVariants(OUTPUTS, 'an output', [
  [EVENT_FIELD, (r, end) => ({ type: 'event', event: readEvent(r, end) })],
]);

/** @param {Reader} r @param {number} end @returns {Output} */
function readOutput(r, end) {
  const o = readOutputRecord(r, end);
  if (o.type === 'delivered') {
    o.ids ??= [];
    o.msgs = splitMessages(o.msgs ?? { sharedLen: 0n, lens: [], bytes: EMPTY }, o.ids.length);
  }
  return o;
}

/** @type {Field[]} */
const PACKED_IDS = [[1, 'bits', 'u32'], [2, 'count', 'u32'], [3, 'packed', 'bytes']];
/** @type {Field[]} */
const MESSAGES = [[1, 'sharedLen', 'u64?'], [2, 'lens', 'u64*'], [3, 'bytes', 'bytes']];
const readPackedIds = (/** @type {Reader} */ r, /** @type {number} */ end) => unpackIds(compiledPackedIds(r, end));
const readMessages = (/** @type {Reader} */ r, /** @type {number} */ end) => compiledMessages(r, end);
const compiledPackedIds = compileReader(PACKED_IDS);
const compiledMessages = compileReader(MESSAGES);

/**
 * Distillation's ids, packed `bits` wide, least significant bit first.
 * @param {{ bits: number, count: number, packed: Buffer }} p
 * @returns {bigint[]}
 */
function unpackIds({ bits, count, packed }) {
  if (bits < 1 || bits > 64 || packed.length !== Math.ceil((count * bits) / 8)) throw new Malformed('packed ids');
  const ids = new Array(count);
  const width = BigInt(bits);
  const mask = (1n << width) - 1n;
  let acc = 0n;
  let filled = 0n;
  let at = 0;
  for (let i = 0; i < count; i++) {
    for (; filled < width; filled += 8n) acc |= BigInt(packed[at++]) << filled;
    ids[i] = acc & mask;
    acc >>= width;
    filled -= width;
  }
  return ids;
}

/**
 * Distillation's messages, `count` of them in one buffer.
 * @param {{ sharedLen: bigint | null, lens: bigint[], bytes: Buffer }} m
 * @param {number} count
 * @returns {Buffer[]}
 */
function splitMessages({ sharedLen, lens, bytes }, count) {
  const shared = sharedLen === null ? null : Number(sharedLen);
  if (shared === null ? lens.length !== count : lens.length !== 0 || bytes.length !== count * shared) {
    throw new Malformed('messages and ids of different numbers');
  }
  const out = new Array(count);
  let at = 0;
  for (let i = 0; i < count; i++) {
    const len = shared ?? Number(lens[i]);
    if (at + len > bytes.length) throw new Malformed('message lengths beyond their bytes');
    out[i] = bytes.subarray(at, at + len);
    at += len;
  }
  if (at !== bytes.length) throw new Malformed('message lengths short of their bytes');
  return out;
}

/**
 * A `RoundRecord`'s outputs.
 * @param {Buffer} buf
 * @returns {Output[]}
 */
function decodeOutputs(buf) {
  const r = new Reader(buf);
  /** @type {Output[]} */
  const outputs = [];
  while (r.pos < buf.length) {
    const tag = r.uint();
    if (tag === ROUND_OUTPUTS) outputs.push(readOutput(r, r.nested()));
    else r.skip(tag & 7);
  }
  return outputs;
}
const ROUND_OUTPUTS = (2 << 3) | 2;

/** One `OutputRecord`. @param {Buffer} buf @returns {Output} */
const decodeOutput = (buf) => readOutput(new Reader(buf), buf.length);

/** One `InputRecord`. @param {Buffer} buf @returns {Input} */
const decodeInput = (buf) => readInput(new Reader(buf), buf.length);

/**
 * A `TraceRecord`: the input, its outputs, and the next deadline, the refusal and
 * `deferred` when there are (absent otherwise).
 * @param {Buffer} buf
 * @returns {TraceRecord}
 */
function decodeTraceRecord(buf) {
  const r = new Reader(buf);
  /** @type {any} */
  const record = { now: 0n, input: undefined, outputs: [] };
  while (r.pos < buf.length) {
    const tag = r.uint();
    switch (tag >>> 3) {
      case 1: record.now = r.u64(); break;
      case 2: record.input = readInput(r, r.nested()); break;
      case 3: record.outputs.push(readOutput(r, r.nested())); break;
      case 4: record.nextTimeout = r.u64(); break;
      case 5: {
        const error = r.bytes().toString('utf8');
        if (error !== '') record.error = error;
        break;
      }
      case 6: if (r.uint() !== 0) record.deferred = true; break;
      default: r.skip(tag & 7);
    }
  }
  if (record.input === undefined) throw new Malformed('a trace record without its input');
  return record;
}

const readExecute = compileReader(/** @type {Field[]} */ (OUTPUT_TYPES.get('execute')?.[2]));
/** The fields of an `execute` output (what a replica's application executes). @param {Buffer} buf */
const decodeExecute = (buf) => readExecute(new Reader(buf), buf.length);

// ------------------------------------------------------------------------ writing

/** Writes protobuf into a buffer that grows. */
class Writer {
  constructor(size = 64 << 10) {
    this.buf = Buffer.allocUnsafe(size);
    this.pos = 0;
  }

  /** Starts over (the buffer is reused: what `done` gave before is overwritten). */
  reset() {
    this.pos = 0;
    return this;
  }

  /** @param {number} n */
  room(n) {
    if (this.pos + n <= this.buf.length) return;
    const grown = Buffer.allocUnsafe(Math.max(2 * this.buf.length, this.pos + n));
    this.buf.copy(grown, 0, 0, this.pos);
    this.buf = grown;
  }

  /** A varint of a number of at most 53 bits. @param {number} n */
  uint(n) {
    this.room(8);
    while (n >= 0x80) {
      this.buf[this.pos++] = (n % 0x80) | 0x80;
      n = Math.floor(n / 0x80);
    }
    this.buf[this.pos++] = n;
  }

  /** A varint of a number of at most 53 bits or a bigint below 2^64. @param {number | bigint} n */
  varint(n) {
    if (typeof n === 'number') return this.uint(n);
    this.room(10);
    while (n >= 0x80n) {
      this.buf[this.pos++] = Number(n & 0x7fn) | 0x80;
      n >>= 7n;
    }
    this.buf[this.pos++] = Number(n);
  }

  /** A length-delimited field's bytes, after its tag. @param {Uint8Array} bytes */
  bytes(bytes) {
    this.uint(bytes.length);
    this.room(bytes.length);
    this.buf.set(bytes, this.pos);
    this.pos += bytes.length;
  }

  /**
   * Starts a nested message after its tag, with two bytes kept for its length: `end`
   * writes it there as a two-byte varint (non-minimal below 128, which decoders read
   * alike) and moves the message only when it is longer than 16,383 bytes.
   * @returns {number}
   */
  begin() {
    this.room(2);
    return (this.pos += 2);
  }

  /** @param {number} at what `begin` returned */
  end(at) {
    const len = this.pos - at;
    if (len < 0x4000) {
      this.buf[at - 2] = (len & 0x7f) | 0x80;
      this.buf[at - 1] = len >>> 7;
      return;
    }
    let lenBytes = 1;
    for (let n = len; n >= 0x80; n = Math.floor(n / 0x80)) lenBytes++;
    this.room(lenBytes - 2);
    this.buf.copyWithin(at - 2 + lenBytes, at, this.pos);
    this.pos = at - 2;
    this.uint(len);
    this.pos += len;
  }

  done() {
    return this.buf.subarray(0, this.pos);
  }
}

/**
 * A `TypeError` naming what was wrong, as the addon's argument errors are.
 * @param {string} message
 */
function typeError(message) {
  return Object.assign(new TypeError(message), { code: 'ERR_INVALID_ARG_TYPE' });
}

/**
 * A 64-bit value from a bigint or a non-negative safe integer: a number when it is
 * below 2^53 (cheaper to write), else the bigint.
 * @param {unknown} v
 * @param {string} what
 * @returns {number | bigint}
 */
function toU64(v, what) {
  if (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0) return v;
  if (typeof v === 'bigint') {
    if (v >= 0n && v <= MAX_U64) return v <= 0x1fffffffffffffn ? Number(v) : v;
    throw typeError(`${what}: expected a bigint in 0..2n**64n`);
  }
  throw typeError(`${what}: expected a bigint or a non-negative safe integer, got ${typeof v === 'number' ? v : typeof v}`);
}

/**
 * The helpers the compiled writers call.
 * @type {Record<string, any>}
 */
const W = {
  /** @param {string} what @param {string} name @param {string} expected */
  wrong: (what, name, expected) => typeError(`${what}: field \`${name}\`: expected ${expected}`),
  toU64,
  /** @param {unknown} v @param {string} what */
  object(v, what) {
    if (typeof v !== 'object' || v === null) throw typeError(`${what}: expected an object`);
    return /** @type {Record<string, any>} */ (v);
  },
  /** @param {unknown} v */
  isU32: (v) => typeof v === 'number' && Number.isInteger(v) && v >= 0 && v <= 0xffffffff,
  /** @param {unknown} v */
  algorithm: (v) => ALGORITHMS.indexOf(/** @type {string} */ (v)) + 1,
  /** @param {unknown} v @param {string} what */
  byteList(v, what) {
    if (!Array.isArray(v) || !v.every((b) => b instanceof Uint8Array)) throw W.wrong(what, 'the field', 'an array of Uint8Array');
    return v;
  },
  packIds,
  collectMessages,
  utf8: (/** @type {string} */ v) => Buffer.from(v, 'utf8'),
};

/**
 * The code that writes a kind's value `v` of field `number` (`k` is its name as a
 * literal, `name` as text for errors), checking it first.
 * @param {number} number
 * @param {string} k
 * @param {string} name
 * @param {string} kind
 */
function writeCode(number, k, name, kind) {
  const varint = number * 8;
  const delimited = number * 8 + 2;
  const wrong = (/** @type {string} */ expected) => `throw h.wrong(what, ${JSON.stringify(name)}, ${JSON.stringify(expected)});`;
  switch (kind) {
    case 'u32':
      return `if (!h.isU32(v)) ${wrong('an integer in 0..2**32')} if (v !== 0) { w.uint(${varint}); w.uint(v); }`;
    case 'u64':
      return `{ const n = h.toU64(v, what + ': field \`' + ${k} + '\`'); if (n !== 0) { w.uint(${varint}); w.varint(n); } }`;
    case 'u64?':
      return `if (v != null) { w.uint(${varint}); w.varint(h.toU64(v, what + ': field \`' + ${k} + '\`')); }`;
    case 'bool':
      return `if (typeof v !== 'boolean') ${wrong('a boolean')} if (v) { w.uint(${varint}); w.uint(1); }`;
    case 'bytes':
      return `if (!(v instanceof Uint8Array)) ${wrong('a Uint8Array or Buffer')} if (v.length !== 0) { w.uint(${delimited}); w.bytes(v); }`;
    case 'bytes?':
      return `if (v != null) { if (!(v instanceof Uint8Array)) ${wrong('a Uint8Array, a Buffer or null')} w.uint(${delimited}); w.bytes(v); }`;
    case 'string':
      return `if (typeof v !== 'string') ${wrong('a string')} if (v !== '') { w.uint(${delimited}); w.bytes(h.utf8(v)); }`;
    case 'algorithm':
      return `{ const a = h.algorithm(v); if (a === 0) ${wrong("one of 'ab', 'bracha', 'chain'")} w.uint(${varint}); w.uint(a); }`;
    case 'bytes*':
      return `for (const b of h.byteList(v, what)) { w.uint(${delimited}); w.bytes(b); }`;
    case 'u64*':
      return `if (!Array.isArray(v)) ${wrong('an array of bigint')} if (v.length > 0) { w.uint(${delimited}); const at = w.begin(); for (const x of v) w.varint(h.toU64(x, what + ': field \`' + ${k} + '\`')); w.end(at); }`;
    case 'ids':
      return `if (!Array.isArray(v)) ${wrong('an array of bigint')} { w.uint(${delimited}); const at = w.begin(); h.packedIds(w, h.packIds(v, what), what); w.end(at); }`;
    case 'msgs':
      return `if (!Array.isArray(v)) ${wrong('an array of Uint8Array')} { w.uint(${delimited}); const at = w.begin(); h.messages(w, h.collectMessages(v, what), what); w.end(at); }`;
    default:
      throw new Error(`no kind ${kind}`);
  }
}

/**
 * A writer of one message by its table, compiled once into a function (as readers are,
 * for the same reason): it checks each field, then writes it.
 * @param {Field[]} fields
 * @returns {(w: Writer, o: Record<string, any>, what: string) => void}
 */
function compileWriter(fields) {
  /** @type {Record<string, unknown>} */
  const h = { ...W };
  const code = fields.map(([number, name, kind]) => {
    const k = JSON.stringify(name);
    if (typeof kind === 'string') return `{ const v = o[${k}]; ${writeCode(number, k, name, kind)} }`;
    h[name] = compileWriter(/** @type {Field[]} */ (Array.isArray(kind[0]) ? kind[0] : kind));
    const one = `{ w.uint(${number * 8 + 2}); const at = w.begin(); h[${k}](w, h.object(x, what), what); w.end(at); }`;
    return Array.isArray(kind[0])
      ? `{ const v = o[${k}]; if (!Array.isArray(v)) throw h.wrong(what, ${k}, 'an array'); for (const x of v) ${one} }`
      : `{ const x = o[${k}]; ${one} }`;
  });
  return new Function('h', `return function write(w, o, what) { ${code.join('\n')} };`)(h);
}

W.packedIds = compileWriter(PACKED_IDS);
W.messages = compileWriter(MESSAGES);

/**
 * A writer of a oneof by the object's `type`: its variant's message (or scalar field),
 * under the variant's field number.
 * @param {Variants} variants
 * @returns {Map<string, (w: Writer, o: Record<string, any>, what: string) => void>}
 */
function compileVariantWriters(variants) {
  const writers = new Map();
  for (const [number, type, fields] of variants) {
    if (typeof fields[0] === 'string') {
      const [name, kind] = /** @type {[string, string]} */ (fields);
      const k = JSON.stringify(name);
      // A scalar variant is written even when zero: its presence is the variant.
      const code = `const v = o[${k}]; w.uint(${number * 8}); w.varint(h.toU64(v, what + ': field \`' + ${k} + '\`'));`;
      if (kind !== 'u64') throw new Error(`scalar variant of kind ${kind}`);
      writers.set(type, new Function('h', `return function write(w, o, what) { ${code} };`)(W));
    } else {
      const body = compileWriter(/** @type {Field[]} */ (fields));
      writers.set(type, (/** @type {Writer} */ w, /** @type {Record<string, any>} */ o, /** @type {string} */ what) =>
        writeNested(w, number, body, o, what));
    }
  }
  return writers;
}

const INPUT_WRITERS = compileVariantWriters(INPUTS);
const REQUEST_WRITERS = compileVariantWriters(REQUESTS);
const OUTPUT_WRITERS = compileVariantWriters(OUTPUTS);
const EVENT_WRITERS = compileVariantWriters(EVENTS);

/** @param {unknown} v @param {string} what */
function kindOf(v, what) {
  if (typeof v !== 'object' || v === null || typeof (/** @type {any} */ (v).type) !== 'string') {
    throw typeError(`${what}: expected an object with a \`type\``);
  }
  return /** @type {Record<string, any>} */ (v);
}

/** @param {Writer} w @param {unknown} input */
function writeInput(w, input) {
  const obj = kindOf(input, 'input');
  const direct = INPUT_WRITERS.get(obj.type);
  if (direct !== undefined) return direct(w, obj, 'input');
  const request = REQUEST_WRITERS.get(obj.type);
  if (request === undefined) throw typeError(`unknown input type ${JSON.stringify(obj.type)}`);
  writeNested(w, REQUEST_FIELD, request, obj, 'input');
}

/** @param {Writer} w @param {unknown} output */
function writeOutput(w, output) {
  const obj = kindOf(output, 'output');
  const direct = OUTPUT_WRITERS.get(obj.type);
  if (direct !== undefined) return direct(w, obj, 'output');
  if (obj.type !== 'event') throw typeError(`unknown output type ${JSON.stringify(obj.type)}`);
  const event = kindOf(obj.event, 'event');
  const write = EVENT_WRITERS.get(event.type);
  if (write === undefined) throw typeError(`unknown event type ${JSON.stringify(event.type)}`);
  writeNested(w, EVENT_FIELD, write, event, 'event');
}

/**
 * `obj` written by `write` as the message of field `number`.
 * @param {Writer} w
 * @param {number} number
 * @param {(w: Writer, o: Record<string, any>, what: string) => void} write
 * @param {Record<string, any>} obj
 * @param {string} what
 */
function writeNested(w, number, write, obj, what) {
  w.uint(number * 8 + 2);
  const at = w.begin();
  write(w, obj, what);
  w.end(at);
}

/**
 * Ids packed as wide as the largest needs (the inverse of `unpackIds`).
 * @param {unknown[]} ids
 * @param {string} what
 */
function packIds(ids, what) {
  const values = ids.map((id) => BigInt(toU64(id, `${what}: field \`ids\``)));
  const max = values.reduce((m, v) => (v > m ? v : m), 0n);
  const bits = Math.max(1, max.toString(2).length);
  const packed = Buffer.alloc(Math.ceil((values.length * bits) / 8));
  let acc = 0n;
  let filled = 0n;
  let at = 0;
  for (const v of values) {
    acc |= v << filled;
    for (filled += BigInt(bits); filled >= 8n; filled -= 8n, acc >>= 8n) packed[at++] = Number(acc & 0xffn);
  }
  if (filled > 0n) packed[at] = Number(acc);
  return { bits, count: values.length, packed };
}

/**
 * Messages in one buffer, with one shared length when all are equal (the inverse of
 * `splitMessages`).
 * @param {unknown[]} msgs
 * @param {string} what
 */
function collectMessages(msgs, what) {
  /** @type {Uint8Array[]} */
  const list = W.byteList(msgs, what);
  const shared = list.every((m) => m.length === (list[0]?.length ?? 0)) ? list[0]?.length ?? 0 : null;
  return { sharedLen: shared, lens: shared === null ? list.map((m) => m.length) : [], bytes: Buffer.concat(list) };
}

const TIMED_INPUT = (1 << 3) | 2;
const TIMED_NOW = 1 << 3;
const TIMED_RECORD = (2 << 3) | 2;

/**
 * The buffer the addon writes its answers into, shared by every node: each answer is
 * copied out before the next call.
 */
let answers = Buffer.allocUnsafe(64 << 10);

/**
 * The answer of a call that writes into a buffer and returns the answer's length,
 * copied out (the outputs decoded from it view the copy); one that did not fit is
 * fetched again with `take` into a buffer large enough.
 * @param {(out: Buffer) => number} call
 * @param {(out: Buffer) => number} take
 * @returns {Buffer}
 */
function received(call, take) {
  const len = call(answers);
  if (len > answers.length) {
    answers = Buffer.allocUnsafe(2 ** Math.ceil(Math.log2(len)));
    take(answers);
  }
  const copy = Buffer.allocUnsafe(len);
  answers.copy(copy, 0, 0, len);
  return copy;
}

/**
 * One writer for every encoding: what it gives is handed straight to the addon, which
 * takes it in before returning, so the next encoding may overwrite it.
 */
const scratch = new Writer();

/**
 * An `InputBatch` of `{ now, input }`s (what the addon feeds a node in order), valid
 * until the next encoding.
 * @param {readonly TimedInput[]} inputs
 */
function encodeInputs(inputs) {
  if (!Array.isArray(inputs)) throw typeError('inputs: expected an array of { now, input }');
  const w = scratch.reset();
  for (const timed of inputs) {
    const { now, input } = W.object(timed, 'timed input');
    const at = toU64(now, 'now');
    w.uint(TIMED_INPUT);
    const outer = w.begin();
    if (at !== 0) {
      w.uint(TIMED_NOW);
      w.varint(at);
    }
    w.uint(TIMED_RECORD);
    const inner = w.begin();
    writeInput(w, input);
    w.end(inner);
    w.end(outer);
  }
  return w.done();
}

/**
 * A `RoundRecord` of outputs (the inverse of `decodeOutputs`), valid until the next
 * encoding.
 * @param {readonly Output[]} outputs
 */
function encodeOutputs(outputs) {
  if (!Array.isArray(outputs)) throw typeError('outputs: expected an array');
  const w = scratch.reset();
  for (const o of outputs) {
    w.uint(ROUND_OUTPUTS);
    const at = w.begin();
    writeOutput(w, o);
    w.end(at);
  }
  return w.done();
}

module.exports = {
  encodeInputs, encodeOutputs, decodeOutputs, decodeOutput, decodeInput, decodeTraceRecord, decodeExecute,
  received, Malformed,
};

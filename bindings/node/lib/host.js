// @ts-check
'use strict';
/**
 * What `Client` and `Replica` share: the native host loop (`native.Host`, which runs
 * each round off the event loop), TCP connections with phalanxd's framing over
 * `node:net`, and the core's timer.
 *
 * Framing (as `host-native/src/net.rs`): every node dials every replica; a connection
 * opens with a hello, the 4 bytes `PHX1` and the dialer's id (u32 little-endian), then
 * frames, each a u32 little-endian length and that many bytes. A node sends to a replica
 * on the connection it dialed, and to a client on the connection the client dialed.
 * Frames go to the core as `{ type: 'message', from, bytes }`; the hello is not trusted
 * (the core authenticates every frame, and counts what fails as a fault).
 *
 * Slots (as phalanxd's): an accepted connection is proven once a frame on it carries a
 * valid MAC from the id its hello named; a dialer sends one right after its hello
 * (`proof`: a frame carrying nothing). At most `maxConnections` are accepted; a
 * newcomer then takes the slot of the oldest one not proven, or is refused if every one
 * is, so strangers holding no keys cannot lock out the nodes that hold them. An id keeps
 * at most `MAX_PER_ID` proven connections (its oldest go). A client's frames go on its
 * newest proven connection once it has one, so a stranger claiming its id gets none.
 */
const net = require('node:net');
const native = require('./native');
const { PhalanxError, fromCode, guard } = require('./errors');
const records = require('./records');

const HELLO = Buffer.from('PHX1');
/** A length prefix above this closes the connection instead of allocating. */
const MAX_FRAME = 64 << 20;
/** Frames queued for a replica while its connection is down; the oldest are dropped. */
const MAX_QUEUED = 8192;
/** Most connections accepted at once (dials to replicas come on top). */
const MAX_CONNECTIONS = 1024;
/** Most proven connections one id keeps. */
const MAX_PER_ID = 4;

/**
 * @typedef {import('../native/index').Input} Input
 * @typedef {import('../native/index').Output} Output
 * @typedef {import('../native/index').Refusal} Refusal
 * @typedef {import('../native/index').AppHooks} AppHooks
 * @typedef {{ host: string, port: number }} Address
 * @typedef {Address[] | Record<number, Address | [string, number]> | Map<number, Address>} Replicas
 *   every replica's address: `ClusterFile.replicas` (`[{ id, host, port }]`), or by id
 * @typedef {{ request: bigint | null, refusal: Refusal | null }} Accepted
 * @typedef {{ socket: net.Socket | null, queue: Buffer[], backoff: number, retry: NodeJS.Timeout | null }} Peer
 */

/**
 * Addresses by id, from any of the forms `Replicas` allows.
 * @param {Replicas} replicas
 * @returns {Map<number, Address>}
 */
function addresses(replicas) {
  /** @type {Map<number, Address>} */
  const out = new Map();
  /** @param {number} id @param {Address | [string, number]} a */
  const add = (id, a) => {
    const [host, port] = Array.isArray(a) ? a : [a.host, a.port];
    if (typeof host !== 'string' || !Number.isInteger(port)) {
      throw new TypeError(`replica ${id}: expected { host, port }, got ${JSON.stringify(a)}`);
    }
    out.set(Number(id), { host, port });
  };
  if (replicas instanceof Map) for (const [id, a] of replicas) add(id, a);
  else if (Array.isArray(replicas)) for (const r of replicas) add(/** @type {any} */ (r).id, r);
  else if (replicas && typeof replicas === 'object') for (const [id, a] of Object.entries(replicas)) add(Number(id), a);
  else throw new TypeError('replicas: expected the replicas of a ClusterFile, a Map or an object by id');
  return out;
}

/**
 * The oldest accepted connection not proven, if any.
 * @param {Map<net.Socket, number | null>} inbound
 */
function unproven(inbound) {
  for (const [socket, by] of inbound) if (by === null) return socket;
  return null;
}

/** A frame: its length prefix, then the bytes. @param {Uint8Array} bytes */
function frame(bytes) {
  const header = Buffer.allocUnsafe(4);
  header.writeUInt32LE(bytes.length, 0);
  return [header, bytes];
}

/**
 * Calls `onFrame` for each frame read from `socket`, after a hello when `hello` is
 * set (then `onHello(id)` first); closes the socket on an oversized frame or a bad hello.
 * @param {net.Socket} socket
 * @param {(bytes: Buffer) => void} onFrame
 * @param {((id: number) => void) | null} onHello
 */
function readFrames(socket, onFrame, onHello) {
  let buf = Buffer.alloc(0);
  let greeted = onHello === null;
  socket.on('data', (chunk) => {
    buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk]);
    let at = 0;
    if (!greeted) {
      if (buf.length < 8) return;
      if (!buf.subarray(0, 4).equals(HELLO)) return void socket.destroy();
      greeted = true;
      /** @type {(id: number) => void} */ (onHello)(buf.readUInt32LE(4));
      at = 8;
    }
    while (buf.length - at >= 4) {
      const n = buf.readUInt32LE(at);
      if (n > MAX_FRAME) return void socket.destroy();
      if (buf.length - at - 4 < n) break;
      onFrame(buf.subarray(at + 4, at + 4 + n));
      at += 4 + n;
    }
    buf = at === buf.length ? Buffer.alloc(0) : buf.subarray(at);
  });
}

class Host {
  /** @type {import('../native/index').Host} */
  native;
  /** @type {Map<number, Address>} */
  #addresses;
  /** @type {(o: Output) => void} */
  #onOutput;
  /** @type {Address | null} */
  #listen = null;
  /** Inputs for the next round, each with what waits for its result. @type {{ input: Input, done?: (a: Accepted) => void, fail?: (e: Error) => void }[]} */
  #queue = [];
  #running = false;
  #started = false;
  #closed = false;
  /** @type {Error | null} */
  #failure = null;
  /** @type {Promise<void> | null} */
  #idle = null;
  /** @type {() => void} */
  #wake = () => {};
  /** @type {bigint | null} */
  #deadline = null;
  /** @type {NodeJS.Timeout | null} */
  #timer = null;
  /** Replicas this node dials: socket (when up) and the frames waiting. @type {Map<number, Peer>} */
  #peers = new Map();
  /** Connections others dialed, by the id their hello named (the newest). @type {Map<number, net.Socket>} */
  #accepted = new Map();
  /** Every accepted connection, oldest first: the id that proved it, or null. @type {Map<net.Socket, number | null>} */
  #inbound = new Map();
  /** Each id's proven connections, oldest first. @type {Map<number, net.Socket[]>} */
  #proven = new Map();
  #maxConnections;
  /** @type {Set<net.Socket>} */
  #sockets = new Set();
  /** @type {net.Server | null} */
  #server = null;
  /** Fault evidence seen: `"node:kind"` → count. @type {Map<string, number>} */
  faults = new Map();
  framesIn = 0;
  framesOut = 0;
  /** Called with the error that stopped the host. @type {(e: Error) => void} */
  onFailure = () => {};

  /**
   * @param {Uint8Array} config
   * @param {Replicas} replicas
   * @param {{ storage?: string | null, repair?: boolean, app?: AppHooks, listen?: Address | boolean | null, maxConnections?: number, onOutput: (o: Output) => void }} options
   *   `listen`: where to accept connections (`true`: this node's own address in `replicas`);
   *   `maxConnections`: most accepted at once (default 1024)
   */
  constructor(config, replicas, options) {
    const hostOptions = { storage: options.storage ?? undefined, repair: options.repair };
    this.native = guard(() => new native.Host(config, hostOptions, options.app));
    this.#addresses = addresses(replicas);
    const missing = this.native.replicaIds.filter((id) => !this.#addresses.has(id));
    if (missing.length > 0) throw new PhalanxError(`no address for replica(s) ${missing.join(', ')}: pass every replica's { host, port }`);
    this.#onOutput = options.onOutput;
    this.#maxConnections = options.maxConnections ?? MAX_CONNECTIONS;
    if (options.listen === true) this.#listen = this.#addresses.get(this.native.id) ?? null;
    else if (options.listen) this.#listen = options.listen;
    for (const id of this.native.replicaIds) {
      if (id !== this.native.id) this.#peers.set(id, { socket: null, queue: [], backoff: 20, retry: null });
    }
  }

  get id() {
    return this.native.id;
  }

  /** The address of every replica. */
  get addresses() {
    return this.#addresses;
  }

  /** Why the host stopped on its own, if it did. */
  get failure() {
    return this.#failure;
  }

  /** Recovers from the log (the first round), listens if it serves, dials every replica. */
  async start() {
    if (this.#started) return;
    this.#started = true;
    await this.#round();
    if (this.#failure) throw this.#failure;
    if (this.#listen) {
      const server = net.createServer((s) => this.#accept(s));
      this.#server = server;
      const { host, port } = this.#listen;
      await new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen(port, host, () => resolve(undefined));
      });
    }
    for (const id of this.#peers.keys()) this.#dial(id);
    this.#kick();
  }

  /** Closes every connection and waits for the round under way. */
  async close() {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#timer) clearTimeout(this.#timer);
    for (const p of this.#peers.values()) if (p.retry) clearTimeout(p.retry);
    for (const s of this.#sockets) s.destroy();
    const server = this.#server;
    if (server) await new Promise((resolve) => server.close(() => resolve(undefined)));
    if (this.#idle) await this.#idle;
    for (const q of this.#queue.splice(0)) q.fail?.(new PhalanxError('the host is stopped'));
  }

  /**
   * Feeds `input` in the next round; resolves to its request number (a client's
   * accepted request) or its refusal.
   * @param {Input} input
   * @returns {Promise<Accepted>}
   */
  feed(input) {
    if (this.#closed || this.#failure) return Promise.reject(this.#failure ?? new PhalanxError('the host is stopped'));
    return new Promise((done, fail) => {
      this.#queue.push({ input, done, fail });
      this.#kick();
    });
  }

  /** Starts a round if none runs and there is something to do. */
  #kick() {
    if (this.#running || this.#closed || this.#failure || !this.#started) return;
    const due = this.#deadline !== null && this.native.now() >= this.#deadline;
    if (this.#queue.length === 0 && !due) return;
    if (due) {
      this.#deadline = null;
      this.#queue.unshift({ input: { type: 'timeout' } });
    }
    void this.#round();
  }

  async #round() {
    this.#running = true;
    this.#idle = new Promise((resolve) => (this.#wake = () => resolve(undefined)));
    const batch = this.#queue.splice(0);
    try {
      const result = await this.native.run(records.encodeInputs(batch.map((b) => ({ now: 0, input: b.input }))));
      if (result.error) throw fromCode(result.error);
      const corked = new Set();
      for (const o of records.decodeOutputs(result.outputs)) {
        if (o.type === 'send') {
          const s = this.#send(o.to, o.bytes);
          if (s && !corked.has(s)) {
            corked.add(s);
            s.cork();
          }
        } else if (o.type === 'fault') {
          const key = `${o.node}:${o.kind}`;
          this.faults.set(key, (this.faults.get(key) ?? 0) + 1);
        } else {
          this.#onOutput(o);
        }
      }
      for (const s of corked) s.uncork();
      const refused = new Map(result.refused.map((r) => [r.index, r]));
      batch.forEach((b, i) => b.done?.({ request: result.requests[i] ?? null, refusal: refused.get(i) ?? null }));
      this.#schedule(result.nextTimeout ?? null);
    } catch (e) {
      const err = e instanceof Error ? e : new Error(String(e));
      this.#failure = err;
      for (const b of [...batch, ...this.#queue.splice(0)]) b.fail?.(err);
      if (!this.#closed) this.onFailure(err);
    } finally {
      this.#running = false;
      this.#wake();
      this.#kick();
    }
  }

  /** @param {bigint | null} deadline */
  #schedule(deadline) {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    this.#deadline = deadline;
    if (deadline === null || this.#closed) return;
    const ms = Math.max(0, Number(deadline - this.native.now()) / 1e6);
    this.#timer = setTimeout(() => {
      this.#timer = null;
      this.#kick();
    }, Math.ceil(ms));
  }

  /**
   * @param {number} to
   * @param {Buffer} bytes
   * @returns {net.Socket | null} the socket written to
   */
  #send(to, bytes) {
    const [header, body] = frame(bytes);
    const peer = this.#peers.get(to);
    if (peer) {
      if (peer.socket && peer.socket.writable) {
        peer.socket.write(header);
        peer.socket.write(body);
        this.framesOut++;
        return peer.socket;
      }
      peer.queue.push(Buffer.concat([header, body]));
      if (peer.queue.length > MAX_QUEUED) peer.queue.shift();
      return null;
    }
    // Once a client proved a connection, strangers claiming its id get none of its frames.
    const s = this.#proven.get(to)?.at(-1) ?? this.#accepted.get(to);
    // A client that is not connected retries; one that does not read is not waited for.
    if (s && s.writable && s.writableLength < MAX_FRAME) {
      s.write(header);
      s.write(body);
      this.framesOut++;
      return s;
    }
    return null;
  }

  /** @param {number} id */
  #dial(id) {
    const peer = /** @type {Peer} */ (this.#peers.get(id));
    const { host, port } = /** @type {Address} */ (this.#addresses.get(id));
    if (this.#closed) return;
    const socket = net.connect({ host, port, noDelay: true });
    this.#sockets.add(socket);
    socket.on('connect', () => {
      peer.backoff = 20;
      const hello = Buffer.alloc(8);
      HELLO.copy(hello);
      hello.writeUInt32LE(this.id, 4);
      socket.cork();
      socket.write(hello);
      // Proven before it has anything to say (a subscriber may never say anything).
      const proof = this.native.proof(id);
      if (proof !== null) for (const part of frame(proof)) socket.write(part);
      for (const f of peer.queue.splice(0)) socket.write(f);
      socket.uncork();
      peer.socket = socket;
    });
    readFrames(socket, (bytes) => this.#receive(id, bytes), null);
    socket.on('error', () => {});
    socket.on('close', () => {
      this.#sockets.delete(socket);
      if (peer.socket === socket) peer.socket = null;
      if (this.#closed) return;
      peer.retry = setTimeout(() => {
        peer.retry = null;
        this.#dial(id);
      }, peer.backoff);
      peer.backoff = Math.min(peer.backoff * 2, 500);
    });
  }

  /** @param {net.Socket} socket */
  #accept(socket) {
    if (this.#closed) return void socket.destroy();
    if (this.#inbound.size >= this.#maxConnections) {
      const oldest = unproven(this.#inbound);
      if (!oldest) return void socket.destroy();
      this.#inbound.delete(oldest);
      oldest.destroy();
    }
    this.#inbound.set(socket, null);
    socket.setNoDelay(true);
    this.#sockets.add(socket);
    /** @type {number | null} */
    let sender = null;
    const hello = setTimeout(() => socket.destroy(), 10_000);
    readFrames(socket, (bytes) => {
      if (sender === null) return;
      // Checked until a frame passes; the core gets every frame either way.
      if (this.#inbound.get(socket) === null && this.native.authentic(sender, bytes)) this.#prove(sender, socket);
      this.#receive(sender, bytes);
    }, (id) => {
      clearTimeout(hello);
      sender = id;
      this.#accepted.set(id, socket);
    });
    socket.on('error', () => {});
    socket.on('close', () => {
      clearTimeout(hello);
      this.#sockets.delete(socket);
      this.#inbound.delete(socket);
      if (sender === null) return;
      if (this.#accepted.get(sender) === socket) this.#accepted.delete(sender);
      const proven = this.#proven.get(sender) ?? [];
      if (proven.includes(socket)) proven.splice(proven.indexOf(socket), 1);
    });
  }

  /**
   * `socket` carried a frame with `id`'s valid MAC: it keeps its slot, and `id`'s oldest
   * proven connection beyond `MAX_PER_ID` goes.
   * @param {number} id
   * @param {net.Socket} socket
   */
  #prove(id, socket) {
    this.#inbound.set(socket, id);
    const proven = this.#proven.get(id) ?? [];
    this.#proven.set(id, proven);
    proven.push(socket);
    if (proven.length > MAX_PER_ID) proven.shift()?.destroy();
  }

  /** @param {number} from @param {Buffer} bytes */
  #receive(from, bytes) {
    this.framesIn++;
    // The frame's bytes are copied into the core at the next round.
    this.#queue.push({ input: { type: 'message', from, bytes } });
    this.#kick();
  }
}

module.exports = { Host, addresses };

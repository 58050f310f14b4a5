'use strict';
// Garbage from the network never throws and never crashes: random, truncated and
// bit-flipped frames (seeded, so a failure reproduces) fed to nodes of every role
// through the JavaScript API, and garbage over TCP to a JavaScript replica, which
// counts it as faults and goes on serving.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const phalanx = require('phalanx');
const { TRACES, MS, freePorts, eventually, Counter } = require('./helpers');

/** xorshift64*: a seeded stream of random numbers. */
function rng(seed) {
  let x = BigInt(seed) | 1n;
  return () => {
    x ^= x >> 12n;
    x ^= (x << 25n) & 0xffffffffffffffffn;
    x ^= x >> 27n;
    return Number(((x * 0x2545f4914f6cdd1dn) & 0xffffffffffffffffn) >> 11n) / 2 ** 53;
  };
}

/** Real frames recorded in the traces, by the node configuration that received them. */
function recordedFrames() {
  const out = [];
  for (const f of fs.readdirSync(TRACES).filter((f) => f.endsWith('.trace'))) {
    const trace = phalanx.Trace.load(path.join(TRACES, f));
    const frames = trace.records.filter((r) => r.input.type === 'message').map((r) => r.input);
    if (frames.length > 0) out.push({ config: trace.nodeConfig, frames });
  }
  return out;
}

const SEED = Number(process.env.PHALANX_FUZZ_SEED ?? 20261124);
const ROUNDS = Number(process.env.PHALANX_FUZZ_INPUTS ?? 6000);

test(`${ROUNDS} random, truncated and mutated frames never throw (seed ${SEED})`, () => {
  const random = rng(SEED);
  const int = (n) => Math.floor(random() * n);
  const targets = [
    ...phalanx.generateCluster({ f: 1, protocol: 'pbft', clients: 1, seed: 1 }).map((config) => ({ config, frames: [] })),
    ...phalanx.generateCluster({ f: 1, seed: 2, crypto: 'real' }).map((config) => ({ config, frames: [] })),
    ...recordedFrames(),
  ];
  const faults = new Map();
  let fed = 0;
  for (const { config, frames } of targets) {
    const node = new phalanx.Node(config);
    const ids = phalanx.describeConfig(config);
    const peers = [...ids.replicas, ...ids.clients, ...ids.subscribers, 999];
    for (let i = 0; i < ROUNDS / targets.length; i++, fed++) {
      let bytes;
      let from = peers[int(peers.length)];
      const kind = int(4);
      if (kind === 0 || frames.length === 0) {
        bytes = Buffer.alloc(int(300));
        for (let j = 0; j < bytes.length; j++) bytes[j] = int(256);
      } else {
        const frame = frames[int(frames.length)];
        from = frame.from;
        bytes = Buffer.from(frame.bytes);
        if (kind === 1) bytes = bytes.subarray(0, int(bytes.length));
        else if (kind === 2) for (let j = 0, n = 1 + int(4); j < n && bytes.length; j++) bytes[int(bytes.length)] ^= 1 << int(8);
        else bytes = Buffer.concat([bytes, Buffer.alloc(int(16), int(256))]);
      }
      node.handle(BigInt(i), { type: 'message', from, bytes });
      for (const o of node) {
        if (o.type === 'fault') faults.set(o.kind, (faults.get(o.kind) ?? 0) + 1);
      }
      if (i % 50 === 0) node.handle(BigInt(i), { type: 'timeout' });
      node.drain();
    }
  }
  assert.ok(fed >= ROUNDS - targets.length, `fed ${fed}`);
  // Garbage is reported as evidence, not swallowed silently.
  assert.ok((faults.get('malformed') ?? 0) + (faults.get('bad_mac') ?? 0) > ROUNDS / 4, JSON.stringify([...faults]));
});

test('garbage over TCP: a JavaScript replica counts it and goes on serving', async () => {
  const configs = phalanx.generateCluster({
    f: 1, protocol: 'pbft', clients: 1, seed: 21,
    params: { batch_timeout_ns: MS, request_timeout_ns: 300 * MS, client_retry_ns: 100 * MS },
  });
  const ports = await freePorts(4);
  const addrs = ports.map((port, id) => ({ id, host: '127.0.0.1', port }));
  const replicas = configs.slice(0, 4).map((c) => new phalanx.Replica(c, addrs, new Counter()));
  const client = new phalanx.Client(configs[4], addrs, { timeout: 15_000 });
  try {
    for (const r of replicas) await r.start();
    assert.equal(String(await client.execute(Buffer.from('add:1'))), '1');
    const random = rng(SEED + 1);
    const garbage = (n) => Buffer.from(Array.from({ length: n }, () => Math.floor(random() * 256)));
    const frame = (body) => Buffer.concat([Buffer.from(Uint32Array.of(body.length).buffer), body]);
    const hello = (id) => Buffer.concat([Buffer.from('PHX1'), Buffer.from(Uint32Array.of(id).buffer)]);
    const sessions = [
      garbage(64), // no hello
      Buffer.concat([hello(4), ...Array.from({ length: 200 }, (_, i) => frame(garbage(i % 97)))]), // claims to be the client
      Buffer.concat([hello(1), ...Array.from({ length: 200 }, (_, i) => frame(garbage(1 + (i % 300))))]), // claims to be a replica
      Buffer.concat([hello(77), frame(garbage(10))]), // an unknown node
      Buffer.concat([hello(4), Buffer.from([0xff, 0xff, 0xff, 0x7f]), garbage(100)]), // an oversized length prefix
      Buffer.concat([hello(4), frame(garbage(50)).subarray(0, 30)]), // truncated, then closed
    ];
    for (const bytes of sessions) {
      await new Promise((resolve) => {
        const s = net.connect(ports[2], '127.0.0.1', () => s.end(bytes));
        s.on('error', resolve);
        s.on('close', resolve);
      });
    }
    const faults = () => [...replicas[2].faults].reduce((n, [, c]) => n + c, 0);
    await eventually(() => faults() >= 300, () => `faults counted: ${JSON.stringify([...replicas[2].faults])}`);
    // Still one cluster: every replica executes what the client orders next.
    assert.equal(String(await client.execute(Buffer.from('add:2'))), '3');
    await eventually(() => replicas.every((r) => r.app.value === 3), () => `values ${replicas.map((r) => r.app.value)}`);
  } finally {
    await client.close();
    for (const r of replicas) await r.stop();
  }
});

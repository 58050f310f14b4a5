'use strict';
// Four JavaScript replicas in one process, on loopback with phalanxd's framing: they
// agree, survive a stopped primary (a view change), and a replica restarted from its
// write-ahead log catches up and is needed for the quorum; reads are answered without
// ordering by applications with `query`; strangers holding no keys take neither the
// connection slots nor the replies of the nodes that hold them.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const phalanx = require('phalanx');
const { MS, freePorts, eventually, Counter } = require('./helpers');

const PARAMS = { checkpoint_interval: 8, pipeline: 8, batch_timeout_ns: MS, request_timeout_ns: 300 * MS, client_retry_ns: 100 * MS };

async function cluster(seed, params = {}, clients = 1) {
  const configs = phalanx.generateCluster({ f: 1, protocol: 'pbft', clients, seed, params: { ...PARAMS, ...params } });
  const ports = await freePorts(4);
  return { configs, addrs: ports.map((port, id) => ({ id, host: '127.0.0.1', port })) };
}

const add = (n) => Buffer.from(`add:${n}`);

/**
 * A raw connection to `port` whose hello claims `id`, then a frame with no valid MAC; it
 * counts the bytes it receives and tells whether it was closed.
 */
async function stranger(port, id) {
  const socket = net.connect({ host: '127.0.0.1', port });
  const s = { socket, port, received: 0, closed: false };
  socket.on('data', (d) => (s.received += d.length));
  socket.on('error', () => {});
  socket.on('close', () => (s.closed = true));
  await new Promise((resolve) => socket.once('connect', resolve).once('close', resolve));
  const junk = Buffer.from('no MAC here');
  const bytes = Buffer.alloc(12 + junk.length);
  bytes.write('PHX1');
  bytes.writeUInt32LE(id, 4);
  bytes.writeUInt32LE(junk.length, 8);
  junk.copy(bytes, 12);
  if (!s.closed) socket.write(bytes);
  return s;
}

/** Every batch two replicas both executed holds the same ops, in the same order. */
function assertAgree(apps) {
  const bySeq = apps.map((a) => {
    const m = new Map();
    for (const [seq, client, request, op] of a.executed) {
      const k = String(seq);
      m.set(k, [...(m.get(k) ?? []), `${client}/${request}/${op}`]);
    }
    return m;
  });
  for (let i = 1; i < bySeq.length; i++) {
    for (const [seq, ops] of bySeq[i]) {
      if (bySeq[0].has(seq)) assert.deepEqual(ops, bySeq[0].get(seq), `batch ${seq}: replica ${i} and replica 0 differ`);
    }
  }
}

test('four JavaScript replicas agree, and survive a stopped primary', async () => {
  const { configs, addrs } = await cluster(11);
  const replicas = configs.slice(0, 4).map((c) => new phalanx.Replica(c, addrs, new Counter()));
  const client = new phalanx.Client(configs[4], addrs, { timeout: 15_000 });
  try {
    for (const r of replicas) await r.start();
    for (let i = 1; i <= 20; i++) assert.equal(Number(await client.execute(add(i))), (i * (i + 1)) / 2);
    const concurrent = await Promise.all(Array.from({ length: 10 }, () => client.execute(add(1))));
    assert.deepEqual(concurrent.map(Number).sort((a, b) => a - b), Array.from({ length: 10 }, (_, i) => 211 + i));
    await eventually(() => replicas.every((r) => r.app.ops === 30), () => `ops ${replicas.map((r) => r.app.ops)}`);
    assert.equal(new Set(replicas.map((r) => r.app.value)).size, 1);

    // Stop the primary of view 0: a view change, then progress with three.
    assert.equal(replicas[0].status().primary, true);
    await replicas[0].stop();
    const live = replicas.slice(1);
    for (let i = 1; i <= 10; i++) assert.equal(Number(await client.execute(add(100))), 220 + 100 * i);
    await eventually(() => live.every((r) => r.app.ops === 40), () => `ops ${live.map((r) => r.app.ops)}`);
    assert.deepEqual(new Set(live.map((r) => r.app.value)), new Set([1220]));
    assert.ok(live.every((r) => r.status().view >= 1n));
    assert.ok(live.reduce((n, r) => n + r.status().viewChanges, 0n) >= 1n);
    assertAgree(replicas.map((r) => r.app));
  } finally {
    await client.close();
    for (const r of replicas) await r.stop();
  }
});

test('a replica restarted from its log catches up and joins the quorum', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'phalanx-node-'));
  const { configs, addrs } = await cluster(12);
  const storage = (i) => path.join(dir, `replica-${i}`);
  const replicas = configs.slice(0, 4).map((c, i) => new phalanx.Replica(c, addrs, new Counter(), { storage: storage(i) }));
  const client = new phalanx.Client(configs[4], addrs, { timeout: 15_000, storage: path.join(dir, 'client') });
  try {
    for (const r of replicas) await r.start();
    for (let i = 0; i < 10; i++) await client.execute(add(1));
    await replicas[3].stop();
    for (let i = 0; i < 10; i++) await client.execute(add(1));
    // Restart replica 3 from its log, with a fresh application object.
    replicas[3] = new phalanx.Replica(configs[3], addrs, new Counter(), { storage: storage(3) });
    await replicas[3].start();
    for (let i = 0; i < 12; i++) await client.execute(add(1));
    // Stop another: replica 3 is needed for every quorum now.
    await replicas[1].stop();
    for (let i = 0; i < 4; i++) assert.ok(Number(await client.execute(add(1))) > 32);
    assert.equal(Number(await client.execute(Buffer.from('get'))), 36);
    const live = [replicas[0], replicas[2], replicas[3]];
    await eventually(() => live.every((r) => r.app.value === 36), () => `values ${live.map((r) => r.app.value)}`);
    assertAgree(live.map((r) => r.app));
    // The client kept its request-number lease in its log: a restarted one goes on from it.
    await client.close();
    const again = new phalanx.Client(configs[4], addrs, { timeout: 15_000, storage: path.join(dir, 'client') });
    try {
      assert.equal(Number(await again.execute(add(4))), 40);
    } finally {
      await again.close();
    }
  } finally {
    await client.close();
    for (const r of replicas) await r.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a read completes without ordering when 2f+1 applications answer it', async () => {
  class Readable extends Counter {
    queries = 0;
    query(op) {
      this.queries++;
      if (String(op) !== 'get') throw new Error(`${op} is not read-only`);
      return Buffer.from(String(this.value));
    }
  }
  const { configs, addrs } = await cluster(15);
  const apps = [new Readable(), new Readable(), new Readable(), new Counter()];
  const replicas = configs.slice(0, 4).map((c, i) => new phalanx.Replica(c, addrs, apps[i]));
  const client = new phalanx.Client(configs[4], addrs, { timeout: 15_000 });
  try {
    for (const r of replicas) await r.start();
    for (let i = 1; i <= 5; i++) await client.execute(add(i));
    await eventually(() => apps.every((a) => a.ops === 5), () => `ops ${apps.map((a) => a.ops)}`);
    assert.equal(String(await client.read(Buffer.from('get'))), '15');
    assert.deepEqual((await Promise.all(Array.from({ length: 5 }, () => client.read(Buffer.from('get'))))).map(String), Array(5).fill('15'));
    await eventually(() => replicas.slice(0, 3).every((r) => r.answeredQueries === 6), () => `answered ${replicas.map((r) => r.answeredQueries)}`);
    // Longer than client_retry_ns: a read that fell back to ordering would show.
    await new Promise((r) => setTimeout(r, 300));
    assert.deepEqual(apps.map((a) => a.ops), [5, 5, 5, 5]);
    assert.equal(String(await client.execute(add(1))), '16');
    assert.equal(String(await client.read(Buffer.from('get'))), '16');
  } finally {
    await client.close();
    for (const r of replicas) await r.stop();
  }
});

test('strangers holding no keys take neither the slots nor the replies of nodes that hold them', async () => {
  // Each replica accepts 8 connections: 3 from the other replicas and, in the end, 5
  // from clients, all proven by their frames' MACs.
  const LIMIT = 8;
  const { configs, addrs } = await cluster(16, {}, 5);
  const replicas = configs.slice(0, 4).map((c) => new phalanx.Replica(c, addrs, new Counter(), { maxConnections: LIMIT }));
  const clients = configs.slice(4).map((c) => new phalanx.Client(c, addrs, { timeout: 5_000 }));
  const strangers = [];
  /** `count` strangers at every replica, claiming `claims` in turn. */
  const wave = async (count, claims) => {
    const opened = [];
    for (const { port } of addrs) for (let i = 0; i < count; i++) opened.push(await stranger(port, claims[i % claims.length]));
    strangers.push(...opened);
    return opened;
  };
  /** The most strangers of `opened` still open at one replica. */
  const mostOpen = (opened) => Math.max(...addrs.map(({ port }) => opened.filter((s) => s.port === port && !s.closed).length));
  try {
    for (const r of replicas) await r.start();
    // Client 4 and the replicas' links prove themselves.
    for (let i = 1; i <= 3; i++) assert.equal(Number(await clients[0].execute(add(1))), i);
    await eventually(() => replicas.every((r) => r.app.ops === 3), () => `ops ${replicas.map((r) => r.app.ops)}`);

    // More strangers than slots, claiming replicas' and client 4's ids: the oldest make way,
    // the proven keep theirs, and clients 5-7 still get in.
    const first = await wave(2 * LIMIT, [0, 1, 2, 3, 4]);
    await eventually(() => mostOpen(first) <= LIMIT - 4, () => `strangers open: ${mostOpen(first)}`, 3_000);
    for (const c of clients.slice(1, 4)) assert.equal(Number(await c.execute(add(1))), 3 + c.id - 4);

    // Strangers claiming client 4 after it proved itself get none of its replies.
    const second = await wave(2 * LIMIT, [4]);
    await eventually(() => mostOpen(second) <= LIMIT - 7, () => `strangers open: ${mostOpen(second)}`, 3_000);
    assert.equal(mostOpen(second), 1, 'a stranger claiming client 4 holds the free slot');
    for (let i = 1; i <= 3; i++) assert.equal(Number(await clients[0].execute(add(1))), 6 + i);

    // Client 8 takes the last slot; with every slot proven, strangers are refused.
    assert.equal(Number(await clients[4].execute(add(1))), 10);
    const third = await wave(LIMIT, [4]);
    await eventually(() => mostOpen(third) === 0, () => `strangers open: ${mostOpen(third)}`, 3_000);
    assert.deepEqual(strangers.filter((s) => s.received > 0).map((s) => s.received), []);
  } finally {
    for (const s of strangers) s.socket.destroy();
    for (const c of clients) await c.close();
    for (const r of replicas) await r.stop();
  }
});

test('a dialer proves itself right after its hello, before it has anything to say', async () => {
  const { configs, addrs } = await cluster(17);
  // A stand-in for replica 0 keeps the first bytes a connecting client writes.
  let got = Buffer.alloc(0);
  const server = net.createServer((socket) => socket.on('data', (d) => (got = Buffer.concat([got, d]))));
  await new Promise((resolve) => server.listen(addrs[0].port, addrs[0].host, resolve));
  const client = new phalanx.Client(configs[4], addrs, { timeout: 5_000 });
  try {
    await client.start();
    const proof = new phalanx.Node(configs[4]).proof(0);
    const expected = Buffer.concat([Buffer.from('PHX1'), u32(4), u32(proof.length), proof]);
    await eventually(() => got.length >= expected.length, () => `${got.length} bytes arrived`, 5_000);
    assert.deepEqual(got.subarray(0, expected.length), expected);
    assert.equal(new phalanx.Node(configs[0]).authentic(4, proof), true);
    assert.equal(new phalanx.Node(configs[1]).authentic(4, proof), false);
  } finally {
    await client.close();
    server.close();
  }
});

/** A u32, little-endian. @param {number} n */
function u32(n) {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(n);
  return b;
}

test('no quorum: the client times out; wrong arguments are refused', async () => {
  const { configs, addrs } = await cluster(13);
  const replicas = configs.slice(0, 2).map((c) => new phalanx.Replica(c, addrs, new Counter()));
  const client = new phalanx.Client(configs[4], addrs);
  try {
    for (const r of replicas) await r.start();
    await assert.rejects(client.execute(add(1), { timeout: 500 }), (e) => e instanceof phalanx.TimeoutError && e.code === 'PHALANX_TIMEOUT' && /within 500 ms/.test(e.message));
    await assert.rejects(client.execute('add:1'), TypeError);
  } finally {
    await client.close();
    for (const r of replicas) await r.stop();
  }
  assert.throws(() => new phalanx.Replica(configs[0], addrs, {}), (e) => e instanceof TypeError && /execute/.test(e.message));
  assert.throws(() => new phalanx.Replica(configs[4], addrs, new Counter()), (e) => e instanceof phalanx.PhalanxError && /not a PBFT replica/.test(e.message));
  assert.throws(() => new phalanx.Client(configs[0], addrs), /not a PBFT client/);
  assert.throws(() => new phalanx.Client(configs[4], [addrs[0]]), /no address for replica/);
  assert.throws(() => new phalanx.Replica(Buffer.from('garbage'), addrs, new Counter()), phalanx.ConfigError);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'phalanx-node-'));
  fs.writeFileSync(path.join(dir, 'wal.log'), 'not a log');
  assert.throws(() => new phalanx.Replica(configs[0], addrs, new Counter(), { storage: dir }), (e) => e instanceof phalanx.StorageError && /wal\.log/.test(e.message));
  fs.rmSync(dir, { recursive: true, force: true });
});

test('Wal: a host that drives a Node keeps its records as phalanxd does', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'phalanx-wal-'));
  try {
    const [, , , , config] = phalanx.generateCluster({ f: 1, protocol: 'pbft', clients: 1, seed: 5 });
    const node = new phalanx.Node(config);
    const wal = new phalanx.Wal(dir);
    assert.deepEqual(wal.takeRecovered(), []);
    node.handle(0n, { type: 'submit', op: Buffer.from('x') });
    const persists = node.drain().filter((o) => o.type === 'persist');
    for (const p of persists) wal.append(p.record);
    wal.sync();
    assert.equal(wal.length, persists.length);
    // A restart: the records come back, for the node to recover from.
    const again = new phalanx.Wal(dir);
    const recovered = again.takeRecovered();
    assert.deepEqual(recovered, persists.map((p) => p.record));
    const restarted = new phalanx.Node(config);
    for (const record of recovered) restarted.handle(1n, { type: 'recover', record });
    assert.ok(restarted.nextRequest() > 1n, 'the lease on request numbers survived');
    fs.writeFileSync(path.join(dir, 'wal.log'), 'garbage');
    assert.throws(() => new phalanx.Wal(dir), (e) => e instanceof phalanx.StorageError && e.code === 'PHALANX_STORAGE');
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

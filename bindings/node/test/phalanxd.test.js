'use strict';
// Against real phalanxd processes started here (insecure test crypto, free loopback
// ports, killed at the end): the Promise client, and a mixed cluster of two phalanxd and
// two JavaScript replicas that agree on every batch any two of them executed (phalanxd's
// batches read from the traces it records).
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const phalanx = require('phalanx');
const { phalanxd, withPhalanxd, eventually } = require('./helpers');

const binary = phalanxd();
const skip = binary ? false : 'phalanxd not built (cargo build -p phalanx-host --bin phalanxd, or set PHALANXD)';

const withCluster = (t, body) => withPhalanxd(t, (c) => c.keygen(['--clients', '2']), body);

const b = (s) => Buffer.from(s);

test('the client against phalanxd', { skip, timeout: 120_000 }, (t) =>
  withCluster(t, async (c) => {
    c.start([0, 1, 2, 3]);
    const client = phalanx.Client.fromClusterFile(c.config, { timeout: 20_000 });
    try {
      assert.equal(client.id, phalanx.ClusterFile.load(c.config).clients[0]);
      assert.equal(await client.put(b('greeting'), b('hello')), null);
      assert.deepEqual(await client.get(b('greeting')), b('hello'));
      assert.deepEqual(await client.cas(b('greeting'), b('hello'), b('bonjour')), { swapped: true, before: b('hello') });
      assert.deepEqual(await client.cas(b('greeting'), b('hello'), b('hola')), { swapped: false, before: b('bonjour') });
      assert.deepEqual(await client.put(b('greeting'), b('hi')), b('bonjour'));
      const many = await Promise.all(Array.from({ length: 50 }, (_, i) => client.put(b(`k${i}`), b(`v${i}`))));
      assert.deepEqual(many, Array(50).fill(null));
      assert.deepEqual(phalanx.kv.decodeValue(await client.read(phalanx.kv.get(b('k9')))), b('v9'));
      // One replica killed: a quorum still answers.
      await c.kill(2);
      assert.deepEqual(await client.get(b('k7')), b('v7'));
      assert.deepEqual(await client.delete(b('k7')), b('v7'));
      assert.equal(await client.get(b('k7')), null);
    } finally {
      await client.close();
    }
    // Its lease on request numbers is in data/client-<id>, where phalanxd's client keeps it.
    assert.ok(fs.existsSync(path.join(c.dir, 'data', `client-${client.id}`, 'wal.log')));
    // The other client id, in memory, sees the same state.
    const other = phalanx.Client.fromClusterFile(c.config, { id: phalanx.ClusterFile.load(c.config).clients[1], storage: null, timeout: 20_000 });
    try {
      assert.deepEqual(await other.get(b('greeting')), b('hi'));
    } finally {
      await other.close();
    }
  }));

test('the client times out against a stopped cluster', { skip, timeout: 60_000 }, (t) =>
  withCluster(t, async (c) => {
    const client = phalanx.Client.fromClusterFile(c.config, { storage: null });
    try {
      await assert.rejects(client.put(b('k'), b('v'), { timeout: 500 }), phalanx.TimeoutError);
    } finally {
      await client.close();
    }
  }));

/** [seq, client, request, op] of every op phalanxd executed, from its recorded traces. */
function executedByPhalanxd(dir) {
  const out = [];
  for (const f of fs.readdirSync(dir)) {
    for (const r of phalanx.Trace.load(path.join(dir, f))) {
      for (const o of r.outputs) {
        if (o.type === 'execute') for (const op of o.ops) out.push([o.seq, op.client, op.request, op.op.toString('hex')]);
      }
    }
  }
  return out;
}

/** A KvStore that keeps what it executed, as `executedByPhalanxd` reads it. */
class RecordingKv extends phalanx.KvStore {
  executed = [];
  execute(op, { seq, client, request }) {
    this.executed.push([seq, client, request, Buffer.from(op).toString('hex')]);
    return super.execute(op);
  }
}

test('two phalanxd and two JavaScript replicas agree on every executed batch', { skip, timeout: 180_000 }, (t) =>
  withCluster(t, async (c) => {
    c.start([0, 1], { trace: true });
    const stores = [new RecordingKv(), new RecordingKv()];
    const replicas = [2, 3].map((id, i) => phalanx.Replica.fromClusterFile(c.config, id, stores[i], { storage: path.join(c.dir, `js-${id}`) }));
    const client = phalanx.Client.fromClusterFile(c.config, { timeout: 20_000 });
    try {
      for (const r of replicas) await r.start();
      for (let i = 0; i < 30; i++) await client.put(b(`key${i}`), b(`value${i}`));
      await Promise.all(Array.from({ length: 40 }, (_, i) => client.put(b(`burst${i}`), b(`${i}`))));
      await eventually(() => stores.every((s) => s.size === 70), () => `sizes ${stores.map((s) => s.size)}`);
      // Kill phalanxd replica 0, the primary: the view change needs both JavaScript replicas.
      await c.kill(0);
      assert.deepEqual(await client.cas(b('key1'), b('value1'), b('changed')), { swapped: true, before: b('value1') });
      assert.deepEqual(await client.get(b('key1')), b('changed'));
      assert.deepEqual(phalanx.kv.decodeValue(await client.read(phalanx.kv.get(b('key1')))), b('changed'));
      for (let i = 0; i < 10; i++) await client.delete(b(`key${i}`));
      await eventually(() => stores.every((s) => s.get(b('key9')) === null), () => 'the JavaScript replicas did not execute every delete');
      assert.ok(replicas.every((r) => r.status().view >= 1n), 'a view change happened');
      assert.ok(replicas.every((r) => ![...r.faults.keys()].some((k) => k.endsWith(':bad_mac'))), 'no frame failed authentication');
    } finally {
      await client.close();
      for (const r of replicas) await r.stop();
      await c.stopAll();
    }
    // Every batch executed by two replicas holds the same ops, in the same order.
    const executed = [executedByPhalanxd(path.join(c.dir, 'traces-0')), executedByPhalanxd(path.join(c.dir, 'traces-1')), ...stores.map((s) => s.executed)];
    const bySeq = executed.map((ops) => {
      const m = new Map();
      for (const [seq, ...op] of ops) m.set(seq, [...(m.get(seq) ?? []), op.join('/')]);
      return m;
    });
    assert.ok(bySeq[1].size >= 10 && bySeq[2].size >= 10, `batches: ${bySeq.map((m) => m.size)}`);
    let compared = 0;
    for (let i = 0; i < bySeq.length; i++) {
      for (let j = i + 1; j < bySeq.length; j++) {
        for (const [seq, ops] of bySeq[i]) {
          if (!bySeq[j].has(seq)) continue;
          assert.deepEqual(bySeq[j].get(seq), ops, `batch ${seq}: replicas ${i} and ${j} differ`);
          compared++;
        }
      }
    }
    // phalanxd 1 and the JavaScript replicas ran to the end: they executed the same batches.
    assert.deepEqual([...bySeq[2].keys()], [...bySeq[1].keys()]);
    assert.deepEqual([...bySeq[3].keys()], [...bySeq[1].keys()]);
    t.diagnostic(`${compared} batch pairs compared`);
  }));

'use strict';
// DistillClient against a distillation deployment of real phalanxd processes (4 servers,
// 2 brokers, a directory of 16 clients, insecure test crypto, free loopback ports,
// killed at the end): what the clients were told was delivered is what every server
// delivered, each message exactly once.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const phalanx = require('phalanx');
const { phalanxd, withPhalanxd, eventually } = require('./helpers');

const skip = phalanxd() ? false : 'phalanxd not built (cargo build -p phalanx-host --bin phalanxd, or set PHALANXD)';
const SERVERS = [0, 1, 2, 3];
const BROKERS = [1000, 1001];
const DIRECTORY = 16;

const withDeployment = (t, body) =>
  withPhalanxd(t, (c) => c.keygen(['--protocol', 'distill', '--clients', String(DIRECTORY), '--brokers', String(BROKERS.length)], { nodes: SERVERS.length + BROKERS.length, metrics: true }), body);

/** Server `id`'s metric `name`. */
async function metric(c, id, name) {
  const text = await (await fetch(`http://127.0.0.1:${c.metricsBase + id}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  return line === undefined ? null : Number(line.slice(name.length + 1));
}

/** Every message server `id` delivered and keeps, from its deliveries feed: `{ height, index, seq, message }`. */
async function deliveries(c, id) {
  const out = [];
  for (let after = 0n; ;) {
    const text = await (await fetch(`http://127.0.0.1:${c.metricsBase + id}/deliveries?after=${after}`)).text();
    const lines = text.split('\n').filter(Boolean);
    if (lines.length === 0) return out;
    let height = after;
    for (const line of lines) {
      const [first, ...rest] = line.split(' ');
      if (first === 'batch') height = BigInt(rest[0]);
      else if (first === 'gap') height = BigInt(rest[1]);
      else out.push({ height, index: Number(first), seq: BigInt(rest[0]), message: Buffer.from(rest[1] ?? '', 'hex').toString() });
    }
    after = height;
  }
}

test('distillation clients through two brokers, each message delivered once at every server', { skip, timeout: 180_000 }, (t) =>
  withDeployment(t, async (c) => {
    c.start(SERVERS);
    c.startBrokers(BROKERS);
    const indexes = [0, 5, 11];
    const clients = indexes.map((index, i) =>
      phalanx.DistillClient.fromClusterFile(c.config, { index, timeout: 30_000, ...(i === 1 ? { dataDir: path.join(c.dir, 'js-client') } : {}) }));
    const messages = (index) => Array.from({ length: 4 }, (_, n) => `c${index}-m${n}`);
    let results;
    try {
      assert.deepEqual(clients.map((cl) => cl.index), indexes);
      assert.deepEqual(clients.map((cl) => cl.id), indexes.map((i) => 2 ** 31 + i));
      // Every message submitted at once: each client queues its own, the clients run side by side.
      results = await Promise.all(clients.map((cl) =>
        Promise.all(messages(cl.index).map((m, n) => cl.submit(n % 2 ? Buffer.from(m) : m)))));
    } finally {
      await Promise.all(clients.map((cl) => cl.close()));
    }
    for (const [i, delivered] of results.entries()) {
      for (let n = 0; n < delivered.length; n++) {
        assert.ok(delivered[n].height > 0n, `client ${indexes[i]}: ${delivered[n].height}`);
        if (n > 0) {
          assert.ok(delivered[n].seq > delivered[n - 1].seq, `client ${indexes[i]}: seqs ${delivered.map((d) => d.seq)}`);
          assert.ok(delivered[n].height > delivered[n - 1].height, `client ${indexes[i]}: heights ${delivered.map((d) => d.height)}`);
        }
      }
    }
    // Logs where phalanxd's client keeps them, or where they were asked to be.
    assert.ok(fs.existsSync(path.join(c.dir, 'data', `client-${clients[0].id}`, 'wal.log')));
    assert.ok(fs.existsSync(path.join(c.dir, 'js-client', 'wal.log')));
    await assert.rejects(clients[0].submit('after close'), phalanx.HostError);

    const total = indexes.length * 4;
    for (const id of SERVERS) {
      let count = null;
      await eventually(async () => (count = await metric(c, id, 'phalanx_distill_messages_delivered_total')) === total,
        () => `server ${id} delivered ${count} messages, not ${total}`, 30_000);
    }
    // Every server delivered each message once, where its client was told.
    const told = new Map(indexes.flatMap((index, i) => messages(index).map((m, n) => [`${index}:${m}`, results[i][n]])));
    for (const id of SERVERS) {
      const feed = await deliveries(c, id);
      assert.equal(feed.length, total, `server ${id}`);
      for (const { height, index, seq, message } of feed) {
        const key = `${index}:${message}`;
        assert.deepEqual({ height, seq }, told.get(key), `server ${id}: ${key}`);
      }
      assert.equal(new Set(feed.map((d) => `${d.index}:${d.message}`)).size, total, `server ${id}: a message delivered twice`);
    }
  }));

test('a directory index outside the deployment is a ConfigError, no deployment a TimeoutError', { skip, timeout: 60_000 }, (t) =>
  withDeployment(t, async (c) => {
    assert.throws(() => phalanx.DistillClient.fromClusterFile(c.config, { index: DIRECTORY }), (e) =>
      e instanceof phalanx.ConfigError && e.code === 'PHALANX_CONFIG' && /16 clients/.test(e.message));
    assert.throws(() => phalanx.DistillClient.fromClusterFile(path.join(c.dir, 'missing.toml')), phalanx.ConfigError);
    // Nothing runs: the submission gets no delivery in time.
    const client = phalanx.DistillClient.fromClusterFile(c.config, { index: DIRECTORY - 1, timeout: 300 });
    try {
      await assert.rejects(client.submit('nobody listens'), (e) => e instanceof phalanx.TimeoutError && e.code === 'PHALANX_TIMEOUT');
      await assert.rejects(client.submit(42), TypeError);
    } finally {
      await client.close();
    }
  }));

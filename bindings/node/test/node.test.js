'use strict';
// The node API: configuration, the sans-IO shape, inputs and outputs as plain objects,
// bigint for 64-bit values, errors with stable codes, TypeError for wrong arguments,
// the key-value helpers and the simulator.
const test = require('node:test');
const assert = require('node:assert/strict');
const phalanx = require('phalanx');

const configs = phalanx.generateCluster({ f: 1, protocol: 'pbft', clients: 1, seed: 7 });

test('generateCluster and describeConfig', () => {
  assert.equal(configs.length, 5);
  assert.ok(configs.every((c) => Buffer.isBuffer(c)));
  assert.deepEqual(phalanx.generateCluster({ f: 1, protocol: 'pbft', clients: 1, seed: 7n }), configs);
  assert.notDeepEqual(phalanx.generateCluster({ f: 1, protocol: 'pbft', clients: 1, seed: 8 }), configs);
  assert.deepEqual(phalanx.generateCluster({ f: 1, protocol: 'pbft', clients: 1, seed: Buffer.alloc(32) }), phalanx.generateCluster({ f: 1, protocol: 'pbft', clients: 1 }));
  const d = phalanx.describeConfig(configs[4]);
  assert.deepEqual(
    { id: d.id, role: d.role, protocol: d.protocol, f: d.f, replicas: d.replicas, clients: d.clients },
    { id: 4, role: 'client', protocol: 'pbft', f: 1, replicas: [0, 1, 2, 3], clients: [4] },
  );
  const pubsub = phalanx.generateCluster({ f: 2, subscribers: 3, topics: [1n, 2n], params: { alpha: 4, window: 64n } });
  assert.equal(pubsub.length, 7 + 1 + 3);
  assert.equal(phalanx.describeConfig(pubsub[10]).role, 'subscriber');
  assert.equal(phalanx.generateCluster({ f: 1, n: 5, protocol: 'pbft' }).length, 6);
});

test('configuration errors are ConfigError with a stable code', () => {
  const isConfig = (e) => e instanceof phalanx.ConfigError && e instanceof phalanx.PhalanxError && e.code === 'PHALANX_CONFIG';
  assert.throws(() => new phalanx.Node(Buffer.from('garbage')), isConfig);
  assert.throws(() => phalanx.generateCluster({ protocol: 'raft' }), (e) => isConfig(e) && /raft/.test(e.message));
  assert.throws(() => phalanx.generateCluster({ params: { no_such: 1 } }), (e) => isConfig(e) && /no_such/.test(e.message));
  assert.throws(() => phalanx.generateCluster({ f: 1, n: 3 }), isConfig);
  assert.throws(() => phalanx.describeConfig(Buffer.from([0xff])), isConfig);
  assert.throws(() => phalanx.ClusterFile.load('/nonexistent/cluster.toml'), (e) => isConfig(e) && /cluster\.toml/.test(e.message));
});

test('wrong argument types throw TypeError', () => {
  const node = new phalanx.Node(configs[4]);
  const isType = (e) => e instanceof TypeError;
  assert.throws(() => new phalanx.Node('not bytes'), isType);
  assert.throws(() => node.handle('1', { type: 'timeout' }), isType);
  assert.throws(() => node.handle(-1, { type: 'timeout' }), isType);
  assert.throws(() => node.handle(1.5, { type: 'timeout' }), isType);
  assert.throws(() => node.handle(-1n, { type: 'timeout' }), isType);
  assert.throws(() => node.handle(2n ** 64n, { type: 'timeout' }), isType);
  assert.throws(() => node.handle(0n, { type: 'no-such-input' }), isType);
  assert.throws(() => node.handle(0n, { type: 'submit', op: 'a string' }), isType);
  assert.throws(() => node.handle(0n, { type: 'submit' }), isType);
  assert.throws(() => node.handle(0n, null), isType);
  assert.throws(() => node.handle(0n, { type: 'message', from: 0, bytes: [1, 2] }), isType);
  assert.throws(() => phalanx.generateCluster({ seed: 'x' }), isType);
  assert.throws(() => phalanx.generateCluster({ seed: Buffer.alloc(5) }), isType);
  // Numbers that are safe integers are accepted where bigints are expected.
  node.handle(0, { type: 'timeout' });
  node.handle(Number.MAX_SAFE_INTEGER, { type: 'timeout' });
});

test('a PBFT client: handle, poll, iteration, pollTimeout, nextRequest, status', () => {
  const node = new phalanx.Node(configs[4]);
  assert.deepEqual([node.id, node.role, node.protocol, node.f, node.replicaIds], [4, 'client', 'pbft', 1, [0, 1, 2, 3]]);
  assert.equal(node.nextRequest(), 1n);
  node.handle(0n, { type: 'submit', op: new Uint8Array([1, 2, 3]) });
  assert.equal(node.nextRequest(), 2n);
  const first = node.poll();
  assert.equal(first.type, 'persist');
  assert.equal(typeof first.token, 'bigint');
  assert.ok(Buffer.isBuffer(first.record));
  assert.equal(node.poll(), null);
  node.handle(1n, { type: 'persisted', token: first.token });
  const released = [...node];
  assert.deepEqual(released.filter((o) => o.type === 'send').map((o) => o.to), [0, 1, 2, 3]);
  assert.ok(released.every((o) => Buffer.isBuffer(o.bytes) || o.type === 'compact'));
  assert.deepEqual(node.drain(), []);
  assert.equal(typeof node.pollTimeout(), 'bigint');
  const status = node.status();
  assert.equal(typeof status.view, 'bigint');
  assert.ok('macsVerified' in status && 'stale' in status);
  assert.deepEqual(node.stats(), { stale: 0n, beyondWindow: 0n, unsubscribed: 0n, refused: 0n });
});

test('authentic: whether a frame carries a valid MAC from its sender to this node', () => {
  const client = new phalanx.Node(configs[4]);
  client.handle(0n, { type: 'submit', op: Buffer.from('x') });
  client.handle(1n, { type: 'persisted', token: client.poll().token });
  const requests = client.drain().find((o) => o.type === 'send' && o.to === 0).bytes;
  client.handle(2n, { type: 'read', op: Buffer.from('y') });
  const read = client.drain().find((o) => o.type === 'send' && o.to === 0).bytes;
  const replica = new phalanx.Node(configs[0]);
  assert.equal(replica.authentic(4, read), true);
  assert.equal(replica.authentic(3, read), false);
  // Its hop MAC is for replica 0 alone.
  assert.equal(new phalanx.Node(configs[1]).authentic(4, read), false);
  // A client's lone requests carry no hop MAC: their authenticator has an entry for
  // every replica.
  assert.equal(replica.authentic(4, requests), true);
  assert.equal(new phalanx.Node(configs[1]).authentic(4, requests), true);
  assert.equal(replica.authentic(3, requests), false);
  assert.equal(replica.authentic(4, Buffer.from('junk')), false);
  assert.throws(() => replica.authentic(4, 'junk'), TypeError);
});

test('refusals: HandleError, BackpressureError, and handleMany', () => {
  const node = new phalanx.Node(configs[4]);
  assert.throws(
    () => node.handle(0n, { type: 'publish', topic: 0n, payload: Buffer.alloc(0), algorithm: 'ab' }),
    (e) => e instanceof phalanx.HandleError && e.code === 'PHALANX_HANDLE' && e.message === 'a client cannot handle a publish request',
  );
  const inputs = [
    { now: 0n, input: { type: 'submit', op: Buffer.from('a') } },
    { now: 0n, input: { type: 'subscribe', topics: [1n] } },
    { now: 1n, input: { type: 'submit', op: Buffer.from('b') } },
  ];
  const refusals = [];
  const outputs = node.handleMany(inputs, refusals);
  assert.deepEqual(refusals.map((r) => [r.index, r.code]), [[1, 'PHALANX_HANDLE']]);
  assert.ok(outputs.some((o) => o.type === 'persist'));
  assert.throws(() => new phalanx.Node(configs[4]).handleMany(inputs), (e) => e instanceof phalanx.HandleError && e.refusals.length === 1 && e.outputs.length > 0);
  // A client keeps at most client_queue requests outstanding.
  const [, , , , small] = phalanx.generateCluster({ f: 1, protocol: 'pbft', clients: 1, params: { client_queue: 2 } });
  const client = new phalanx.Node(small);
  client.handle(0n, { type: 'submit', op: Buffer.from('1') });
  client.handle(0n, { type: 'submit', op: Buffer.from('2') });
  assert.throws(
    () => client.handle(0n, { type: 'submit', op: Buffer.from('3') }),
    (e) => e instanceof phalanx.BackpressureError && e instanceof phalanx.HandleError && e.code === 'PHALANX_BACKPRESSURE',
  );
});

test('a pub/sub publisher and broker speak the same objects', () => {
  const cluster = phalanx.generateCluster({ f: 1, seed: 3 });
  const publisher = new phalanx.Node(cluster[4]);
  const broker = new phalanx.Node(cluster[0]);
  publisher.handle(0n, { type: 'publish', topic: 0n, payload: Buffer.from('hi'), algorithm: 'bracha' });
  const toBroker = [...publisher].filter((o) => o.type === 'send' && o.to === 0);
  assert.equal(toBroker.length, 1);
  broker.handle(1n, { type: 'message', from: 4, bytes: toBroker[0].bytes });
  assert.ok([...broker].every((o) => o.type === 'send'));
  assert.equal(phalanx.FAULT_KINDS.includes('bad_mac'), true);
});

test('the key-value helpers and KvStore agree with the replicas', () => {
  const store = new phalanx.KvStore();
  const k = Buffer.from('k');
  assert.equal(phalanx.kv.decodeValue(store.execute(phalanx.kv.put(k, Buffer.from('v1')))), null);
  assert.deepEqual(phalanx.kv.decodeValue(store.execute(phalanx.kv.put(k, Buffer.from('v2')))), Buffer.from('v1'));
  assert.deepEqual(phalanx.kv.decodeValue(store.query(phalanx.kv.get(k))), Buffer.from('v2'));
  assert.deepEqual(phalanx.kv.decodeCas(store.execute(phalanx.kv.cas(k, Buffer.from('v1'), Buffer.from('x')))), { swapped: false, before: Buffer.from('v2') });
  assert.deepEqual(phalanx.kv.decodeCas(store.execute(phalanx.kv.cas(k, Buffer.from('v2'), Buffer.from('x')))), { swapped: true, before: Buffer.from('v2') });
  const copy = new phalanx.KvStore();
  copy.restore(store.snapshot());
  assert.deepEqual(copy.get(k), Buffer.from('x'));
  assert.equal(copy.size, 1);
  assert.deepEqual(phalanx.kv.decodeValue(copy.execute(phalanx.kv.delete(k))), Buffer.from('x'));
  assert.equal(copy.get(k), null);
  assert.throws(() => phalanx.kv.decodeValue(store.execute(Buffer.from([0xff, 0xff]))), (e) => e instanceof phalanx.KvError && e.code === 'PHALANX_KV');
  assert.throws(() => copy.restore(Buffer.from('junk')), phalanx.KvError);
  assert.throws(() => phalanx.kv.decodeCas(phalanx.kv.get(k)), phalanx.KvError);
});

test('simulate runs a scenario off the event loop', async () => {
  const run = phalanx.simulate({ protocol: 'pbft', f: 1, seed: 3n });
  assert.ok(run instanceof Promise);
  const r = await run;
  assert.equal(r.ok, true, r.violations.join('; '));
  assert.ok(r.completed > 0 && r.messagesSent > 0n);
  const bracha = await phalanx.simulate({ protocol: 'bracha', f: 2, seed: 5, adversarial: true });
  assert.equal(bracha.ok, true, bracha.violations.join('; '));
  assert.throws(() => phalanx.simulate({ protocol: 'raft' }), phalanx.ConfigError);
});

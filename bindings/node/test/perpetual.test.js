'use strict';
// Perpetual groups hosted on Node.js (phalanxd's framing): a bank group calling a ledger
// group through the futures API, a ledger member replaced by a fresh one mid-run (state
// transfer restores its service); calls in flight and requests served out of order;
// aborts by agreement; and a JavaScript ledger member whose vote the checkpoints of a
// group of phalanxd members need.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn, execFileSync } = require('node:child_process');
const phalanx = require('phalanx');
const { freePorts, freePortBlock, phalanxd, eventually, MS } = require('./helpers');

const { Member, CallAborted } = phalanx.perpetual;
const PARAMS = { checkpoint_interval: 4, pipeline: 8, batch_timeout_ns: MS, request_timeout_ns: 300 * MS, client_retry_ns: 100 * MS };

const le = (x) => {
  const b = Buffer.alloc(8);
  b.writeBigInt64LE(BigInt(x));
  return b;
};
const i64 = (b) => Number(b.readBigInt64LE(0));

class Ledger {
  balance = 0;
  served = 0;
  restores = 0;
  async run(group) {
    for (;;) {
      const request = await group.nextRequest();
      this.balance += i64(request.op);
      this.served++;
      group.sendResult(request, le(this.balance));
    }
  }
  snapshot() {
    return le(this.balance);
  }
  restore(state) {
    this.balance = i64(state);
    this.restores++;
  }
}

/** Increments then decrements, one call at a time; its state names the call in flight. */
class Bank {
  done = 0;
  last = 0;
  inFlight = null;
  constructor(ops) {
    this.ops = ops;
  }
  async run(group) {
    while (this.done < 2 * this.ops) {
      if (this.inFlight === null) this.inFlight = group.invoke(1, le(this.done < this.ops ? 1 : -1)).call;
      try {
        this.last = i64(await group.invocation(this.inFlight).get());
        this.done++;
      } catch (e) {
        if (!(e instanceof CallAborted)) throw e;
      }
      this.inFlight = null;
    }
  }
  snapshot() {
    const b = Buffer.alloc(24);
    b.writeBigInt64LE(BigInt(this.done), 0);
    b.writeBigInt64LE(BigInt(this.last), 8);
    b.writeBigUInt64LE(this.inFlight ?? 0n, 16);
    return b;
  }
  restore(state) {
    this.done = Number(state.readBigInt64LE(0));
    this.last = Number(state.readBigInt64LE(8));
    const call = state.readBigUInt64LE(16);
    this.inFlight = call === 0n ? null : call;
  }
}

async function members(sizes, seed) {
  const configs = phalanx.generatePerpetual(sizes, { seed, params: PARAMS });
  const ports = await freePorts(configs.length);
  return { configs, addrs: Object.fromEntries(ports.map((port, id) => [id, { host: '127.0.0.1', port }])) };
}

async function running(nodes, body) {
  try {
    for (const n of nodes) await n.start();
    await body();
  } finally {
    for (const n of nodes) await n.stop();
  }
}

test('a bank group calls a ledger group, and a replaced ledger member catches up', async () => {
  const { configs, addrs } = await members([4, 4], 3);
  const banks = [0, 1, 2, 3].map(() => new Bank(12));
  const ledgers = [0, 1, 2, 3].map(() => new Ledger());
  const nodes = [...banks, ...ledgers].map((s, i) => new Member(configs[i], addrs, s));
  await running(nodes, async () => {
    await eventually(() => banks[0].done >= 6, () => `bank at ${banks[0].done}`, 20_000);
    await nodes[7].stop();
    ledgers[3] = new Ledger();
    nodes[7] = new Member(configs[7], addrs, ledgers[3]);
    await nodes[7].start();
    await eventually(() => banks.every((b) => b.done === 24), () => `banks at ${banks.map((b) => b.done)}`, 60_000);
    assert.deepEqual(banks.map((b) => b.last), [0, 0, 0, 0]);
    await eventually(() => ledgers.every((l) => l.balance === 0), () => `${ledgers.map((l) => l.balance)}`, 20_000);
    assert.ok(ledgers[3].restores >= 1, 'the fresh member was restored from a checkpoint');
  });
});

test('calls in flight, outcomes in completion order, requests served out of order', async () => {
  const { configs, addrs } = await members([1, 4], 4);
  const fanout = {
    newestFirst: null,
    last: null,
    async run(group) {
      const calls = [];
      for (let i = 1; i <= 10; i++) calls.push(group.invoke(1, le(i)));
      const got = [];
      for (const c of calls.reverse()) got.push(i64(await c.get()));
      this.newestFirst = got;
      group.invoke(1, le(11));
      group.invoke(1, le(12));
      const last = new Set();
      for (let k = 0; k < 2; k++) last.add(i64((await group.nextResult()).value));
      this.last = last;
    },
    snapshot: () => Buffer.alloc(0),
    restore() {},
  };
  const squaresInPairs = () => ({
    async run(group) {
      for (;;) {
        const first = await group.nextRequest();
        const second = await group.nextRequest();
        for (const r of [second, first]) group.sendResult(r, le(i64(r.op) ** 2));
      }
    },
    snapshot: () => Buffer.alloc(0),
    restore() {},
  });
  const nodes = [new Member(configs[0], addrs, fanout), ...configs.slice(1).map((c) => new Member(c, addrs, squaresInPairs()))];
  await running(nodes, async () => {
    await eventually(() => fanout.last !== null, () => `fanout ${fanout.newestFirst}`, 20_000);
  });
  assert.deepEqual(fanout.newestFirst, [10, 9, 8, 7, 6, 5, 4, 3, 2, 1].map((i) => i * i));
  assert.deepEqual([...fanout.last].sort((a, b) => a - b), [121, 144]);
});

test('a call whose target is down is aborted by the callers\' agreement', async () => {
  const { configs, addrs } = await members([4, 1], 5);
  const outcomes = [];
  const impatient = () => ({
    async run(group) {
      group.setAbortPolicy(200, 1);
      try {
        outcomes.push(await group.invoke(1, le(1)).get());
      } catch (e) {
        outcomes.push(e instanceof CallAborted ? 'aborted' : e);
      }
    },
    snapshot: () => Buffer.alloc(0),
    restore() {},
  });
  // The target group's only member never starts.
  await running([0, 1, 2, 3].map((i) => new Member(configs[i], addrs, impatient())), async () => {
    await eventually(() => outcomes.length === 4, () => `outcomes ${outcomes}`, 20_000);
  });
  assert.deepEqual(outcomes, ['aborted', 'aborted', 'aborted', 'aborted']);
});

const binary = phalanxd();
const skip = binary ? false : 'phalanxd not built (cargo build -p phalanx-host --bin phalanxd, or set PHALANXD)';

test('a JavaScript ledger member in a group of phalanxd members, another ledger member down', { skip }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'phalanx-node-perpetual-'));
  const base = await freePortBlock(8);
  execFileSync(binary, ['keygen', '--protocol', 'perpetual', '--groups', '4,4', '--ops', '40', '--dir', dir, '--insecure-test-crypto', '--base-port', String(base), '--metrics-base-port', '0'], { timeout: 60_000 });
  const config = path.join(dir, 'cluster.toml');
  // Checkpoints within the 80 batches served (by default one every 128).
  fs.writeFileSync(config, fs.readFileSync(config, 'utf8').replace('[params]\n', '[params]\ncheckpoint_interval = 32\n'));
  const cluster = phalanx.ClusterFile.load(config);
  // Member 6, a ledger member, stays down: the ledger group's checkpoints need the
  // JavaScript member's vote, so they become stable only if its executor state is
  // phalanxd's bytes.
  const procs = [0, 1, 2, 3, 4, 5].map((id) => {
    const log = fs.openSync(path.join(dir, `member-${id}.log`), 'a');
    return spawn(binary, ['run', '--config', config, '--id', String(id)], { stdio: ['ignore', log, log] });
  });
  const ledger = new Ledger();
  const member = new Member(cluster.nodeConfig(7), cluster.replicas, ledger);
  try {
    await running([member], async () => {
      await eventually(() => ledger.served === 80 && ledger.balance === 0, () => `served ${ledger.served}, balance ${ledger.balance}`, 60_000);
      await eventually(() => Number(member.status().stable) > 0, () => 'no stable checkpoint', 20_000);
    });
    assert.equal(ledger.restores, 0);
  } finally {
    for (const p of procs) p.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

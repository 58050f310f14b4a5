#!/usr/bin/env node
// A replicated counter whose application is JavaScript: four PBFT replicas in this
// process (on loopback, phalanxd's framing, f = 1), a client adding to it, then the
// primary stopped: the others change view and go on, and every live replica agrees.
//
//     node examples/node/counter.js
'use strict';
const net = require('node:net');
const phalanx = require('phalanx');

const MS = 1_000_000;

/** The replicated state machine: deterministic, with a snapshot for checkpoints. */
class Counter {
  value = 0;
  execute(op) {
    this.value += Number(op.toString());
    return Buffer.from(String(this.value));
  }
  query() {
    return Buffer.from(String(this.value));
  }
  snapshot() {
    return Buffer.from(String(this.value));
  }
  restore(snapshot) {
    this.value = Number(snapshot.toString());
  }
}

async function freePorts(count) {
  const servers = await Promise.all(Array.from({ length: count }, () => new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => resolve(s));
  })));
  const ports = servers.map((s) => s.address().port);
  await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
  return ports;
}

function table(replicas, stopped) {
  for (const r of replicas) {
    const s = r.status();
    const state = stopped.has(r.id) ? 'stopped' : `view ${s.view}${s.primary ? ' (primary)' : ''}, executed batch ${s.executed}, value ${r.app.value}`;
    console.log(`  replica ${r.id}: ${state}`);
  }
}

async function main() {
  const configs = phalanx.generateCluster({
    f: 1, protocol: 'pbft', clients: 1, seed: 7, crypto: 'real',
    params: { request_timeout_ns: 300 * MS, client_retry_ns: 100 * MS },
  });
  const ports = await freePorts(4);
  const addresses = ports.map((port, id) => ({ id, host: '127.0.0.1', port }));
  const replicas = [0, 1, 2, 3].map((id) => new phalanx.Replica(configs[id], addresses, new Counter()));
  const client = new phalanx.Client(configs[4], addresses, { timeout: 20_000 });
  const stopped = new Set();
  try {
    for (const r of replicas) await r.start();
    for (let i = 1; i <= 10; i++) await client.execute(Buffer.from('1'));
    console.log(`10 increments: ${await client.read(Buffer.from('get'))} (a read, answered by 2f+1 replicas)`);
    table(replicas, stopped);

    const primary = replicas.find((r) => r.status().primary);
    console.log(`\nstopping replica ${primary.id}, the primary`);
    await primary.stop();
    stopped.add(primary.id);
    const started = performance.now();
    const after = await client.execute(Buffer.from('1'));
    console.log(`the next increment took ${(performance.now() - started).toFixed(0)} ms (a view change): ${after}`);
    for (let i = 0; i < 9; i++) await client.execute(Buffer.from('1'));
    const live = replicas.filter((r) => !stopped.has(r.id));
    await new Promise((r) => setTimeout(r, 100));
    table(replicas, stopped);
    const values = new Set(live.map((r) => r.app.value));
    const views = new Set(live.map((r) => r.status().view));
    if (values.size !== 1 || !values.has(20) || views.size !== 1) throw new Error(`the live replicas disagree: values ${[...values]}, views ${[...views]}`);
    console.log(`\nagreement: replicas ${live.map((r) => r.id).join(', ')} all hold 20, in view ${[...views][0]}`);
  } finally {
    await client.close();
    for (const r of replicas) await r.stop();
  }
}

main().catch((e) => {
  console.error(`error: ${e.message}`);
  process.exit(1);
});

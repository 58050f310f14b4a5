#!/usr/bin/env node
// A key-value client of a phalanxd cluster: put, get, compare-and-swap, an unordered
// read and delete, each answered by a quorum of replicas.
//
//     phalanxd keygen --dir mycluster --f 1 --clients 1 && (run its 4 replicas)
//     node examples/node/kv_client.js mycluster/cluster.toml
'use strict';
const phalanx = require('phalanx');

async function main(file) {
  // Its request-number lease lives in data/client-<id> beside the file, as phalanxd client's does.
  const client = phalanx.Client.fromClusterFile(file, { timeout: 10_000 });
  const b = (s) => Buffer.from(s);
  const show = (v) => (v === null ? '(absent)' : v.toString());
  try {
    console.log(`client ${client.id} of ${file}`);
    console.log('put greeting hello  ->', show(await client.put(b('greeting'), b('hello'))));
    console.log('get greeting        ->', show(await client.get(b('greeting'))));
    const swapped = await client.cas(b('greeting'), b('hello'), b('bonjour'));
    console.log('cas hello->bonjour  ->', swapped.swapped ? 'swapped' : 'not swapped', `(was ${show(swapped.before)})`);
    const failed = await client.cas(b('greeting'), b('hello'), b('hola'));
    console.log('cas hello->hola     ->', failed.swapped ? 'swapped' : 'not swapped', `(was ${show(failed.before)})`);
    const read = phalanx.kv.decodeValue(await client.read(phalanx.kv.get(b('greeting'))));
    console.log('read greeting       ->', show(read), '(2f+1 matching answers, not ordered)');
    const started = performance.now();
    await Promise.all(Array.from({ length: 100 }, (_, i) => client.put(b(`key-${i}`), b(`value-${i}`))));
    console.log(`100 concurrent puts  -> ${(performance.now() - started).toFixed(0)} ms`);
    console.log('delete greeting     ->', show(await client.delete(b('greeting'))));
    console.log('get greeting        ->', show(await client.get(b('greeting'))));
  } finally {
    await client.close();
  }
}

const file = process.argv[2];
if (!file) {
  console.error('usage: node examples/node/kv_client.js CLUSTER_TOML');
  process.exit(2);
}
main(file).catch((e) => {
  console.error(`error: ${e.message}${e.code ? ` (${e.code})` : ''}`);
  process.exit(1);
});

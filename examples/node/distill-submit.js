#!/usr/bin/env node
// Broadcasts messages through a distillation deployment's brokers, as `phalanxd client
// submit` does: one of its generated directory's clients, printing each message's
// delivery height.
//
//     phalanxd keygen --protocol distill --dir dcluster --clients 1000 --brokers 2
//     (run its 4 servers and 2 brokers: see the README's "Distillation on real processes")
//     node examples/node/distill-submit.js dcluster/cluster.toml hello world
//
// `--index N` picks the directory's client (default 0).
'use strict';
const { parseArgs } = require('node:util');
const phalanx = require('phalanx');

async function main(file, index, messages) {
  // Its seq range lives in data/client-<id> beside the file, as phalanxd client's does.
  const client = phalanx.DistillClient.fromClusterFile(file, { index, timeout: 30_000 });
  try {
    for (const message of messages) {
      const { height, seq } = await client.submit(message);
      console.log(`${JSON.stringify(message)}: delivered at height ${height} (seq ${seq})`);
    }
  } finally {
    await client.close();
  }
}

const { values, positionals: [file, ...messages] } = parseArgs({ options: { index: { type: 'string', default: '0' } }, allowPositionals: true });
const index = Number(values.index);
if (!file || messages.length === 0 || !Number.isInteger(index) || index < 0) {
  console.error('usage: node examples/node/distill-submit.js [--index N] CLUSTER_TOML MESSAGE...');
  process.exit(2);
}
main(file, index, messages).catch((e) => {
  console.error(`error: ${e.message}${e.code ? ` (${e.code})` : ''}`);
  process.exit(1);
});

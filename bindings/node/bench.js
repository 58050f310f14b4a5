#!/usr/bin/env node
// Benchmark (not a test): inputs per second through the JavaScript API — single
// `handle` + `drain` calls, and the batch form `handleMany` — against the same traces
// replayed by the core alone in Rust (`Trace.timeNative`), with their ratios and the
// geometric mean over the traces.
//
//     node bindings/node/bench.js [TRACE ...] [--seconds S]
//
// Defaults to every trace in tests/traces/. Pin it for steadier figures:
// `taskset -c 1 node bindings/node/bench.js`.
'use strict';
const fs = require('node:fs');
const path = require('node:path');
const phalanx = require('phalanx');

const args = process.argv.slice(2);
const at = args.indexOf('--seconds');
const seconds = at >= 0 ? Number(args.splice(at, 2)[1]) : 1;
const traces = args.length > 0 ? args : fs.readdirSync(path.join(__dirname, '..', '..', 'tests', 'traces'))
  .filter((f) => f.endsWith('.trace')).sort().map((f) => path.join(__dirname, '..', '..', 'tests', 'traces', f));

/** The fastest of repeated runs of `run` (seconds) within about `budget` seconds. */
function best(run, budget) {
  let min = Infinity;
  const end = performance.now() + budget * 1000;
  do min = Math.min(min, run()); while (performance.now() < end);
  return min;
}

/** Nodes fed one after the other in each timed run, made beforehand (untimed), as `timeNative` does. */
const NODES = 8;

function nodes(trace) {
  return Array.from({ length: NODES }, () => new phalanx.Node(trace.nodeConfig));
}

function single(trace, records) {
  const made = nodes(trace);
  const started = performance.now();
  for (const node of made) {
    for (const r of records) {
      try {
        node.handle(r.now, r.input);
      } catch {
        // Refused as recorded.
      }
      node.drain();
    }
  }
  return (performance.now() - started) / 1000;
}

function batch(trace, records) {
  const made = nodes(trace);
  const started = performance.now();
  for (const node of made) node.handleMany(records, []);
  return (performance.now() - started) / 1000;
}

const geomean = (xs) => Math.exp(xs.reduce((s, x) => s + Math.log(x), 0) / xs.length);
const fmt = (x) => Math.round(x).toLocaleString('en-US').padStart(12);
console.log(`${NODES} fresh nodes per timed run, the best of about ${seconds} s of runs per figure\n`);
console.log(`${'trace'.padEnd(46)} ${'inputs'.padStart(6)} ${'rust in/s'.padStart(12)} ${'single in/s'.padStart(12)} ${'batch in/s'.padStart(12)} ${'single'.padStart(7)} ${'batch'.padStart(7)}`);
const ratios = { single: [], batch: [] };
const total = { inputs: 0, rust: 0, single: 0, batch: 0 };
for (const file of traces) {
  const trace = phalanx.Trace.load(file);
  const records = trace.records;
  const n = records.length * NODES;
  const rust = best(() => trace.timeNative(NODES), seconds);
  const s = best(() => single(trace, records), seconds);
  const b = best(() => batch(trace, records), seconds);
  ratios.single.push(rust / s);
  ratios.batch.push(rust / b);
  Object.assign(total, { inputs: total.inputs + n, rust: total.rust + rust, single: total.single + s, batch: total.batch + b });
  console.log(`${path.basename(file).padEnd(46)} ${String(n).padStart(6)} ${fmt(n / rust)} ${fmt(n / s)} ${fmt(n / b)} ${(rust / s).toFixed(2).padStart(6)}x ${(rust / b).toFixed(2).padStart(6)}x`);
}
const [r, s, b] = [total.rust, total.single, total.batch].map((t) => total.inputs / t);
console.log(`${`ALL (${traces.length} traces)`.padEnd(46)} ${String(total.inputs).padStart(6)} ${fmt(r)} ${fmt(s)} ${fmt(b)} ${(s / r).toFixed(2).padStart(6)}x ${(b / r).toFixed(2).padStart(6)}x`);
const [gs, gb] = [geomean(ratios.single), geomean(ratios.batch)];
console.log(`${'geometric mean of the per-trace ratios'.padEnd(46)} ${''.padStart(6)} ${''.padStart(12)} ${''.padStart(12)} ${''.padStart(12)} ${gs.toFixed(2).padStart(6)}x ${gb.toFixed(2).padStart(6)}x`);
console.log(`\ninputs/s: Rust ${Math.round(r).toLocaleString('en-US')}; JavaScript single calls ${Math.round(s).toLocaleString('en-US')} (${gs.toFixed(2)}x Rust, geometric mean); ` +
  `handleMany ${Math.round(b).toLocaleString('en-US')} (${gb.toFixed(2)}x Rust, geometric mean; target >= 0.5x)`);

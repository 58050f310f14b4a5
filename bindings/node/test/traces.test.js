'use strict';
// Every reference trace in tests/traces/ replays through the JavaScript API (record by
// record, and round by round through handleMany) with the summary and digest `phalanxd trace
// replay` prints for it.
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const phalanx = require('phalanx');
const { TRACES, phalanxd } = require('./helpers');

const files = fs.readdirSync(TRACES).filter((f) => f.endsWith('.trace')).sort().map((f) => path.join(TRACES, f));

/** What `phalanxd trace replay` prints for each file: path → summary. */
function phalanxdSummaries() {
  const bin = phalanxd();
  if (!bin) return null;
  const out = execFileSync(bin, ['trace', 'replay', ...files], { encoding: 'utf8' });
  return new Map(out.trim().split('\n').map((line) => {
    const at = line.indexOf(': ');
    return [line.slice(0, at), line.slice(at + 2)];
  }));
}

test('there are traces', () => assert.ok(files.length >= 10, `no traces found in ${TRACES}`));

const reference = phalanxdSummaries();

for (const file of files) {
  test(`${path.basename(file)} replays through the JavaScript API`, (t) => {
    const trace = phalanx.Trace.load(file);
    assert.ok(trace.length > 0);
    const native = trace.replayNative();
    if (reference) assert.equal(native.text, reference.get(file), 'the core in-process and phalanxd agree');
    else t.diagnostic('phalanxd not built: compared with the core in-process only');
    const single = trace.replay();
    assert.equal(single.text, reference?.get(file) ?? native.text);
    assert.equal(single.digest, native.digest);
    assert.equal(single.records, trace.length);
    const batch = trace.replay({ batch: true });
    assert.equal(batch.text, single.text);

    // By hand, to show the records' shape: plain objects discriminated by `type`.
    const node = new phalanx.Node(trace.nodeConfig);
    for (const r of trace) {
      assert.equal(typeof r.now, 'bigint');
      assert.equal(typeof r.input.type, 'string');
      try {
        node.handle(r.now, r.input);
        assert.equal(r.error, undefined);
      } catch (e) {
        assert.ok(e instanceof phalanx.HandleError);
        assert.equal(e.message, r.error);
      }
      if (r.deferred) continue; // its round's outputs come with the round's last record
      assert.deepEqual([...node], r.outputs);
      assert.equal(node.pollTimeout(), r.nextTimeout ?? null);
    }
  });
}

test('a replay that diverges says where', () => {
  const trace = phalanx.Trace.load(files.find((f) => f.includes('pbft-n4f1-normal-backup')));
  const other = phalanx.Trace.load(files.find((f) => f.includes('pbft-n4f1-view-change-backup')));
  // This trace's records replayed on another node's configuration.
  Object.defineProperty(trace, 'nodeConfig', { value: other.nodeConfig });
  assert.throws(() => trace.replay(), (e) => e instanceof phalanx.DivergenceError && e.code === 'PHALANX_DIVERGENCE' && /record \d+/.test(e.message));
  assert.throws(() => trace.replay({ batch: true }), phalanx.DivergenceError);
  assert.throws(() => phalanx.Trace.parse(fs.readFileSync(files[0]).subarray(0, 7)), (e) => e instanceof phalanx.TraceError && e.code === 'PHALANX_TRACE');
  assert.throws(() => phalanx.Trace.load('/nonexistent.trace'), (e) => e instanceof phalanx.PhalanxError && e.code === 'PHALANX_IO');
  assert.match(other.dump(), /^phalanx-trace version 3/);
});

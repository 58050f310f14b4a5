// The Phalanx component under Node.js, transpiled by jco: every trace in tests/traces
// replays inside it exactly as in the native core (`phalanxd trace replay`).
// Run by scripts/test-jco, which sets PHALANX_JCO_DIR (the transpiled component) and
// PHALANXD (the native binary).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFile, readdir } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";

import protobuf from "protobufjs";

import * as hostCrypto from "./host-crypto.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const tracesDir = path.join(here, "..", "traces");
const jcoDir = process.env.PHALANX_JCO_DIR;
const phalanxd = process.env.PHALANXD;
assert.ok(jcoDir && phalanxd, "run through scripts/test-jco (PHALANX_JCO_DIR and PHALANXD)");

const { instantiate } = await import(path.join(jcoDir, "phalanx.js"));
// The component's only import: no WASI shim is needed.
const imports = { "phalanx:node/host-crypto": hostCrypto };
const component = await instantiate(
  async (file) => WebAssembly.compile(await readFile(path.join(jcoDir, file))),
  imports,
);
const { node } = component;

// The boundary's vocabulary, read from the core's .proto file as any language would.
const pb = protobuf.loadSync(path.join(here, "..", "..", "core", "proto", "phalanx.proto")).lookup("phalanx.v1");
const InputBatch = pb.lookup("InputBatch");
const RoundRecord = pb.lookup("RoundRecord");
const asObject = { longs: Number, enums: String, bytes: Uint8Array, oneofs: true, defaults: false };

// One round through a machine: `inputs` are InputRecord objects, all at time 0; returns
// the results and outputs as plain objects (`{ kind: "send", send: { to, bytes } }`).
function run(machine, ...inputs) {
  const batch = InputBatch.encode(InputBatch.fromObject({ inputs: inputs.map((input) => ({ now: 0, input })) }));
  const round = RoundRecord.toObject(RoundRecord.decode(machine.run(batch.finish())), asObject);
  return { results: round.results ?? [], outputs: round.outputs ?? [] };
}

function nativeReplay(file) {
  const out = execFileSync(phalanxd, ["trace", "replay", file], { encoding: "utf8" }).trim();
  return out.slice(out.indexOf(": ") + 2);
}

// A varint and the length-delimited message after it.
function delimited(bytes, at) {
  let len = 0, shift = 0, b;
  do { b = bytes[at++]; len += (b & 0x7f) * 2 ** shift; shift += 7; } while (b & 0x80);
  return [bytes.subarray(at, at + len), at + len];
}

// The node_config (field 3) of a trace's header, the file's first message.
function nodeConfig(trace) {
  const [header] = delimited(trace, 0);
  for (let at = 0; at < header.length;) {
    const key = header[at++];
    if ((key & 7) === 2) {
      const [value, next] = delimited(header, at);
      if (key >> 3 === 3) return value;
      at = next;
    } else {
      do { } while (header[at++] & 0x80); // a varint field
    }
  }
  throw new Error("the trace header has no node_config");
}

// A machine for the node a trace was recorded at.
async function machineOf(trace) {
  return node.Machine.create(nodeConfig(await readFile(path.join(tracesDir, trace))));
}

// A round, then one more with each persist acknowledged as durable (the client's requests
// leave once their lease record is): every output of both.
function runPersisting(machine, ...inputs) {
  const first = run(machine, ...inputs);
  const acks = first.outputs.filter((o) => o.kind === "persist").map((o) => ({ persisted: { token: o.persist.token } }));
  return first.outputs.concat(run(machine, ...acks).outputs);
}

const traces = (await readdir(tracesDir)).filter((f) => f.endsWith(".trace")).sort();

test("there are traces to replay", () => assert.ok(traces.length > 0));

for (const name of traces) {
  test(`${name} replays in the component as in the native core`, async () => {
    const file = path.join(tracesDir, name);
    assert.equal(node.replay(await readFile(file)), nativeReplay(file));
  });
}

test("a machine driven from JavaScript sends a request once its lease is persisted", async () => {
  const client = await machineOf("pbft-n4f1-client.trace");
  assert.equal(client.nextRequest(), 1n);
  const outputs = runPersisting(client, { request: { submit: { op: new TextEncoder().encode("op") } } });
  const sends = outputs.filter((o) => o.kind === "send");
  assert.ok(sends.length >= 1, `the request goes out: ${JSON.stringify(outputs.map((o) => o.kind))}`);
  assert.deepEqual(run(client).outputs, []);
  assert.equal(client.nextRequest(), 2n);
});

test("a read goes from a client to a replica's host as a query, and its answer back", async () => {
  // The two traces were recorded in one cluster: client 4 and replica 1.
  const client = await machineOf("pbft-n4f1-client.trace");
  const replica = await machineOf("pbft-n4f1-normal-backup.trace");
  const op = new TextEncoder().encode("get");
  const read = runPersisting(client, { request: { read: { op } } }).find((o) => o.kind === "send" && o.send.to === 1);
  const asked = run(replica, { message: { from: 4, bytes: read.send.bytes } }).outputs;
  // A replica's first input also sends its catch-up asks to the other replicas.
  assert.deepEqual(asked.filter((o) => o.kind !== "send"), [{ kind: "query", query: { client: 4, request: 1, op } }]);
  assert.deepEqual(asked.filter((o) => o.kind === "send").map((o) => o.send.to ?? 0).sort(), [0, 2, 3]);
  const answered = { answered: { client: 4, request: 1, result: new TextEncoder().encode("v") } };
  const [reply] = run(replica, answered).outputs;
  assert.equal(reply.kind, "send");
  assert.equal(reply.send.to, 4);
  // One answer of the 2f+1 = 3 a read needs: taken, nothing completes yet.
  assert.deepEqual(run(client, { message: { from: 1, bytes: reply.send.bytes } }).outputs, []);
  // Only a replica answers queries: the client refuses it, by name.
  const { results } = run(client, answered);
  assert.deepEqual(results, [{ error: { kind: "wrongRole", wrongRole: { role: 5, request: "answered" } } }]);
});

test("a bad configuration is an error, not a crash", () => {
  assert.throws(() => node.Machine.create(new Uint8Array([1, 2, 3])));
  // A round that does not decode is refused, and the machine goes on.
  const client = machineOf("pbft-n4f1-client.trace");
  return client.then((c) => {
    assert.throws(() => c.run(new Uint8Array([0xff, 0xff, 0xff])));
    assert.deepEqual(run(c).results, []);
  });
  // The component still works afterwards.
  assert.ok(node.replay instanceof Function);
});

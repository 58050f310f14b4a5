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

// The core's ReplaySummary Display text.
function show(s) {
  const hex = Buffer.from(s.digest).toString("hex");
  return `${s.records} records (${s.refused} refused), ${s.outputs} outputs (${s.sends} sends, ` +
    `${s.deliveries} deliveries, ${s.persists} persists, ${s.faults} faults, ${s.executes} executes, ` +
    `${s.queries} queries, ${s.completions} completions, ${s.restores} restores, ` +
    `${s.compactions} compactions), digest ${hex}`;
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

// Every output waiting, with each persist acknowledged as durable (the client's requests
// leave once their lease record is).
function drainPersisting(machine) {
  const outputs = machine.drain();
  for (const o of outputs.filter((o) => o.tag === "persist")) {
    machine.handle(0n, { tag: "persisted", val: o.val.token });
  }
  return outputs.concat(machine.drain());
}

const traces = (await readdir(tracesDir)).filter((f) => f.endsWith(".trace")).sort();

test("there are traces to replay", () => assert.ok(traces.length > 0));

for (const name of traces) {
  test(`${name} replays in the component as in the native core`, async () => {
    const file = path.join(tracesDir, name);
    const wasm = show(node.replay(await readFile(file)));
    assert.equal(wasm, nativeReplay(file));
  });
}

test("a machine driven from JavaScript sends a request once its lease is persisted", async () => {
  const client = await machineOf("pbft-n4f1-client.trace");
  assert.equal(client.nextRequest(), 1n);
  client.handle(0n, { tag: "request", val: { tag: "submit", val: new TextEncoder().encode("op") } });
  const outputs = drainPersisting(client);
  const sends = outputs.filter((o) => o.tag === "send");
  assert.ok(sends.length >= 1, `the request goes out: ${JSON.stringify(outputs.map((o) => o.tag))}`);
  assert.equal(client.poll(), undefined);
  assert.notEqual(client.pollTimeout(), undefined, "a retry is scheduled");
  assert.equal(client.nextRequest(), 2n);
});

test("a read goes from a client to a replica's host as a query, and its answer back", async () => {
  // The two traces were recorded in one cluster: client 4 and replica 1.
  const client = await machineOf("pbft-n4f1-client.trace");
  const replica = await machineOf("pbft-n4f1-normal-backup.trace");
  const op = new TextEncoder().encode("get");
  client.handle(0n, { tag: "request", val: { tag: "read", val: op } });
  const read = drainPersisting(client).find((o) => o.tag === "send" && o.val.peer === 1);
  replica.handle(0n, { tag: "message", val: { peer: 4, bytes: read.val.bytes } });
  assert.deepEqual(replica.drain(), [{ tag: "query", val: { client: 4, request: 1n, op } }]);
  replica.handle(0n, { tag: "answered", val: { client: 4, request: 1n, result: new TextEncoder().encode("v") } });
  const [reply] = replica.drain();
  assert.equal(reply.tag, "send");
  assert.equal(reply.val.peer, 4);
  // One answer of the 2f+1 = 3 a read needs: taken, nothing completes yet.
  client.handle(0n, { tag: "message", val: { peer: 1, bytes: reply.val.bytes } });
  assert.deepEqual(client.drain(), []);
  // Only a replica answers queries.
  assert.throws(
    () => client.handle(0n, { tag: "answered", val: { client: 4, request: 1n, result: new Uint8Array() } }),
    { payload: { tag: "wrong-role", val: { role: "publisher", request: "answered" } } },
  );
});

test("a bad configuration is an error, not a crash", () => {
  assert.throws(() => node.Machine.create(new Uint8Array([1, 2, 3])));
  // The component still works afterwards.
  assert.ok(node.replay instanceof Function);
});

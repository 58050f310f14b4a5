// A TypeScript program using the package, type-checked (strict) by types.test.js:
// the generated declarations must describe what the tests exercise.
import * as phalanx from 'phalanx';
import { Client, Node, Replica, Trace, type Input, type Output, type Application } from 'phalanx';

const configs: Buffer[] = phalanx.generateCluster({ f: 1, protocol: 'pbft', clients: 1, seed: 7n });
const node = new Node(configs[4]);
const input: Input = { type: 'submit', op: new Uint8Array([1]) };
node.handle(0n, input);
node.handle(1, { type: 'timeout' });

function describe(o: Output): string {
  switch (o.type) {
    case 'send':
      return `send ${o.bytes.length} bytes to ${o.to}`;
    case 'persist':
      return `persist token ${o.token + 1n - 1n}`;
    case 'execute':
      return `execute batch ${o.seq}: ${o.ops.map((op) => op.op.toString('hex')).join(',')}`;
    case 'completed':
      return `completed ${o.request}: ${o.result.toString()}`;
    case 'fault':
      return `fault ${o.node} ${o.kind}`;
    case 'event':
      return describeEvent(o.event);
    default:
      return o.type;
  }
}
// Perpetual: a member's executor sees agreed events and answers with inputs.
function describeEvent(e: phalanx.Event): string {
  switch (e.type) {
    case 'request':
      return `group ${e.caller} call ${e.call}: ${e.op.length} bytes`;
    case 'reply':
      return `call ${e.call + 0n} returned ${e.result.toString('hex')}`;
    case 'aborted':
      return `call ${e.call} aborted`;
    case 'checkpoint':
      return `checkpoint ${e.seq}`;
    case 'restore':
      return `restore ${e.seq}: ${e.state.length} bytes`;
  }
}
const perpetual: Input[] = [
  { type: 'call', target: 1, op: new Uint8Array([1]) },
  { type: 'respond', caller: 0, call: 1n, result: new Uint8Array() },
  { type: 'abort', call: 1n },
  { type: 'snapshot', seq: 4n, state: new Uint8Array() },
];
void perpetual;
for (const o of node) describe(o);
const deadline: bigint | null = node.pollTimeout();
const authentic: boolean = node.authentic(0, new Uint8Array());
void authentic;
const refusals: phalanx.Refusal[] = [];
const outputs: Output[] = node.handleMany([{ now: deadline ?? 0n, input: { type: 'timeout' } }], refusals);
void outputs;

try {
  node.handle(0n, { type: 'publish', topic: 0n, payload: Buffer.alloc(0), algorithm: 'bracha' });
} catch (e) {
  if (e instanceof phalanx.HandleError) console.log(e.code.toUpperCase());
}

const trace: Trace = Trace.load('x.trace');
const summary: phalanx.ReplaySummary = trace.replay({ batch: true });
const digest: string = summary.digest;
void digest;

class Counter implements Application {
  value = 0;
  execute(op: Buffer, ordered: { seq: bigint }): Uint8Array {
    this.value += op.length + Number(ordered.seq % 2n);
    return Buffer.from(String(this.value));
  }
  snapshot(): Uint8Array {
    return Buffer.from(String(this.value));
  }
  restore(snapshot: Buffer): void {
    this.value = Number(snapshot.toString());
  }
}

async function main(): Promise<void> {
  const addrs = [0, 1, 2, 3].map((id) => ({ id, host: '127.0.0.1', port: 7000 + id }));
  const replica = new Replica(configs[0], addrs, new Counter(), { storage: '/tmp/r0' });
  await replica.start();
  const view = replica.status().view;
  const viewNumber: bigint | undefined = typeof view === 'bigint' ? view : undefined;
  void viewNumber;
  const client = Client.fromClusterFile('cluster.toml', { timeout: 1000 });
  const before: Buffer | null = await client.put(Buffer.from('k'), Buffer.from('v'));
  const cas: phalanx.CasResult = await client.cas(Buffer.from('k'), before, Buffer.from('w'));
  void cas.swapped;
  const result: Buffer = await client.read(phalanx.kv.get(Buffer.from('k')));
  void result;
  const sim: phalanx.Simulation = await phalanx.simulate({ protocol: 'bracha', f: 2 });
  void sim.violations;
  await client.close();
  await replica.stop();
}
void main;

async function distill(): Promise<void> {
  const client = phalanx.DistillClient.fromClusterFile('dcluster/cluster.toml', { index: 3, dataDir: '/tmp/c3', timeout: 5000 });
  const first: phalanx.Delivered = await client.submit('hello');
  try {
    const { height, seq }: { height: bigint; seq: bigint } = await client.submit(new Uint8Array([1]), { timeout: 100 });
    void (height > first.height && seq > first.seq);
  } catch (e) {
    if (e instanceof phalanx.TimeoutError) console.log(e.code);
  }
  const ids: number = client.id - client.index;
  void ids;
  await client.close();
}
void distill;

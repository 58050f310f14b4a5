'use strict';
// Shared by the tests: the repository, free loopback ports, phalanxd, waiting.
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { spawn, execFileSync } = require('node:child_process');

/** The repository root: PHALANX_REPO (scripts/test-node runs a copy of these tests), or this tree's. */
const REPO = process.env.PHALANX_REPO ?? path.resolve(__dirname, '..', '..', '..');
const TRACES = path.join(REPO, 'tests', 'traces');
const MS = 1_000_000;

// Ports come from below the ephemeral range, as the Rust tests' `free_ports` does: a port
// the OS picks (listen on 0) lies in that range, where any process's outgoing connection
// (a node already up, dialing its peers) may take it as its source port before the node
// meant to listen on it binds.
const LOWEST_PORT = 10_000;
const handedOut = new Set();

function ephemeralStart() {
  try {
    return Number(fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]) || 32768;
  } catch {
    return 32768;
  }
}

async function isFree(port) {
  const s = net.createServer();
  const ok = await new Promise((resolve) => s.once('error', () => resolve(false)).listen(port, '127.0.0.1', () => resolve(true)));
  if (ok) await new Promise((r) => s.close(r));
  return ok;
}

/** A base port such that base..base+count-1 are free on loopback now: below the ephemeral range, and not handed out before by this process. */
async function freePortBlock(count) {
  const top = Math.max(ephemeralStart(), LOWEST_PORT + 2 * count);
  const span = top - LOWEST_PORT - count;
  let offset = (process.pid * 7919 + handedOut.size * 4) % span;
  for (let attempt = 0; attempt < Math.floor(span / count); attempt++) {
    const block = Array.from({ length: count }, (_, i) => LOWEST_PORT + offset + i);
    let ok = !block.some((p) => handedOut.has(p));
    for (let i = 0; ok && i < block.length; i++) ok = await isFree(block[i]);
    if (ok) {
      block.forEach((p) => handedOut.add(p));
      return block[0];
    }
    offset = (offset + count + 1) % span;
  }
  throw new Error(`no ${count} consecutive free loopback ports below ${top}`);
}

/** `count` distinct free loopback ports (see freePortBlock). */
async function freePorts(count) {
  const base = await freePortBlock(count);
  return Array.from({ length: count }, (_, i) => base + i);
}

/** The phalanxd binary: PHALANXD, or the debug build in CARGO_TARGET_DIR or the repository; null if none. */
function phalanxd() {
  const candidates = [
    process.env.PHALANXD,
    process.env.CARGO_TARGET_DIR && path.join(process.env.CARGO_TARGET_DIR, 'debug', 'phalanxd'),
    path.join(REPO, 'target', 'debug', 'phalanxd'),
  ].filter(Boolean);
  const found = candidates.find((c) => fs.existsSync(c)) ?? null;
  if (!found && process.env.PHALANX_REQUIRE_PHALANXD) {
    throw new Error('phalanxd not found: build it with `cargo build -p phalanx-host --bin phalanxd` (or set PHALANXD)');
  }
  return found;
}

/** phalanxd processes started on loopback from a cluster file it wrote in `dir`; each logs to `dir/<name>.log`. */
class PhalanxdCluster {
  constructor(dir) {
    this.binary = phalanxd();
    this.dir = dir;
    this.config = path.join(dir, 'cluster.toml');
    this.procs = new Map();
  }

  /**
   * `phalanxd keygen` with insecure test crypto and `args`: its `nodes` listening nodes
   * on a block of free loopback ports, and their metrics on the block after it (with
   * `metrics`; the first at `metricsBase`).
   */
  async keygen(args, { nodes = 4, metrics = false } = {}) {
    const base = await freePortBlock(metrics ? 2 * nodes : nodes);
    this.metricsBase = metrics ? base + nodes : 0;
    const ports = ['--base-port', String(base), '--metrics-base-port', String(this.metricsBase)];
    execFileSync(this.binary, ['keygen', '--dir', this.dir, '--insecure-test-crypto', ...ports, ...args], { timeout: 60_000 });
  }

  /** Replicas `ids` (`phalanxd run`), recording traces with `trace`. */
  start(ids, { trace = false } = {}) {
    for (const id of ids) {
      const args = trace ? ['--record-trace', path.join(this.dir, `traces-${id}`)] : [];
      this.#spawn(id, 'run', `replica-${id}`, args);
    }
  }

  /** Distillation brokers `ids` (`phalanxd broker`). */
  startBrokers(ids) {
    for (const id of ids) this.#spawn(id, 'broker', `broker-${id}`, []);
  }

  #spawn(id, command, name, args) {
    const log = fs.openSync(path.join(this.dir, `${name}.log`), 'a');
    this.procs.set(id, spawn(this.binary, [command, '--config', this.config, '--id', String(id), ...args], { stdio: ['ignore', log, log] }));
  }

  async kill(id) {
    const p = this.procs.get(id);
    this.procs.delete(id);
    if (p && p.exitCode === null) {
      const exited = new Promise((r) => p.once('exit', r));
      p.kill('SIGKILL');
      await exited;
    }
  }

  async stopAll() {
    for (const id of [...this.procs.keys()]) await this.kill(id);
  }

  logs() {
    return fs.readdirSync(this.dir).filter((f) => f.endsWith('.log')).map((f) => `--- ${f} ---\n${fs.readFileSync(path.join(this.dir, f), 'utf8').slice(-2000)}`).join('\n');
  }
}

/**
 * Runs `body(cluster)` on a PhalanxdCluster in a temporary directory after
 * `keygen(cluster)`; its logs go to the test's diagnostics when it fails. Its processes
 * are killed and the directory removed after.
 */
async function withPhalanxd(t, keygen, body) {
  const c = new PhalanxdCluster(fs.mkdtempSync(path.join(os.tmpdir(), 'phalanx-node-phalanxd-')));
  try {
    await keygen(c);
    await body(c);
  } catch (e) {
    t.diagnostic(c.logs());
    throw e;
  } finally {
    await c.stopAll();
    fs.rmSync(c.dir, { recursive: true, force: true });
  }
}

/** Waits until `condition()` holds (or resolves true); fails with `what()` after `timeout` ms. */
async function eventually(condition, what, timeout = 10_000) {
  const end = Date.now() + timeout;
  while (Date.now() < end && !(await condition())) await new Promise((r) => setTimeout(r, 20));
  if (!(await condition())) throw new Error(`not within ${timeout} ms: ${what()}`);
}

/** A replicated counter, with every op it executed and where it was ordered. */
class Counter {
  value = 0;
  ops = 0;
  /** [seq, client, request, op] of every op executed, in order. */
  executed = [];

  execute(op, { seq, client, request }) {
    this.ops++;
    this.executed.push([seq, client, request, op.toString()]);
    const s = op.toString();
    if (s.startsWith('add:')) this.value += Number(s.slice(4));
    return Buffer.from(String(this.value));
  }

  snapshot() {
    return Buffer.from(JSON.stringify([this.value, this.ops]));
  }

  restore(snapshot) {
    [this.value, this.ops] = JSON.parse(snapshot.toString());
  }
}

module.exports = { REPO, TRACES, MS, freePorts, freePortBlock, phalanxd, withPhalanxd, eventually, Counter };

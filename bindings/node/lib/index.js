// @ts-check
'use strict';
/**
 * Phalanx for Node.js: Byzantine-fault-tolerant broadcast and ordering.
 *
 * The sans-IO node API (`Node`, inputs and outputs as plain objects discriminated by
 * `type`) is the Rust core itself, through a napi-rs addon; on top of it `Trace` (load
 * and replay traces), `simulate`, the key-value helpers, a Promise `Client` of a PBFT
 * cluster, a `Replica` whose application is a JavaScript object, `perpetual.Member`s
 * of Perpetual groups running services written against the seed's futures API, and a
 * `DistillClient` of a distillation deployment.
 *
 * ```js
 * const phalanx = require('phalanx');
 * const configs = phalanx.generateCluster({ f: 1, protocol: 'pbft', clients: 1, seed: 7 });
 * const client = new phalanx.Node(configs[4]);
 * client.handle(0n, { type: 'submit', op: Buffer.from('op') });
 * for (const output of client) console.log(output);   // drains
 * ```
 */
const native = require('./native');
const {
  PhalanxError, ConfigError, HandleError, BackpressureError, TraceError, DivergenceError, StorageError, KvError, HostError,
  TimeoutError, guard,
} = require('./errors');
const { Node } = require('./node');
const { Trace } = require('./trace');
const { generateCluster, generatePerpetual, describeConfig, ClusterFile } = require('./config');
const kv = require('./kv');
const { KvStore } = require('./kvstore');
const { Client } = require('./client');
const { DistillClient } = require('./distill');
const { Replica } = require('./replica');
const { Wal } = require('./wal');
const perpetual = require('./perpetual');

/**
 * Runs one simulator scenario off the event loop and checks its properties.
 * @param {import('../native/index').SimulateOptions} [options]
 * @returns {Promise<import('../native/index').Simulation>}
 */
function simulate(options) {
  return guard(() => native.simulate(options));
}

/** Every fault kind an `{ type: 'fault' }` output names. @type {readonly string[]} */
const FAULT_KINDS = Object.freeze(native.faultKinds());

/**
 * The node's vocabulary and what the addon's functions take and give, generated from
 * its Rust definitions (native/index.d.ts).
 * @typedef {import('../native/index').Input} Input
 * @typedef {import('../native/index').Output} Output
 * @typedef {import('../native/index').Event} Event
 * @typedef {import('../native/index').Operation} Operation
 * @typedef {import('../native/index').Algorithm} Algorithm
 * @typedef {import('../native/index').TimedInput} TimedInput
 * @typedef {import('../native/index').Refusal} Refusal
 * @typedef {import('../native/index').Stats} Stats
 * @typedef {import('../native/index').TraceRecord} TraceRecord
 * @typedef {import('../native/index').ReplaySummary} ReplaySummary
 * @typedef {import('../native/index').ClusterOptions} ClusterOptions
 * @typedef {import('../native/index').ConfigSummary} ConfigSummary
 * @typedef {import('../native/index').ReplicaAddress} ReplicaAddress
 * @typedef {import('../native/index').KvReply} KvReply
 * @typedef {import('../native/index').SimulateOptions} SimulateOptions
 * @typedef {import('../native/index').Simulation} Simulation
 * @typedef {import('./replica').Application} Application
 * @typedef {import('./kv').CasResult} CasResult
 * @typedef {import('./distill').Delivered} Delivered
 */

module.exports = {
  Node,
  Trace,
  generateCluster,
  generatePerpetual,
  describeConfig,
  ClusterFile,
  simulate,
  kv,
  KvStore,
  Client,
  DistillClient,
  Replica,
  Wal,
  perpetual,
  FAULT_KINDS,
  PhalanxError,
  ConfigError,
  HandleError,
  BackpressureError,
  TraceError,
  DivergenceError,
  StorageError,
  KvError,
  HostError,
  TimeoutError,
};

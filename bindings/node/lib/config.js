// @ts-check
'use strict';
const native = require('./native');
const { guard } = require('./errors');

/**
 * @typedef {import('../native/index').ClusterOptions} ClusterOptions
 * @typedef {import('../native/index').ConfigSummary} ConfigSummary
 * @typedef {import('../native/index').ReplicaAddress} ReplicaAddress
 */

/**
 * Every node's encoded configuration (for `new Node(...)`), deterministic in the seed:
 * replicas (brokers) `0..n`, then clients (publishers), then subscribers. Throws
 * `ConfigError`.
 * @param {ClusterOptions} [options]
 * @returns {Buffer[]}
 */
function generateCluster(options) {
  return guard(() => native.generateCluster(options));
}

/**
 * Perpetual: every member's encoded configuration, deterministic in the seed. Groups of
 * `sizes[i]` members (f = (n-1)/3 each), ids group by group from 0; group 0 may call
 * group 1. Throws `ConfigError`.
 * @param {number[]} sizes
 * @param {import('../native/index').PerpetualOptions} [options]
 * @returns {Buffer[]}
 */
function generatePerpetual(sizes, options) {
  return guard(() => native.generatePerpetual(sizes, options));
}

/**
 * Id, role, protocol, f, crypto and the ids of every node by role.
 * @param {Uint8Array} config
 * @returns {ConfigSummary}
 */
function describeConfig(config) {
  return guard(() => native.describeConfig(config));
}

/** A cluster file written by `phalanxd keygen`, loaded by phalanxd's own code. */
class ClusterFile {
  #file;

  /** @param {import('../native/index').ClusterFile} file */
  constructor(file) {
    this.#file = file;
  }

  /** Loads `cluster.toml`; throws `ConfigError` naming the file, field and problem. @param {string} path */
  static load(path) {
    return new ClusterFile(guard(() => native.ClusterFile.load(path)));
  }

  /** @returns {string} */
  get path() {
    return this.#file.path;
  }

  /** @returns {number} */
  get f() {
    return this.#file.f;
  }

  /** @returns {string} */
  get protocol() {
    return this.#file.protocol;
  }

  /** Every replica's id and address. @returns {ReplicaAddress[]} */
  get replicas() {
    return this.#file.replicas;
  }

  /** @returns {number[]} */
  get clients() {
    return this.#file.clients;
  }

  /** The encoded configuration of node `id`. @param {number} id @returns {Buffer} */
  nodeConfig(id) {
    return guard(() => this.#file.nodeConfig(id));
  }
}

module.exports = { generateCluster, generatePerpetual, describeConfig, ClusterFile };

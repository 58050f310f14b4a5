// The package as an ES module: the same objects as `require('phalanx')`.
import phalanx from './index.js';

export const {
  Node,
  Trace,
  generateCluster,
  describeConfig,
  ClusterFile,
  simulate,
  kv,
  KvStore,
  Client,
  Replica,
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
} = phalanx;
export default phalanx;

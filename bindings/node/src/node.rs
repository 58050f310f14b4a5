//! `Node`: the core node behind its sans-IO shape. Inputs and outputs cross as the
//! core's boundary records (`lib/records.js` converts them): a round of inputs, or one,
//! goes in as one buffer, and its outputs come back as one.

use napi::bindgen_prelude::*;
use napi_derive::napi;
use phalanx_core::boundary::{self, StatusValue, stats_fields, status_fields};
use phalanx_core::wire::pb;
use phalanx_core::{Node as CoreNode, NodeConfig, Stats as CoreStats, Status};
use prost::Message;

use crate::convert::{Bytes, U64, uint8_slice, uint8_slice_mut};
use crate::{Code, Result, fail, handle_error};

/// An input `handleMany` refused: its index, the error's code and message.
#[napi(object)]
#[derive(Clone)]
pub struct Refusal {
    pub index: u32,
    pub code: String,
    pub message: String,
}

/// Outputs as an encoded `RoundRecord` (what `lib/records.js` decodes).
pub fn encode_outputs(outputs: Vec<phalanx_core::Output>) -> Bytes {
    let outputs = outputs.into_iter().map(pb::OutputRecord::from).collect();
    Bytes(pb::RoundRecord { outputs, ..Default::default() }.encode_to_vec())
}

/// The inputs of an encoded `InputBatch`; a `TypeError` if it does not decode.
pub fn input_batch(env: &Env, batch: Unknown) -> Result<Vec<(phalanx_core::Nanos, phalanx_core::Input)>> {
    let bytes = unsafe { uint8_slice(env.raw(), batch.raw()) }.map_err(crate::napi_error)?;
    boundary::decode_inputs(bytes.to_vec()).map_err(|e| fail(Code::Type, e))
}

impl Refusal {
    pub fn new(index: usize, e: phalanx_core::HandleError) -> Refusal {
        let e = handle_error(e);
        Refusal { index: index as u32, code: e.status.as_ref().to_owned(), message: e.reason }
    }
}

/// Every gauge and counter of a node by the core's names (in camelCase): flags as
/// booleans, counts as `bigint`s.
pub fn status_object<'env>(env: &'env Env, status: &Status, stats: &CoreStats) -> napi::Result<Object<'env>> {
    let mut obj = Object::new(env)?;
    for (name, value) in status_fields(status) {
        match value {
            StatusValue::Flag(b) => obj.set(camel_case(name), b)?,
            StatusValue::Count(n) => obj.set(camel_case(name), U64(n))?,
        }
    }
    for (name, n) in stats_fields(stats) {
        obj.set(camel_case(name), U64(n))?;
    }
    Ok(obj)
}

fn camel_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

/// A decoded node configuration from any `Uint8Array`.
pub fn node_config(env: &Env, config: Unknown) -> Result<NodeConfig> {
    let bytes = unsafe { uint8_slice(env.raw(), config.raw()) }.map_err(|e| fail(Code::Type, e.reason))?;
    NodeConfig::decode(bytes).map_err(|e| fail(Code::Config, e))
}

/// A Phalanx node (broker, publisher, subscriber, PBFT replica or client: the
/// configuration decides) behind the sans-IO shape: `handle(now, input)` feeds one input,
/// `poll()` drains outputs until `null`, `pollTimeout()` gives the next deadline at which
/// to feed `{ type: 'timeout' }`. Time is an input: `now` is in nanoseconds from any
/// monotonic clock.
#[napi]
pub struct Node {
    node: CoreNode,
    /// What the last `feedRaw` or `roundRaw` refused.
    refused: Vec<Refusal>,
    /// An answer that did not fit the buffer given, until `takeRaw`.
    kept: Vec<u8>,
}

#[napi]
impl Node {
    /// A node from its encoded configuration (from `generateCluster`,
    /// `ClusterFile.nodeConfig` or a trace's `nodeConfig`). Throws `ConfigError`.
    #[napi(constructor)]
    pub fn new(env: Env, #[napi(ts_arg_type = "Uint8Array")] config: Unknown) -> Result<Self> {
        let config = node_config(&env, config)?;
        Ok(Node {
            node: CoreNode::new(config).map_err(|e| fail(Code::Config, e))?,
            refused: Vec::new(),
            kept: Vec::new(),
        })
    }

    /// Feeds an encoded `InputBatch` in order (`lib/records.js` encodes it; `handle` is
    /// one input), without draining (`refused` counts the inputs refused).
    #[napi(js_name = "feedRaw")]
    pub fn feed_raw(&mut self, env: Env, #[napi(ts_arg_type = "Uint8Array")] batch: Unknown) -> Result<()> {
        self.refused.clear();
        for (i, (now, input)) in input_batch(&env, batch)?.into_iter().enumerate() {
            if let Err(e) = self.node.handle(now, input) {
                self.refused.push(Refusal::new(i, e));
            }
        }
        Ok(())
    }

    /// Feeds an encoded `InputBatch` in order as one round, then drains the node (as
    /// `feedRaw` then `drainRaw` would), in one call. Its outputs, a `RoundRecord`, go into
    /// `out` (`refused` counts the inputs refused); returns their length, which is more
    /// than `out` holds when they did not fit (then `takeRaw` gives them).
    #[napi(js_name = "roundRaw")]
    pub fn round_raw(
        &mut self,
        env: Env,
        #[napi(ts_arg_type = "Uint8Array")] batch: Unknown,
        #[napi(ts_arg_type = "Uint8Array")] out: Unknown,
    ) -> Result<u32> {
        let round = boundary::Round::run(&mut self.node, input_batch(&env, batch)?);
        self.refused = round.results.into_iter().enumerate().filter_map(|(i, r)| Some(Refusal::new(i, r.err()?))).collect();
        let outputs = round.outputs.into_iter().map(pb::OutputRecord::from).collect();
        self.answer(&env, out, &pb::RoundRecord { outputs, ..Default::default() })
    }

    /// The next output, an encoded `OutputRecord`, into `out`: its length (0: drained),
    /// as `roundRaw` answers.
    #[napi(js_name = "pollRaw")]
    pub fn poll_raw(&mut self, env: Env, #[napi(ts_arg_type = "Uint8Array")] out: Unknown) -> Result<u32> {
        match self.node.poll() {
            Some(o) => self.answer(&env, out, &pb::OutputRecord::from(o)),
            None => Ok(0),
        }
    }

    /// Every output waiting, a `RoundRecord`, into `out`, as `roundRaw` answers.
    #[napi(js_name = "drainRaw")]
    pub fn drain_raw(&mut self, env: Env, #[napi(ts_arg_type = "Uint8Array")] out: Unknown) -> Result<u32> {
        let outputs = std::iter::from_fn(|| self.node.poll()).map(pb::OutputRecord::from).collect();
        self.answer(&env, out, &pb::RoundRecord { outputs, ..Default::default() })
    }

    /// The answer that did not fit the buffer given, into `out` (as large as it said).
    #[napi(js_name = "takeRaw")]
    pub fn take_raw(&mut self, env: Env, #[napi(ts_arg_type = "Uint8Array")] out: Unknown) -> Result<u32> {
        let kept = std::mem::take(&mut self.kept);
        let out = unsafe { uint8_slice_mut(env.raw(), out.raw()) }.map_err(crate::napi_error)?;
        out.get_mut(..kept.len())
            .ok_or_else(|| fail(Code::Type, "the buffer is shorter than the answer"))?
            .copy_from_slice(&kept);
        Ok(kept.len() as u32)
    }

    /// How many inputs the last `feedRaw` or `roundRaw` refused.
    #[napi(getter)]
    pub fn refused(&self) -> u32 {
        self.refused.len() as u32
    }

    /// The inputs the last `feedRaw` or `roundRaw` refused: their index, the error's code
    /// and message.
    #[napi]
    pub fn refusals(&self) -> Vec<Refusal> {
        self.refused.clone()
    }

    /// The next deadline (ns), or `null`.
    #[napi(ts_return_type = "bigint | null")]
    pub fn poll_timeout(&self) -> Option<U64> {
        self.node.poll_timeout().map(U64)
    }

    /// PBFT client: the request number the next accepted `submit` or `read` gets.
    #[napi(ts_return_type = "bigint | null")]
    pub fn next_request(&self) -> Option<U64> {
        self.node.next_request().map(U64)
    }

    /// Whether `frame` (one frame's bytes, without its length prefix) carries a valid MAC
    /// from node `sender` to this node: how a host tells a connection of a node holding
    /// keys from a stranger's claiming its id.
    #[napi]
    pub fn authentic(&self, env: Env, sender: u32, #[napi(ts_arg_type = "Uint8Array")] frame: Unknown) -> Result<bool> {
        let bytes = unsafe { uint8_slice(env.raw(), frame.raw()) }.map_err(crate::napi_error)?;
        Ok(self.node.authentic(sender, bytes))
    }

    /// A frame (without its length prefix) carrying nothing, with this node's MAC for
    /// node `to`: what a host sends first on a connection it opens, so `to` can tell it
    /// from a stranger before it has anything to say. `null` without a key for `to`.
    #[napi(ts_return_type = "Buffer | null")]
    pub fn proof(&self, to: u32) -> Option<Bytes> {
        self.node.proof(to).map(Bytes)
    }

    #[napi(getter)]
    pub fn id(&self) -> u32 {
        self.node.id()
    }

    /// The role's name in its protocol: 'broker', 'publisher', 'subscriber' (pub/sub),
    /// 'replica' or 'client' (PBFT).
    #[napi(getter)]
    pub fn role(&self) -> &'static str {
        self.node.role().name()
    }

    /// 'pbft' or 'pubsub'.
    #[napi(getter)]
    pub fn protocol(&self) -> &'static str {
        self.node.config().cluster.protocol.name()
    }

    #[napi(getter)]
    pub fn f(&self) -> u32 {
        self.node.config().cluster.f
    }

    /// The replicas' (brokers') ids, ascending.
    #[napi(getter)]
    pub fn replica_ids(&self) -> Vec<u32> {
        self.node.config().cluster.replicas().map(|n| n.id).collect()
    }

    /// Gauges and counters for metrics (view, executed, stable, …, and the drop
    /// counters of `stats()`), by the core's names in camelCase.
    #[napi(ts_return_type = "Record<string, bigint | boolean>")]
    pub fn status<'env>(&self, env: &'env Env) -> napi::Result<Object<'env>> {
        status_object(env, &self.node.status(), self.node.stats())
    }

    /// Input dropped without fault (stale, beyond the window, unsubscribed) and
    /// requests refused at a bound.
    #[napi]
    pub fn stats(&self) -> Stats {
        let s = self.node.stats();
        Stats {
            stale: U64(s.stale),
            beyond_window: U64(s.beyond_window),
            unsubscribed: U64(s.unsubscribed),
            refused: U64(s.refused),
        }
    }
}

impl Node {
    /// Encodes `message` into `out` and returns its length; keeps it for `takeRaw` if it
    /// does not fit. The answer crosses with no allocation on the JavaScript side.
    fn answer(&mut self, env: &Env, out: Unknown, message: &impl Message) -> Result<u32> {
        let out = unsafe { uint8_slice_mut(env.raw(), out.raw()) }.map_err(crate::napi_error)?;
        let len = message.encoded_len();
        match out.get_mut(..len) {
            Some(mut into) => message.encode(&mut into).expect("room for the whole message"),
            None => self.kept = message.encode_to_vec(),
        }
        Ok(len as u32)
    }
}

/// The core's `Stats`.
#[napi(object)]
pub struct Stats {
    #[napi(ts_type = "bigint")]
    pub stale: U64,
    #[napi(ts_type = "bigint")]
    pub beyond_window: U64,
    #[napi(ts_type = "bigint")]
    pub unsubscribed: U64,
    #[napi(ts_type = "bigint")]
    pub refused: U64,
}

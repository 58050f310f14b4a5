//! `Node`: the core node behind its sans-IO shape, one JavaScript call per core call
//! (and `handleMany` for a round in one crossing).

use napi::bindgen_prelude::*;
use napi_derive::napi;
use phalanx_core::boundary::{StatusValue, stats_fields, status_fields};
use phalanx_core::{Node as CoreNode, NodeConfig, Stats as CoreStats, Status};

use crate::convert::{Input, Output, Scope, U64, uint8_slice};
use crate::{Code, Result, fail, handle_error};

/// An input and the time it is fed at (a trace record is one).
#[napi(object, object_to_js = false, object_from_js = false)]
pub struct TimedInput {
    #[napi(ts_type = "bigint")]
    pub now: U64,
    pub input: Input,
}

/// An input `handleMany` refused: its index, the error's code and message.
#[napi(object)]
pub struct Refusal {
    pub index: u32,
    pub code: String,
    pub message: String,
}

/// What `handleMany` returns: every output in order, and the inputs refused.
#[napi(object)]
pub struct Round {
    pub outputs: Vec<Output>,
    pub refused: Vec<Refusal>,
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

/// `value` as JavaScript, converted now (while a [`Scope`] holds the names).
fn to_js<'env, T: ToNapiValue>(env: &'env Env, value: T) -> Result<Unknown<'env>> {
    unsafe { Unknown::from_napi_value(env.raw(), T::to_napi_value(env.raw(), value).map_err(crate::napi_error)?) }
        .map_err(crate::napi_error)
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
}

#[napi]
impl Node {
    /// A node from its encoded configuration (from `generateCluster`,
    /// `ClusterFile.nodeConfig` or a trace's `nodeConfig`). Throws `ConfigError`.
    #[napi(constructor)]
    pub fn new(env: Env, #[napi(ts_arg_type = "Uint8Array")] config: Unknown) -> Result<Self> {
        let config = node_config(&env, config)?;
        Ok(Node { node: CoreNode::new(config).map_err(|e| fail(Code::Config, e))? })
    }

    /// Feeds one input at `now` (ns). Throws `HandleError` (`BackpressureError` when the
    /// request queue is full) for an input the caller got wrong; never for bytes from
    /// the network.
    #[napi]
    pub fn handle(
        &mut self,
        env: Env,
        #[napi(ts_arg_type = "bigint | number")] now: Unknown,
        #[napi(ts_arg_type = "Input")] input: Unknown,
    ) -> Result<()> {
        let _names = Scope::enter(&env).map_err(crate::napi_error)?;
        let now = U64::from_unknown(&env, now).map_err(crate::napi_error)?;
        let input = unsafe { Input::from_napi_value(env.raw(), input.raw()) }.map_err(crate::napi_error)?;
        self.node.handle(now.0, input.into()).map_err(handle_error)
    }

    /// Feeds every input in order and returns every output they produced, in one call.
    /// A refused input does not stop the others.
    #[napi(js_name = "handleManyRaw", ts_args_type = "inputs: Array<TimedInput>", ts_return_type = "Round")]
    pub fn handle_many_raw<'env>(&mut self, env: &'env Env, inputs: Unknown) -> Result<Unknown<'env>> {
        let _names = Scope::enter(env).map_err(crate::napi_error)?;
        let inputs =
            unsafe { Vec::<TimedInput>::from_napi_value(env.raw(), inputs.raw()) }.map_err(crate::napi_error)?;
        let mut outputs = Vec::new();
        let mut refused = Vec::new();
        for (i, TimedInput { now, input }) in inputs.into_iter().enumerate() {
            if let Err(e) = self.node.handle(now.0, input.into()) {
                refused.push(Refusal::new(i, e));
            }
            outputs.extend(std::iter::from_fn(|| self.node.poll()).map(Output::from));
        }
        to_js(env, Round { outputs, refused })
    }

    /// The next output, or `null` when drained.
    #[napi(ts_return_type = "Output | null")]
    pub fn poll<'env>(&mut self, env: &'env Env) -> Result<Unknown<'env>> {
        let _names = Scope::enter(env).map_err(crate::napi_error)?;
        to_js(env, self.node.poll().map(Output::from))
    }

    /// Every output waiting, in order.
    #[napi(ts_return_type = "Array<Output>")]
    pub fn drain<'env>(&mut self, env: &'env Env) -> Result<Unknown<'env>> {
        let _names = Scope::enter(env).map_err(crate::napi_error)?;
        to_js(env, std::iter::from_fn(|| self.node.poll()).map(Output::from).collect::<Vec<_>>())
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

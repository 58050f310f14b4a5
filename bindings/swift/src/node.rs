//! `Node`: the core's node behind the sans-IO shape, one call per input or one per round.

use std::sync::{Arc, Mutex, MutexGuard};

use phalanx_core::boundary::Round as CoreRound;
use phalanx_core::{Input, Node as CoreNode, Output, Protocol, Role, Stats, Status};

use crate::errors::{HandleError, PhalanxError};

/// An input and the time (ns, any monotonic clock) it is fed at.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct TimedInput {
    pub now: u64,
    pub input: Input,
}

/// A round's answer: for each input, `nil` or why `handle` refused it; every output the
/// node then had, in order; its next deadline.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct Round {
    pub errors: Vec<Option<HandleError>>,
    pub outputs: Vec<Output>,
    pub next_timeout: Option<u64>,
}

impl From<CoreRound> for Round {
    fn from(r: CoreRound) -> Self {
        Round {
            errors: r.results.into_iter().map(|r| r.err().map(HandleError::from)).collect(),
            outputs: r.outputs,
            next_timeout: r.next_timeout,
        }
    }
}

/// A Phalanx node (broker, publisher, subscriber, PBFT replica or client: its
/// configuration decides) behind the sans-IO shape: `handle(now:input:)` feeds one
/// input, `poll()` drains outputs until `nil`, `pollTimeout()` gives the next deadline at
/// which to feed `.timeout`. `handleMany` does a whole round in one call.
#[derive(uniffi::Object)]
pub struct Node {
    node: Mutex<CoreNode>,
}

impl Node {
    fn lock(&self) -> MutexGuard<'_, CoreNode> {
        // A panic while locked would be a core bug; the node is still what it was.
        self.node.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[uniffi::export]
impl Node {
    /// From an encoded configuration (`generateCluster`, `ClusterFile.nodeConfig`, a
    /// trace's `nodeConfig`).
    #[uniffi::constructor]
    pub fn new(config: Vec<u8>) -> Result<Arc<Self>, PhalanxError> {
        let node = CoreNode::from_config_bytes(&config).map_err(PhalanxError::config)?;
        Ok(Arc::new(Node { node: Mutex::new(node) }))
    }

    /// Feeds one input at `now` (ns).
    pub fn handle(&self, now: u64, input: Input) -> Result<(), HandleError> {
        self.lock().handle(now, input).map_err(HandleError::from)
    }

    /// The next output, or `nil` when drained.
    pub fn poll(&self) -> Option<Output> {
        self.lock().poll()
    }

    /// Every output waiting.
    pub fn drain(&self) -> Vec<Output> {
        let mut node = self.lock();
        std::iter::from_fn(|| node.poll()).collect()
    }

    /// Feeds a round of inputs in order, then drains: one crossing for all of them.
    pub fn handle_many(&self, inputs: Vec<TimedInput>) -> Round {
        let inputs = inputs.into_iter().map(|t| (t.now, t.input)).collect();
        CoreRound::run(&mut *self.lock(), inputs).into()
    }

    /// The next deadline (ns), or `nil`: feed `.timeout` once `now` reaches it.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.lock().poll_timeout()
    }

    /// PBFT client: the request number the next accepted submit or read gets.
    pub fn next_request(&self) -> Option<u64> {
        self.lock().next_request()
    }

    pub fn id(&self) -> u32 {
        self.lock().id()
    }

    pub fn role(&self) -> Role {
        self.lock().role()
    }

    pub fn protocol(&self) -> Protocol {
        self.lock().config().cluster.protocol
    }

    /// The number of faults tolerated.
    pub fn f(&self) -> u32 {
        self.lock().config().cluster.f
    }

    /// The service's replicas (pub/sub brokers, PBFT replicas), ascending.
    pub fn replica_ids(&self) -> Vec<u32> {
        self.lock().config().cluster.replicas().map(|n| n.id).collect()
    }

    /// PBFT: an `execute` asks for a snapshot every this many batches.
    pub fn checkpoint_interval(&self) -> u32 {
        self.lock().config().cluster.params.checkpoint_interval
    }

    pub fn status(&self) -> Status {
        self.lock().status()
    }

    pub fn stats(&self) -> Stats {
        self.lock().stats().clone()
    }
}

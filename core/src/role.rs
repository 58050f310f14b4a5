//! The role contract: what every role of every protocol implements, so that [`crate::Node`]
//! dispatches to any of them the same way, and a new protocol is its own module plus one
//! line in [`REGISTRY`].
//!
//! A role machine gets its inputs already sorted out: bodies of frames that passed the
//! size, decoding, sender and MAC checks ([`RoleMachine::on_message`]); its deadlines
//! ([`RoleMachine::on_timeout`]); and the requests and host answers meant for roles
//! ([`RoleMachine::on_input`]). Everything it does goes through [`Ctx`]: sends, outputs,
//! persistence (released in order, persist before send), faults, keys and quorums.

use crate::config::{ConfigError, Protocol, Role};
use crate::node::Ctx;
use crate::order::{Client, Replica};
use crate::pubsub::{Broker, Publisher, Subscriber};
use crate::wire::Opened;
use crate::{HandleError, Input, Nanos, Status};

pub(crate) trait RoleMachine: Send + Sync {
    /// A body from an authenticated frame, in frame order.
    fn on_message(&mut self, ctx: &mut Ctx, now: Nanos, msg: Opened);

    /// An input for the role: a request from the node's own application, a host's answer
    /// (`Executed`, `Answered`) or a record to recover from. Never `Message`, `Timeout`
    /// or `Persisted`, which the node handles. What the role does not take is the
    /// caller's mistake.
    fn on_input(&mut self, ctx: &mut Ctx, now: Nanos, input: Input) -> Result<(), HandleError> {
        let _ = now;
        Err(HandleError::WrongRole { role: ctx.role(), request: input.name() })
    }

    /// A deadline from [`RoleMachine::next_deadline`] passed.
    fn on_timeout(&mut self, ctx: &mut Ctx, now: Nanos) {
        let _ = (ctx, now);
    }

    fn next_deadline(&self) -> Option<Nanos> {
        None
    }

    /// Right before the node hands out outputs: what was queued to leave together leaves.
    fn before_poll(&mut self, ctx: &mut Ctx) {
        let _ = ctx;
    }

    /// Gauges beside the node's counters.
    fn status(&self, ctx: &Ctx) -> Status {
        ctx.counters
    }

    /// Protocol instances and pending items held in memory.
    fn live_instances(&self) -> usize;

    /// The request number the next accepted request gets, for roles that number them.
    fn next_request(&self) -> Option<u64> {
        None
    }
}

type Make = fn(&Ctx) -> Box<dyn RoleMachine>;

/// Which machine runs each role of each protocol.
const REGISTRY: &[(Protocol, Role, Make)] = &[
    (Protocol::PubSub, Role::Broker, |ctx| Box::new(Broker::new(ctx))),
    (Protocol::PubSub, Role::Publisher, |ctx| Box::new(Publisher::new(ctx))),
    (Protocol::PubSub, Role::Subscriber, |ctx| Box::new(Subscriber::new(ctx))),
    (Protocol::Pbft, Role::Replica, |ctx| Box::new(Replica::new(ctx))),
    (Protocol::Pbft, Role::Client, |ctx| Box::new(Client::new(ctx))),
];

/// The roles `protocol` has, in registry order.
pub fn roles(protocol: Protocol) -> impl Iterator<Item = Role> {
    REGISTRY.iter().filter(move |(p, _, _)| *p == protocol).map(|(_, r, _)| *r)
}

/// The machine for the node `ctx` describes.
pub(crate) fn make(ctx: &Ctx) -> Result<Box<dyn RoleMachine>, ConfigError> {
    let (protocol, role) = (ctx.cfg.cluster.protocol, ctx.role());
    let (_, _, make) = REGISTRY.iter().find(|(p, r, _)| (*p, *r) == (protocol, role)).ok_or_else(|| {
        let known: Vec<&str> = roles(protocol).map(Role::name).collect();
        ConfigError(format!(
            "node {}: {} has no role {:?} (its roles: {})",
            ctx.me(),
            protocol.name(),
            role.name(),
            known.join(", ")
        ))
    })?;
    Ok(make(ctx))
}

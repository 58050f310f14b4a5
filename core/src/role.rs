//! The role contract: every protocol family, its roles, and the machine that runs each,
//! in one table ([`REGISTRY`]), so that [`crate::Node`] dispatches to any role the same
//! way. A new role is its own module plus a variant and a row here; a new protocol
//! family adds a [`Protocol`] variant with its row in [`PROTOCOLS`] (and its module's
//! `mod` line in `lib.rs`).
//!
//! A role machine gets its inputs already sorted out: bodies of frames that passed the
//! size, decoding, sender and MAC checks ([`RoleMachine::on_message`]); its deadlines
//! ([`RoleMachine::on_timeout`]); and the requests and host answers meant for roles
//! ([`RoleMachine::on_input`]). Everything it does goes through [`Ctx`]: sends, outputs,
//! persistence (released in order, persist before send), faults, keys and quorums.

#[cfg(test)]
mod echo;

use crate::config::ConfigError;
use crate::distill;
use crate::node::Ctx;
use crate::order::{Client, Replica};
use crate::pubsub::{Broker, Publisher, Subscriber};
use crate::wire::Opened;
use crate::{HandleError, Input, Nanos, NodeId, Status};

/// Which protocol family a cluster runs. The discriminant is its number on the wire
/// (`ClusterConfig.protocol`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// AB, Bracha and Chain with histories: brokers, publishers, subscribers.
    PubSub = 0,
    /// PBFT total order: replicas and clients.
    Pbft = 1,
    /// Distillation (Chop Chop): servers ordering through PBFT, brokers, clients.
    Distill = 2,
    /// Perpetual (seed 002): replica groups, each ordering with PBFT, calling each other.
    Perpetual = 3,
}

/// A node's role, named as its protocol family names it. The discriminant is its number
/// on the wire (`NodeInfo.role`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Pub/sub: a replica of the service (seed 000's broker).
    Broker = 1,
    /// Pub/sub: a source of broadcasts.
    Publisher = 2,
    /// Pub/sub: a destination of broadcasts.
    Subscriber = 3,
    /// PBFT: a replica of the ordered service.
    Replica = 4,
    /// PBFT: a client of it.
    Client = 5,
    /// Distillation: a server, a PBFT replica whose application is deduplication and
    /// delivery of distilled batches.
    Server = 6,
    /// Distillation: an untrusted broker that distills clients' submissions.
    DistillBroker = 7,
    /// Distillation: a client with an id in the directory.
    DistillClient = 8,
    /// Perpetual: a member of a replica group (a PBFT replica of its group, whose
    /// application is its executor).
    Member = 9,
    /// Tests only: the toy role of [`echo`], which shows what adding a role takes.
    #[cfg(test)]
    Echo = 100,
}

/// A protocol family: its name, the role of the service's n replicas, and the role of
/// the nodes that use it (publish, or submit requests).
struct Family {
    protocol: Protocol,
    name: &'static str,
    replica: Role,
    client: Role,
}

const PROTOCOLS: &[Family] = &[
    Family { protocol: Protocol::PubSub, name: "pubsub", replica: Role::Broker, client: Role::Publisher },
    Family { protocol: Protocol::Pbft, name: "pbft", replica: Role::Replica, client: Role::Client },
    Family { protocol: Protocol::Distill, name: "distill", replica: Role::Server, client: Role::DistillClient },
    Family { protocol: Protocol::Perpetual, name: "perpetual", replica: Role::Member, client: Role::Member },
];

type Make = fn(&Ctx) -> Box<dyn RoleMachine>;

/// A role: its family, the name configuration files, the CLI and bindings use, and the
/// machine that runs it.
struct RoleEntry {
    protocol: Protocol,
    role: Role,
    name: &'static str,
    make: Make,
}

const REGISTRY: &[RoleEntry] = &[
    RoleEntry {
        protocol: Protocol::PubSub,
        role: Role::Broker,
        name: "broker",
        make: |ctx| Box::new(Broker::new(ctx)),
    },
    RoleEntry {
        protocol: Protocol::PubSub,
        role: Role::Publisher,
        name: "publisher",
        make: |ctx| Box::new(Publisher::new(ctx)),
    },
    RoleEntry {
        protocol: Protocol::PubSub,
        role: Role::Subscriber,
        name: "subscriber",
        make: |ctx| Box::new(Subscriber::new(ctx)),
    },
    RoleEntry {
        protocol: Protocol::Pbft,
        role: Role::Replica,
        name: "replica",
        make: |ctx| Box::new(Replica::new(ctx)),
    },
    RoleEntry { protocol: Protocol::Pbft, role: Role::Client, name: "client", make: |ctx| Box::new(Client::new(ctx)) },
    RoleEntry {
        protocol: Protocol::Distill,
        role: Role::Server,
        name: "server",
        make: |ctx| Box::new(distill::Server::new(ctx)),
    },
    RoleEntry {
        protocol: Protocol::Distill,
        role: Role::DistillBroker,
        name: "distill-broker",
        make: |ctx| Box::new(distill::Broker::new(ctx)),
    },
    RoleEntry {
        protocol: Protocol::Distill,
        role: Role::DistillClient,
        name: "distill-client",
        make: |ctx| Box::new(distill::Client::new(ctx)),
    },
    RoleEntry {
        protocol: Protocol::Perpetual,
        role: Role::Member,
        name: "member",
        make: |ctx| Box::new(crate::perpetual::Member::new(ctx)),
    },
    #[cfg(test)]
    RoleEntry {
        protocol: Protocol::PubSub,
        role: Role::Echo,
        name: "echo",
        make: |ctx| Box::new(echo::Echo::new(ctx)),
    },
];

impl Protocol {
    pub fn all() -> impl Iterator<Item = Protocol> {
        PROTOCOLS.iter().map(|f| f.protocol)
    }

    fn family(self) -> &'static Family {
        PROTOCOLS.iter().find(|f| f.protocol == self).expect("every protocol has a row in PROTOCOLS")
    }

    /// The name configuration files and bindings use.
    pub fn name(self) -> &'static str {
        self.family().name
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::all().find(|p| p.name() == name)
    }

    pub fn number(self) -> u32 {
        self as u32
    }

    pub fn from_number(number: u32) -> Option<Self> {
        Self::all().find(|p| p.number() == number)
    }

    /// The role whose nodes are the service's n replicas.
    pub fn replica_role(self) -> Role {
        self.family().replica
    }

    /// The role of the nodes that use the service (publish, or submit requests).
    pub fn client_role(self) -> Role {
        self.family().client
    }

    /// Its roles, in registry order.
    pub fn roles(self) -> impl Iterator<Item = Role> {
        REGISTRY.iter().filter(move |e| e.protocol == self).map(|e| e.role)
    }
}

impl Role {
    pub fn all() -> impl Iterator<Item = Role> {
        REGISTRY.iter().map(|e| e.role)
    }

    fn entry(self) -> &'static RoleEntry {
        REGISTRY.iter().find(|e| e.role == self).expect("every role has a row in REGISTRY")
    }

    /// The name configuration files, the CLI and bindings use.
    pub fn name(self) -> &'static str {
        self.entry().name
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::all().find(|r| r.name() == name)
    }

    /// The protocol family it belongs to.
    pub fn protocol(self) -> Protocol {
        self.entry().protocol
    }

    pub fn number(self) -> u32 {
        self as u32
    }

    pub fn from_number(number: u32) -> Option<Self> {
        Self::all().find(|r| r.number() == number)
    }
}

pub(crate) trait RoleMachine: Send + Sync {
    /// A body from an authenticated frame, in frame order.
    fn on_message(&mut self, ctx: &mut Ctx, now: Nanos, msg: Opened);

    /// Whether this role reads frames from peers it shares no MAC key with itself
    /// ([`RoleMachine::on_unkeyed`]): distillation's, whose brokers and clients are not
    /// cluster members and sign what they send. Other roles refuse them as `BadMac`.
    fn reads_unkeyed(&self) -> bool {
        false
    }

    /// Bytes from a peer this node shares no MAC key with (untrusted, unauthenticated).
    fn on_unkeyed(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, bytes: Vec<u8>) {
        let _ = (ctx, now, from, bytes);
    }

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

/// The machine for the node `ctx` describes.
pub(crate) fn make(ctx: &Ctx) -> Result<Box<dyn RoleMachine>, ConfigError> {
    let (protocol, role) = (ctx.cfg.cluster.protocol, ctx.role());
    match REGISTRY.iter().find(|e| (e.protocol, e.role) == (protocol, role)) {
        Some(entry) => Ok((entry.make)(ctx)),
        None => Err(ConfigError(format!(
            "node {}: {} has no role {:?} (its roles: {})",
            ctx.me(),
            protocol.name(),
            role.name(),
            protocol.roles().map(Role::name).collect::<Vec<_>>().join(", ")
        ))),
    }
}

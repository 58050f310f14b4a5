//! The node API (DESIGN §2): one shape for every role and protocol.
//!
//! `handle(now, input)` feeds one input, `poll()` drains outputs until `None`, and
//! `poll_timeout()` gives the next deadline at which the host calls
//! `handle(now, Input::Timeout)`. Time is an input; the node never reads a clock.

use std::collections::VecDeque;
use std::fmt;

use crate::config::{ConfigError, NodeConfig, Role};
use crate::pubsub::{Broker, Publisher, Subscriber};
use crate::wire::{self, Keyring, Sealer, pb};

pub type NodeId = u32;
/// Nanoseconds from the host's monotonic clock.
pub type Nanos = u64;

/// Which broadcast carries a publication (seed 000 §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Algorithm {
    /// Authenticated Broadcast: two steps, no totality.
    Ab,
    /// Bracha's Reliable Broadcast: totality, O(n²) messages.
    Bracha,
    /// Chain through 2f+1 brokers: fast, blocked by one faulty member.
    Chain,
}

impl Algorithm {
    pub fn to_pb(self) -> pb::Algorithm {
        match self {
            Algorithm::Ab => pb::Algorithm::Ab,
            Algorithm::Bracha => pb::Algorithm::Bracha,
            Algorithm::Chain => pb::Algorithm::Chain,
        }
    }

    pub fn from_pb(v: i32) -> Option<Self> {
        match pb::Algorithm::try_from(v).ok()? {
            pb::Algorithm::Ab => Some(Algorithm::Ab),
            pb::Algorithm::Bracha => Some(Algorithm::Bracha),
            pb::Algorithm::Chain => Some(Algorithm::Chain),
            pb::Algorithm::Unspecified => None,
        }
    }
}

/// A request from the node's own application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Publisher: publish `payload` on `topic`.
    Publish { topic: u64, payload: Vec<u8>, algorithm: Algorithm },
    /// Subscriber: replace the topic filter.
    Subscribe { topics: Vec<u64> },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// Bytes the host received from peer `from` (untrusted).
    Message {
        from: NodeId,
        bytes: Vec<u8>,
    },
    Request(Request),
    /// A deadline from `poll_timeout` has passed.
    Timeout,
    /// The host made the record of a `Persist` output durable.
    Persisted {
        token: u64,
    },
}

/// A publication delivered to a subscriber.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub publisher: NodeId,
    pub topic: u64,
    pub seq: u64,
    pub payload: Vec<u8>,
    pub algorithm: Algorithm,
    /// Learned from a history publication rather than its own broadcast.
    pub from_history: bool,
}

/// What a peer did wrong, as evidence for the host (logged, counted, exported).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// Larger than `max_message_bytes`; dropped unread.
    Oversized,
    /// Not a valid frame or body.
    Malformed,
    /// The frame names a sender other than the peer it came from.
    ForgedSender,
    /// Missing or invalid MAC (includes unknown senders, who share no key).
    BadMac,
    /// A message this role never accepts from that sender (wrong role, step or algorithm).
    Unexpected,
    /// A Chain message whose upstream MACs do not verify.
    BadChainMac,
    /// The same sender voted for two contents in one instance.
    Equivocation,
    /// A history publication that contradicts a delivered or pending publication.
    ConflictingHistory,
    /// More streams than `max_topics_per_publisher` for one publisher.
    TooManyStreams,
}

impl FaultKind {
    pub const ALL: [FaultKind; 9] = [
        FaultKind::Oversized,
        FaultKind::Malformed,
        FaultKind::ForgedSender,
        FaultKind::BadMac,
        FaultKind::Unexpected,
        FaultKind::BadChainMac,
        FaultKind::Equivocation,
        FaultKind::ConflictingHistory,
        FaultKind::TooManyStreams,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Oversized => "oversized",
            FaultKind::Malformed => "malformed",
            FaultKind::ForgedSender => "forged_sender",
            FaultKind::BadMac => "bad_mac",
            FaultKind::Unexpected => "unexpected",
            FaultKind::BadChainMac => "bad_chain_mac",
            FaultKind::Equivocation => "equivocation",
            FaultKind::ConflictingHistory => "conflicting_history",
            FaultKind::TooManyStreams => "too_many_streams",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    Send {
        to: NodeId,
        bytes: Vec<u8>,
    },
    Deliver(Delivery),
    /// Make `record` durable, then answer `Input::Persisted { token }`.
    Persist {
        token: u64,
        record: Vec<u8>,
    },
    /// Evidence that `node` misbehaved (or that the network corrupted its bytes).
    Fault {
        node: NodeId,
        kind: FaultKind,
    },
}

/// Input the caller got wrong. Bytes from the network never produce one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandleError {
    /// The request does not fit this node's role.
    WrongRole { role: Role, request: &'static str },
    /// The publisher's queue is full: retry after deliveries progress.
    Backpressure,
    /// A parameter out of range (named).
    Invalid(String),
}

impl fmt::Display for HandleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandleError::WrongRole { role, request } => write!(f, "a {role:?} cannot handle a {request} request"),
            HandleError::Backpressure => {
                write!(f, "publish queue full: too many publications outstanding without a history")
            }
            HandleError::Invalid(why) => write!(f, "invalid input: {why}"),
        }
    }
}

impl std::error::Error for HandleError {}

/// What every role machine shares: its identity, keys, the cluster and the output queue.
pub(crate) struct Ctx {
    pub cfg: NodeConfig,
    pub keys: Keyring,
    /// Broker ids in ascending order; the first 2f+1 form the Chain.
    pub brokers: Vec<NodeId>,
    /// The brokers other than this node, for sending to all of them without a fresh list.
    other_brokers: Vec<NodeId>,
    pub n: usize,
    pub f: usize,
    pub stats: Stats,
    out: VecDeque<Output>,
}

impl Ctx {
    pub fn me(&self) -> NodeId {
        self.cfg.id
    }

    pub fn push(&mut self, o: Output) {
        self.out.push_back(o);
    }

    pub fn fault(&mut self, node: NodeId, kind: FaultKind) {
        self.out.push_back(Output::Fault { node, kind });
    }

    pub fn role_of(&self, id: NodeId) -> Option<Role> {
        self.cfg.cluster.node(id).map(|n| n.role)
    }

    /// Sends one body to every receiver, each with its own hop MAC.
    pub fn send(&mut self, body: pb::body::Kind, to: impl IntoIterator<Item = NodeId>) {
        let sealer = Sealer::new(self.me(), body);
        self.send_sealed(&sealer, to, |keys, t, body, macs| macs.extend(keys.mac_to(t, body)));
    }

    /// Sends one body to every broker but this node, then to `also`.
    pub fn send_to_brokers(&mut self, body: pb::body::Kind, also: &[NodeId]) {
        let peers = std::mem::take(&mut self.other_brokers);
        self.send(body, peers.iter().chain(also).copied());
        self.other_brokers = peers;
    }

    /// Sends a sealed body to every receiver with the MAC entries `macs` appends for it.
    pub fn send_sealed(
        &mut self,
        sealer: &Sealer,
        to: impl IntoIterator<Item = NodeId>,
        macs: impl Fn(&Keyring, NodeId, &[u8], &mut Vec<pb::Mac>),
    ) {
        let mut entries = Vec::new();
        for t in to {
            entries.clear();
            macs(&self.keys, t, &sealer.body, &mut entries);
            let bytes = sealer.seal(&entries);
            self.out.push_back(Output::Send { to: t, bytes });
        }
    }
}

/// Counters of input dropped without fault: benign in an asynchronous network
/// (duplicates, late copies, lagging windows), but worth exporting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// For instances already finished.
    pub stale: u64,
    /// Beyond a stream's window and not yet vouched for.
    pub beyond_window: u64,
    /// For topics this subscriber does not follow.
    pub unsubscribed: u64,
}

enum RoleMachine {
    Broker(Broker),
    Publisher(Publisher),
    Subscriber(Subscriber),
}

/// A Phalanx node: one role of the publish/subscribe family (broker, publisher or
/// subscriber) behind the uniform sans-IO shape.
pub struct Node {
    ctx: Ctx,
    role: RoleMachine,
}

impl Node {
    pub fn new(cfg: NodeConfig) -> Result<Node, ConfigError> {
        cfg.validate()?;
        let me = cfg.cluster.node(cfg.id).expect("validated").clone();
        let brokers: Vec<NodeId> = cfg.cluster.brokers().map(|b| b.id).collect();
        let keys = Keyring::new(cfg.cluster.crypto, cfg.id, cfg.mac_keys.clone());
        let other_brokers = brokers.iter().copied().filter(|&b| b != cfg.id).collect();
        let ctx = Ctx {
            n: brokers.len(),
            f: cfg.cluster.f as usize,
            brokers,
            other_brokers,
            keys,
            cfg,
            stats: Stats::default(),
            out: VecDeque::new(),
        };
        let role = match me.role {
            Role::Broker => RoleMachine::Broker(Broker::new(&ctx)),
            Role::Publisher => RoleMachine::Publisher(Publisher::new(&ctx)),
            Role::Subscriber => RoleMachine::Subscriber(Subscriber::new(&ctx, me.topics.clone())),
        };
        Ok(Node { ctx, role })
    }

    /// From an encoded `NodeConfig` (what keygen writes and bindings pass).
    pub fn from_config_bytes(bytes: &[u8]) -> Result<Node, ConfigError> {
        Node::new(NodeConfig::decode(bytes)?)
    }

    pub fn id(&self) -> NodeId {
        self.ctx.me()
    }

    pub fn role(&self) -> Role {
        match self.role {
            RoleMachine::Broker(_) => Role::Broker,
            RoleMachine::Publisher(_) => Role::Publisher,
            RoleMachine::Subscriber(_) => Role::Subscriber,
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.ctx.stats
    }

    /// Broadcast instances and pending publications held in memory: bounded by the
    /// window, the stream limits and the cluster size, whatever peers send.
    pub fn live_instances(&self) -> usize {
        match &self.role {
            RoleMachine::Broker(b) => b.live_instances(),
            RoleMachine::Publisher(_) => 0,
            RoleMachine::Subscriber(s) => s.live_instances(),
        }
    }

    pub fn config(&self) -> &NodeConfig {
        &self.ctx.cfg
    }

    pub fn handle(&mut self, now: Nanos, input: Input) -> Result<(), HandleError> {
        match input {
            Input::Message { from, bytes } => {
                let max = self.ctx.cfg.cluster.params.max_message_bytes;
                match wire::open(&self.ctx.keys, from, bytes, max) {
                    Ok(msg) => match &mut self.role {
                        RoleMachine::Broker(b) => b.on_message(&mut self.ctx, msg),
                        RoleMachine::Publisher(p) => p.on_message(&mut self.ctx, now, msg),
                        RoleMachine::Subscriber(s) => s.on_message(&mut self.ctx, msg),
                    },
                    Err(kind) => self.ctx.fault(from, kind),
                }
                Ok(())
            }
            Input::Request(req) => match (&mut self.role, req) {
                (RoleMachine::Publisher(p), Request::Publish { topic, payload, algorithm }) => {
                    p.publish(&mut self.ctx, now, topic, payload, algorithm)
                }
                (RoleMachine::Subscriber(s), Request::Subscribe { topics }) => s.subscribe(&mut self.ctx, topics),
                (_, req) => Err(HandleError::WrongRole {
                    role: self.role(),
                    request: match req {
                        Request::Publish { .. } => "publish",
                        Request::Subscribe { .. } => "subscribe",
                    },
                }),
            },
            Input::Timeout => {
                if let RoleMachine::Publisher(p) = &mut self.role {
                    p.on_timeout(&mut self.ctx, now);
                }
                Ok(())
            }
            // The broadcast family keeps no durable state; nothing waits on a token.
            Input::Persisted { .. } => Ok(()),
        }
    }

    pub fn poll(&mut self) -> Option<Output> {
        self.ctx.out.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Nanos> {
        match &self.role {
            RoleMachine::Publisher(p) => p.next_deadline(),
            _ => None,
        }
    }
}

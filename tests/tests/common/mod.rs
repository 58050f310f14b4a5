//! Helpers shared by the hand-driven integration tests: a small f = 1 cluster, frame
//! decoding and forging, and a FIFO network that routes `Output::Send` between real nodes.

#![allow(dead_code)]

use std::collections::VecDeque;

use phalanx_core::crypto::CryptoMode;
use phalanx_core::wire::{self, Keyring, pb};
use phalanx_core::{
    Algorithm, ClusterSpec, Delivery, FaultKind, HandleError, Input, Nanos, Node, NodeConfig, NodeId, Output, Params,
    Request, generate_cluster,
};
use prost::Message;

/// f = 1: brokers 0..4, one publisher, two subscribers.
pub const F: usize = 1;
pub const BROKERS: [NodeId; 4] = [0, 1, 2, 3];
pub const PUBLISHER: NodeId = 4;
pub const SUB_A: NodeId = 5;
pub const SUB_B: NodeId = 6;
pub const SUBSCRIBERS: [NodeId; 2] = [SUB_A, SUB_B];

pub fn params(alpha: u32) -> Params {
    Params { alpha, ..Params::default() }
}

/// The f = 1 cluster above, insecure test crypto, subscribers following `topics`.
pub fn cluster(params: Params, topics: Vec<u64>) -> Vec<NodeConfig> {
    let spec = ClusterSpec { params, topics, crypto: CryptoMode::InsecureTest, ..ClusterSpec::new(1) };
    generate_cluster(&spec, [7; 32]).expect("valid test cluster")
}

pub fn node(cfgs: &[NodeConfig], id: NodeId) -> Node {
    Node::new(cfgs[id as usize].clone()).expect("generated configs are valid")
}

pub fn drain(node: &mut Node) -> Vec<Output> {
    std::iter::from_fn(|| node.poll()).collect()
}

/// Feeds one frame from `from` and returns every output it caused.
pub fn feed(node: &mut Node, now: Nanos, from: NodeId, bytes: &[u8]) -> Vec<Output> {
    node.handle(now, Input::Message { from, bytes: bytes.to_vec() }).expect("network bytes never make handle fail");
    drain(node)
}

pub fn request(node: &mut Node, now: Nanos, req: Request) -> Result<Vec<Output>, HandleError> {
    node.handle(now, Input::Request(req)).map(|()| drain(node))
}

pub fn publish(topic: u64, payload: &[u8], algorithm: Algorithm) -> Request {
    Request::Publish { topic, payload: payload.to_vec(), algorithm }
}

/// The body of a frame a node sent (no MAC check: the test reads its own node's output).
pub fn body_of(bytes: &[u8]) -> pb::body::Kind {
    let frame = pb::Frame::decode(bytes).expect("nodes send decodable frames");
    pb::Body::decode(&frame.body[..]).expect("decodable body").kind.expect("body has a kind")
}

/// Every body sent, with its receiver; a bundle's bodies one by one.
pub fn sends(outs: &[Output]) -> Vec<(NodeId, pb::body::Kind)> {
    let mut bodies = Vec::new();
    for o in outs {
        let Output::Send { to, bytes } = o else { continue };
        let sent = wire::bodies_of(bytes).expect("nodes send decodable frames");
        bodies.extend(sent.into_iter().map(|body| (*to, body)));
    }
    bodies
}

pub fn publications(outs: &[Output]) -> Vec<(NodeId, pb::Publication)> {
    sends(outs)
        .into_iter()
        .filter_map(|(to, b)| match b {
            pb::body::Kind::Publication(p) => Some((to, p)),
            _ => None,
        })
        .collect()
}

pub fn statuses(outs: &[Output]) -> Vec<(NodeId, pb::PubStatus)> {
    sends(outs)
        .into_iter()
        .filter_map(|(to, b)| match b {
            pb::body::Kind::Status(s) => Some((to, s)),
            _ => None,
        })
        .collect()
}

pub fn faults(outs: &[Output]) -> Vec<(NodeId, FaultKind)> {
    outs.iter()
        .filter_map(|o| match o {
            Output::Fault { node, kind } => Some((*node, *kind)),
            _ => None,
        })
        .collect()
}

pub fn deliveries(outs: &[Output]) -> Vec<Delivery> {
    outs.iter()
        .filter_map(|o| match o {
            Output::Deliver(d) => Some(d.clone()),
            _ => None,
        })
        .collect()
}

pub fn publication(
    publisher: NodeId,
    topic: u64,
    seq: u64,
    algorithm: Algorithm,
    step: pb::Step,
    history: bool,
    payload: Vec<u8>,
) -> pb::body::Kind {
    pb::body::Kind::Publication(pb::Publication {
        algorithm: algorithm.to_pb() as i32,
        step: step as i32,
        publisher,
        topic,
        seq,
        history,
        payload: payload.into(),
    })
}

pub fn status(kind: pb::PubStatusKind, topic: u64, seq: u64) -> pb::body::Kind {
    pb::body::Kind::Status(pb::PubStatus { kind: kind as i32, topic, seq })
}

/// Builds frames as node `cfg.id` with its real keys: what a Byzantine node can send
/// that authenticates as its own.
pub struct Forger {
    pub keys: Keyring,
}

impl Forger {
    pub fn new(cfg: &NodeConfig) -> Self {
        Forger { keys: Keyring::new(cfg.cluster.crypto, cfg.id, cfg.mac_keys.clone()) }
    }

    pub fn frame(&self, to: NodeId, body: &pb::body::Kind) -> Vec<u8> {
        self.raw_frame(to, wire::encode_body(body.clone()).to_vec())
    }

    /// A frame around arbitrary body bytes, validly MACed.
    pub fn raw_frame(&self, to: NodeId, body: Vec<u8>) -> Vec<u8> {
        wire::frame(self.keys.me, &body, &[self.keys.mac_to(to, &body).expect("shares a key with the receiver")])
    }
}

/// Real nodes (indexed by id) and a FIFO network between them, with optional cut links.
pub struct Net {
    pub nodes: Vec<Node>,
    pub now: Nanos,
    queue: VecDeque<(NodeId, NodeId, Vec<u8>)>,
    /// Directed links (from, to) that lose everything.
    pub cut: Vec<(NodeId, NodeId)>,
    pub delivered: Vec<(NodeId, Delivery)>,
    /// (reporter, culprit, kind).
    pub faults: Vec<(NodeId, NodeId, FaultKind)>,
}

impl Net {
    pub fn new(cfgs: &[NodeConfig]) -> Self {
        Net {
            nodes: cfgs.iter().map(|c| Node::new(c.clone()).expect("valid config")).collect(),
            now: 0,
            queue: VecDeque::new(),
            cut: Vec::new(),
            delivered: Vec::new(),
            faults: Vec::new(),
        }
    }

    pub fn request(&mut self, id: NodeId, req: Request) -> Result<(), HandleError> {
        let r = self.nodes[id as usize].handle(self.now, Input::Request(req));
        self.collect(id);
        r
    }

    pub fn timeout(&mut self, id: NodeId) {
        self.nodes[id as usize].handle(self.now, Input::Timeout).expect("timeouts never fail");
        self.collect(id);
    }

    /// Puts a frame on the network as if `from` had sent it.
    pub fn inject(&mut self, from: NodeId, to: NodeId, bytes: Vec<u8>) {
        self.queue.push_back((from, to, bytes));
    }

    fn collect(&mut self, id: NodeId) {
        while let Some(out) = self.nodes[id as usize].poll() {
            match out {
                Output::Send { to, bytes } => self.queue.push_back((id, to, bytes)),
                Output::Deliver(d) => self.delivered.push((id, d)),
                Output::Fault { node, kind } => self.faults.push((id, node, kind)),
                Output::Persist { .. }
                | Output::Execute { .. }
                | Output::Completed { .. }
                | Output::Restore { .. }
                | Output::Compact { .. }
                | Output::Query { .. }
                | Output::Delivered(_)
                | Output::Event(_) => {
                    panic!("the pub/sub family persists, executes and restores nothing")
                }
            }
        }
    }

    /// Delivers queued frames in FIFO order until none is left.
    pub fn run(&mut self) {
        while let Some((from, to, bytes)) = self.queue.pop_front() {
            if self.cut.contains(&(from, to)) || to as usize >= self.nodes.len() {
                continue;
            }
            self.nodes[to as usize]
                .handle(self.now, Input::Message { from, bytes })
                .expect("network bytes never make handle fail");
            self.collect(to);
        }
    }

    /// (topic, seq, from_history) delivered at `id`, in delivery order.
    pub fn delivered_at(&self, id: NodeId) -> Vec<(u64, u64, bool)> {
        self.delivered.iter().filter(|(at, _)| *at == id).map(|(_, d)| (d.topic, d.seq, d.from_history)).collect()
    }
}

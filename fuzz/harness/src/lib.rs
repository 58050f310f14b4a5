//! What the fuzz targets share, with no libFuzzer in it (so the corpus seeder is a
//! plain binary): the decoders by selector, and a driver that feeds one node of a fixed
//! cluster a sequence of events, sealing the fuzzer's bodies with the real keys of the
//! peer it names, so that they get past authentication and reach the protocol.
//!
//! An event is `kind (u8) | sender (u8) | advance (u8, in 100 µs) | len (u16 LE) | data`:
//! - kind % 3 = 0: `data` is an encoded `Body` from peer `sender` (any role but the node
//!   itself), sealed as that peer would seal it ([`Coalition::seal_authenticated`]: frame
//!   MAC, request authenticators, its own signatures, Chain MACs); bytes that do not
//!   decode as a body are sealed as they are;
//! - kind % 3 = 1: `data` is a raw frame from node id `sender` (known or not), unsealed;
//! - kind % 3 = 2: `data` is an encoded `InputRecord`, any API input, in any order.
//!
//! After each event the node's outputs are answered as a host would (persisted at once,
//! batches executed on a key-value store, reads answered, snapshots restored; a Perpetual
//! member's requests answered with their op and its checkpoints with their number) and a
//! due deadline fires. Anything may be refused; nothing may panic.

use std::sync::OnceLock;

use phalanx_core::crypto::CryptoMode;
use phalanx_core::host::Application;
use phalanx_core::kv::Kv;
use phalanx_core::sim::keyed::Coalition;
use phalanx_core::wire::pb;
use phalanx_core::{
    ClusterSpec, DistillSpec, Event, Input, Nanos, Node, NodeConfig, NodeId, Output, Params, PerpetualSpec, Request,
    generate_cluster, generate_distill, generate_perpetual, trace,
};
use prost::Message;

/// A cluster whose every node's secrets the harness holds.
pub struct Cluster {
    pub configs: Vec<NodeConfig>,
    coalition: Coalition,
}

impl Cluster {
    fn new(spec: ClusterSpec) -> Self {
        Cluster::with(generate_cluster(&spec, [42; 32]).expect("a valid fuzzing cluster"))
    }

    fn with(configs: Vec<NodeConfig>) -> Self {
        let everyone = configs.iter().map(|c| c.id).collect();
        let coalition = Coalition::new(&configs, everyone);
        Cluster { configs, coalition }
    }
}

/// Pub/sub, f = 1: brokers 0..4, a publisher (4), two subscribers (5, 6) following topics
/// 0 and 1; histories every 2 publications and small windows, so that bounds are met.
pub fn pubsub() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let params = Params { alpha: 2, window: 8, max_topics_per_publisher: 4, publish_queue: 4, ..Params::default() };
        Cluster::new(ClusterSpec {
            clients: 1,
            subscribers: 2,
            topics: vec![0, 1],
            params,
            crypto: CryptoMode::InsecureTest,
            ..ClusterSpec::new(1)
        })
    })
}

/// PBFT, f = 1: replicas 0..4 and clients 4, 5; checkpoints every 2 batches, so that
/// garbage collection, state transfer and view changes are within a short input.
pub fn pbft() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let params =
            Params { batch_max_count: 2, checkpoint_interval: 2, pipeline: 2, client_queue: 4, ..Params::default() };
        Cluster::new(ClusterSpec { params, crypto: CryptoMode::InsecureTest, ..ClusterSpec::pbft(1, 2) })
    })
}

/// Distillation, f = 1: servers 0..4, two brokers and four generated clients, as the
/// reference traces have them (their inputs seed the corpus); checkpoints every 2
/// batches.
pub fn distill() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let mut spec = DistillSpec::new(1, 2, 4);
        spec.params.checkpoint_interval = 2;
        spec.params.pipeline = 2;
        let configs = generate_distill(&spec, [42; 32]).expect("a valid fuzzing deployment");
        Cluster::with(configs)
    })
}

/// Perpetual: group 0 (members 0..4) calls group 1 (members 4..8), f = 1 in each, as the
/// reference traces have them; checkpoints every 2 batches.
pub fn perpetual() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let mut spec = PerpetualSpec::pair(4, 4);
        spec.crypto = CryptoMode::InsecureTest;
        spec.params.checkpoint_interval = 2;
        spec.params.pipeline = 2;
        Cluster::with(generate_perpetual(&spec, [42; 32]).expect("a valid fuzzing federation"))
    })
}

/// One event, encoded (for seeding corpora).
pub fn event(kind: u8, sender: u8, advance: u8, data: &[u8]) -> Vec<u8> {
    let len = data.len().min(u16::MAX as usize);
    let mut out = vec![kind, sender, advance];
    out.extend_from_slice(&(len as u16).to_le_bytes());
    out.extend_from_slice(&data[..len]);
    out
}

/// Most outputs answered after one event: far more than any step produces.
const MAX_OUTPUTS: usize = 100_000;

/// Feeds node `configs[index]` of `cluster` the events in `input`.
pub fn run(cluster: &Cluster, index: usize, mut input: &[u8]) {
    let cfg = cluster.configs[index].clone();
    let me = cfg.id;
    let peers: Vec<NodeId> = cluster.configs.iter().map(|c| c.id).filter(|&id| id != me).collect();
    let mut node = Node::new(cfg).expect("valid config");
    let mut app = Kv::default();
    let mut now: Nanos = 0;
    while input.len() >= 5 {
        let (kind, sender, advance) = (input[0], input[1], input[2]);
        let len = u16::from_le_bytes([input[3], input[4]]) as usize;
        let data = &input[5..(5 + len).min(input.len())];
        input = &input[(5 + len).min(input.len())..];
        now += advance as Nanos * 100_000;
        let taken = match kind % 3 {
            0 => {
                let from = peers[sender as usize % peers.len()];
                let bytes = match pb::Body::decode(data) {
                    Ok(pb::Body { kind: Some(body) }) => cluster.coalition.seal_authenticated(from, me, body),
                    _ => cluster.coalition.seal(from, me, data, vec![]),
                };
                node.handle(now, Input::Message { from, bytes: bytes.to_vec() })
            }
            1 => node.handle(now, Input::Message { from: sender as NodeId, bytes: data.to_vec() }),
            _ => match pb::InputRecord::decode(data).ok().map(trace::input_from_pb) {
                Some(Ok(input)) => node.handle(now, input),
                _ => Ok(()),
            },
        };
        if kind % 3 != 2 {
            assert!(taken.is_ok(), "bytes from the network refused as the caller's error: {taken:?}");
        }
        if node.poll_timeout().is_some_and(|t| t <= now) {
            node.handle(now, Input::Timeout).expect("a timeout is always taken");
        }
        answer(&mut node, &mut app, now);
    }
}

/// Answers the node's outputs as a host would, until it has none left.
fn answer(node: &mut Node, app: &mut Kv, now: Nanos) {
    for _ in 0..MAX_OUTPUTS {
        let Some(output) = node.poll() else { return };
        // Refusals are the node's to make: a host that answers late or twice is allowed.
        let _ = match output {
            Output::Persist { token, .. } => node.handle(now, Input::Persisted { token }),
            Output::Execute { seq, ops, snapshot } => {
                let results = Application::execute(app, seq, &ops);
                node.handle(
                    now,
                    Input::Executed { seq, results, snapshot: snapshot.then(|| Application::snapshot(app)) },
                )
            }
            Output::Query { client, request, op } => match Application::query(app, &op) {
                Some(result) => node.handle(now, Input::Answered { client, request, result }),
                None => Ok(()),
            },
            Output::Restore { seq, snapshot } => Application::restore(app, seq, &snapshot)
                .map_err(|_| phalanx_core::HandleError::Invalid("the host could not restore the snapshot".into())),
            Output::Event(Event::Request { caller, call, op }) => {
                node.handle(now, Input::Request(Request::Respond { caller, call, result: op }))
            }
            Output::Event(Event::Checkpoint { seq }) => {
                node.handle(now, Input::Request(Request::Snapshot { seq, state: seq.to_le_bytes().to_vec() }))
            }
            _ => Ok(()),
        };
    }
    panic!("a node produced more than {MAX_OUTPUTS} outputs for one input");
}

/// The decoders, picked by `input[0]`, each fed the rest: every one must be total.
pub fn decode(input: &[u8]) {
    let Some((&which, bytes)) = input.split_first() else { return };
    match which % 9 {
        0 => drop(phalanx_core::wire::bodies_of(bytes)),
        1 => drop(phalanx_core::kv::Op::decode(bytes)),
        2 => drop(phalanx_core::kv::Reply::decode(bytes)),
        3 => drop(Kv::restore(bytes)),
        4 => drop(NodeConfig::decode(bytes)),
        5 => drop(phalanx_core::boundary::decode_inputs(bytes.to_vec())),
        6 => drop(phalanx_core::boundary::Round::decode(bytes.to_vec())),
        7 => drop(phalanx_core::boundary::decode_status(bytes)),
        _ => {
            if let Ok(record) = pb::OutputRecord::decode(bytes) {
                drop(trace::output_from_pb(record));
            }
        }
    }
}

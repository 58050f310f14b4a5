//! Byzantine behaviours. A Byzantine node runs the real protocol with its real keys; its
//! behaviour rewrites each frame it sends. Rewritten frames are re-MACed with the node's
//! own keys (and what it signs, re-signed), so they authenticate as coming from it: the
//! protocols, not the MACs, must catch the lie. Faulty nodes collude ([`super::keyed`]):
//! the keyed behaviours also sign and MAC with the other faulty nodes' keys, whatever
//! their role. Correct nodes' MACs and signatures cannot be forged.

use bytes::Bytes;
use prost::Message;

use super::keyed::{Coalition, Forge, Pool};
use super::{NetConfig, Rng};
use crate::wire::{self, pb};
use crate::{Algorithm, Nanos, NodeId};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behavior {
    Correct,
    /// Sends nothing.
    Silent,
    /// Sends only to these nodes.
    OnlyTo(Vec<NodeId>),
    /// Drops what it sends to these nodes (seed 000's omit mode).
    DropTo(Vec<NodeId>),
    /// Alters one field of what it sends to these nodes, chosen at random per frame, and
    /// MACs the result validly (seed 000 §6.7's alter mode).
    AlterTo(Vec<NodeId>),
    /// Sends one content to even node ids and another to odd ones.
    Equivocate,
    /// Flips a bit in every MAC it sends: those it makes inside a body (a request's
    /// authenticator, a Perpetual result's MACs for the callers) in a validly sealed
    /// frame, else the frame's.
    CorruptMacs,
    /// Also sends, now and then, a frame it sent or received earlier.
    Replay,
    /// Claims to be this other node, at the transport and in the frame.
    ForgeSender(NodeId),
    /// Changes one field of every body it sends to these nodes, any field of any kind,
    /// sealed and signed validly by the coalition ([`super::keyed::Forge::rewrite`]).
    Lie(Vec<NodeId>),
    /// Runs the protocol, and sends this many bodies of any kind its role may or may not
    /// send, invented from what the coalition saw, at random times to random nodes
    /// ([`super::keyed::Forge::invent`]).
    Inject(u32),
    /// Publisher: sends each of its publications to each listed broker by the listed
    /// algorithm (Chain to the chain's head), with the payload it published or, where
    /// marked, one of that algorithm's own. A broker listed twice gets two versions.
    Mix(Vec<(NodeId, Algorithm, bool)>),
    /// PBFT replica: each time its node executes a batch, relays a NEW-VIEW for the next
    /// view it is primary of, made of the coalition's VIEW-CHANGEs (clients' among them)
    /// claiming nothing prepared, then proposes empty batches at the slots just
    /// committed. A replica that took it would re-decide committed slots.
    Hijack,
}

impl Behavior {
    /// Whether a node behaving so joins the coalition, lending the other faulty nodes its
    /// keys. A node that only omits messages (the experiments model a lossy link or a
    /// crashed node so) lies about nothing and keeps its keys.
    pub fn colludes(&self) -> bool {
        !matches!(self, Behavior::Correct | Behavior::Silent | Behavior::OnlyTo(_) | Behavior::DropTo(_))
    }

    /// Short label for reports.
    pub fn label(&self) -> String {
        match self {
            Behavior::Correct => "correct".into(),
            Behavior::Silent => "silent".into(),
            Behavior::OnlyTo(to) => format!("only-to{to:?}"),
            Behavior::DropTo(to) => format!("drop-to{to:?}"),
            Behavior::AlterTo(to) => format!("alter-to{to:?}"),
            Behavior::Equivocate => "equivocate".into(),
            Behavior::CorruptMacs => "corrupt-macs".into(),
            Behavior::Replay => "replay".into(),
            Behavior::ForgeSender(id) => format!("forge-sender-as-{id}"),
            Behavior::Lie(to) => format!("lie-to{to:?}"),
            Behavior::Inject(budget) => format!("inject{budget}"),
            Behavior::Hijack => "hijack".into(),
            Behavior::Mix(plan) => {
                let to: Vec<String> =
                    plan.iter().map(|(b, alg, own)| format!("{b}:{alg:?}{}", if *own { "*" } else { "" })).collect();
                format!("mix[{}]", to.join(","))
            }
        }
    }
}

/// Replica faults drawn for one adversarial run: up to f faulty replicas among `n`, each
/// with a random behaviour; a faulty one that behaves correctly becomes a twin, is split
/// into two personas, or crashes and restarts instead.
pub struct ReplicaFaults {
    pub behaviors: Vec<Behavior>,
    pub twin: Option<NodeId>,
    /// A replica split in two personas, and the replicas its second persona serves.
    pub split: Option<(NodeId, Vec<NodeId>)>,
    pub crash: Option<(NodeId, Nanos, Nanos)>,
}

/// Draws [`ReplicaFaults`]; `everyone` lists every node, for selective behaviours. With
/// `keyed`, faulty replicas also lie with the coalition's keys, inject invented bodies,
/// hijack view changes (PBFT) and split into personas.
pub fn draw_replica_faults(rng: &mut Rng, n: u32, f: u32, everyone: &[NodeId], keyed: bool) -> ReplicaFaults {
    draw_faults(rng, n, f, everyone, keyed, if keyed { 12 } else { 9 })
}

/// [`draw_replica_faults`] for pub/sub brokers, keyed: every behaviour but PBFT's
/// [`Behavior::Hijack`].
pub fn draw_broker_faults(rng: &mut Rng, n: u32, f: u32, everyone: &[NodeId]) -> ReplicaFaults {
    draw_faults(rng, n, f, everyone, true, 11)
}

/// The behaviours are the first `kinds` of the list below.
fn draw_faults(rng: &mut Rng, n: u32, f: u32, everyone: &[NodeId], keyed: bool, kinds: u64) -> ReplicaFaults {
    const MS: Nanos = 1_000_000;
    let some = |rng: &mut Rng| -> Vec<NodeId> { everyone.iter().copied().filter(|_| rng.chance(500_000)).collect() };
    let mut faulty: Vec<NodeId> = Vec::new();
    let budget = rng.below(f as u64 + 1) as usize;
    // Keyed runs make the first primary faulty half the time: its lies matter most.
    if keyed && budget > 0 && rng.chance(500_000) {
        faulty.push(0);
    }
    while faulty.len() < budget {
        let b = rng.below(n as u64) as NodeId;
        if !faulty.contains(&b) {
            faulty.push(b);
        }
    }
    let mut out =
        ReplicaFaults { behaviors: vec![Behavior::Correct; n as usize], twin: None, split: None, crash: None };
    for &b in &faulty {
        out.behaviors[b as usize] = match rng.below(kinds) {
            0 => Behavior::Silent,
            1 => Behavior::OnlyTo(some(rng)),
            2 => Behavior::DropTo(some(rng)),
            3 => Behavior::AlterTo(some(rng)),
            4 => Behavior::Equivocate,
            5 => Behavior::CorruptMacs,
            6 => Behavior::Replay,
            7 => Behavior::ForgeSender(*rng.pick(everyone)),
            9 => Behavior::Lie(some(rng)),
            10 => Behavior::Inject(20 + rng.below(200) as u32),
            11 => Behavior::Hijack,
            _ => Behavior::Correct,
        };
    }
    if let Some(&b) = faulty.iter().find(|&&b| out.behaviors[b as usize] == Behavior::Correct) {
        let split = keyed && rng.chance(if b == 0 { 700_000 } else { 300_000 });
        if split {
            // About half the other replicas hear the second persona.
            let others: Vec<NodeId> = (0..n).filter(|&r| r != b).collect();
            out.split = Some((b, others.into_iter().filter(|_| rng.chance(500_000)).collect()));
        } else if rng.chance(500_000) {
            out.twin = Some(b);
        } else {
            let at = rng.below(20) * MS;
            out.crash = Some((b, at, at + (1 + rng.below(40)) * MS));
        }
    }
    out
}

/// A network drawn for one adversarial run: latency spread, and sometimes duplicates
/// or drops (for the first tens of milliseconds, or for good where `lossy_for_good`).
pub fn draw_net(rng: &mut Rng, lossy_for_good: bool) -> NetConfig {
    let mut net = NetConfig {
        min_latency: 50_000,
        max_latency: 200_000 + rng.below(10) * 1_000_000,
        duplicate_ppm: if rng.chance(500_000) { 50_000 } else { 0 },
        drop_ppm: if rng.chance(100_000) { 50_000 } else { 0 },
        ..NetConfig::default()
    };
    if !lossy_for_good {
        net.lossy_until = (5 + rng.below(60)) * 1_000_000;
    }
    net
}

/// How long a sweep's storage syncs take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syncs {
    /// No time: the schedules of the seeds pinned before syncs took time.
    Instant,
    /// Up to a millisecond for half the seeds (chosen from the seed apart from the
    /// scenario's draws), so a crash can fall between a send and the sync of a record it
    /// did not wait for.
    Drawn,
}

impl Syncs {
    /// The longest sync for seed `seed`.
    pub fn max_latency(self, seed: u64) -> Nanos {
        match self {
            Syncs::Drawn if (seed / 2) % 2 == 1 => 1_000_000,
            _ => 0,
        }
    }

    /// What a rerun command adds to say so.
    pub fn flag(self) -> &'static str {
        match self {
            Syncs::Instant => " --instant-syncs",
            Syncs::Drawn => "",
        }
    }
}

/// A frame to put on the network: (receiver, claimed sender, bytes).
pub type Frame = (NodeId, NodeId, Vec<u8>);

/// Applies `behavior` to one frame that node `me` sends to `to`. The coalition holds
/// the keys of `me` and of every other faulty node.
#[expect(
    clippy::too_many_arguments,
    reason = "a sim helper: each argument is a disjoint borrow of the simulator or its host, needed by some behavior"
)]
pub fn tamper(
    behavior: &Behavior,
    me: NodeId,
    coalition: &Coalition,
    pool: &Pool,
    rng: &mut Rng,
    seen: &mut Vec<(NodeId, Vec<u8>)>,
    to: NodeId,
    bytes: Vec<u8>,
) -> Vec<Frame> {
    match behavior {
        Behavior::Correct | Behavior::Inject(_) | Behavior::Hijack => vec![(to, me, bytes)],
        Behavior::Silent => vec![],
        Behavior::OnlyTo(set) => {
            if set.contains(&to) {
                vec![(to, me, bytes)]
            } else {
                vec![]
            }
        }
        Behavior::DropTo(set) => {
            if set.contains(&to) {
                vec![]
            } else {
                vec![(to, me, bytes)]
            }
        }
        Behavior::AlterTo(set) if set.contains(&to) => {
            let field = rng.below(5);
            vec![(to, me, coalition.rewrite(me, to, me, &bytes, |kind, macs| alter(kind, macs, field, me)))]
        }
        Behavior::AlterTo(_) => vec![(to, me, bytes)],
        Behavior::Equivocate if to % 2 == 1 => {
            let mut forge = Forge { rng, pool, coalition, me };
            vec![(
                to,
                me,
                coalition.rewrite(me, to, me, &bytes, |kind, _| {
                    if let pb::body::Kind::NewView(nv) = kind {
                        return forge.regroup(nv);
                    }
                    equivocate(kind);
                    // Its other checkpoint vote is signed too.
                    if let pb::body::Kind::Checkpoint(c) = kind {
                        coalition.sign_checkpoint(me, c);
                    }
                }),
            )]
        }
        Behavior::Equivocate => vec![(to, me, bytes)],
        Behavior::CorruptMacs => {
            if let Some(sealed) = coalition.corrupt_inner(me, to, &bytes) {
                return vec![(to, me, sealed)];
            }
            let Ok(mut frame) = pb::Frame::decode(bytes.as_slice()) else { return vec![(to, me, bytes)] };
            for m in &mut frame.macs {
                let mut tag = m.tag.to_vec();
                if let Some(b) = tag.first_mut() {
                    *b ^= 1;
                }
                m.tag = tag.into();
            }
            vec![(to, me, frame.encode_to_vec())]
        }
        Behavior::Replay => {
            let mut out = vec![(to, me, bytes.clone())];
            if !seen.is_empty() && rng.chance(300_000) {
                let (_, old) = rng.pick(seen).clone();
                out.push((to, me, old));
            }
            if seen.len() < 64 {
                seen.push((to, bytes));
            }
            out
        }
        Behavior::Lie(set) if set.contains(&to) => {
            vec![(to, me, Forge { rng, pool, coalition, me }.rewrite(to, &bytes))]
        }
        Behavior::Lie(_) => vec![(to, me, bytes)],
        Behavior::Mix(plan) => mix(plan, me, coalition, to, bytes),
        Behavior::ForgeSender(victim) => {
            let Ok(mut frame) = pb::Frame::decode(bytes.as_slice()) else { return vec![] };
            frame.sender = *victim;
            vec![(to, *victim, frame.encode_to_vec())]
        }
    }
}

/// [`Behavior::Mix`]: each regular publication in a frame to `to` goes instead to the
/// plan's versions for `to` (for a Chain hop, which goes to the head alone, to the plan's
/// versions for every broker); anything else goes on as it was.
fn mix(
    plan: &[(NodeId, Algorithm, bool)],
    me: NodeId,
    coalition: &Coalition,
    to: NodeId,
    bytes: Vec<u8>,
) -> Vec<Frame> {
    let Some(bodies) = wire::bodies_of(&bytes) else { return vec![(to, me, bytes)] };
    let mut frames = Vec::new();
    for body in bodies {
        let pb::body::Kind::Publication(p) = body else {
            frames.push((to, me, coalition.seal(me, to, &wire::encode_body(body), vec![])));
            continue;
        };
        if p.history {
            frames.push((to, me, coalition.seal(me, to, &wire::encode_body(pb::body::Kind::Publication(p)), vec![])));
            continue;
        }
        let everywhere = p.step == pb::Step::Hop as i32;
        for &(broker, algorithm, own) in plan.iter().filter(|v| everywhere || v.0 == to) {
            let mut version = p.clone();
            if own {
                version.payload = [&p.payload[..], format!("/by {algorithm:?}").as_bytes()].concat().into();
            }
            frames.push((broker, me, coalition.publication(me, broker, version, algorithm)));
        }
    }
    frames
}

/// Seed 000 §6.7's alterations of a publication: seq+1, publisher+1, topic+1, contents
/// replaced, or the upstream (Chain) MACs dropped (contents replaced where there are
/// none). Other messages get their content changed as by [`equivocate`].
fn alter(kind: &mut pb::body::Kind, macs: &mut Vec<pb::Mac>, field: u64, me: NodeId) {
    let pb::body::Kind::Publication(p) = kind else { return equivocate(kind) };
    match field {
        // What it relays may itself be a colluder's lie, numbered up to u64::MAX.
        0 => p.seq = p.seq.wrapping_add(1),
        1 => p.publisher = p.publisher.wrapping_add(1),
        2 => p.topic = p.topic.wrapping_add(1),
        4 if macs.iter().any(|m| m.from != me) => macs.retain(|m| m.from == me),
        _ => p.payload = bytes::Bytes::from_static(b"altered by a Byzantine node"),
    }
}

/// The other content an equivocating node sends some receivers: a different payload,
/// op, result or digest, for a PRE-PREPARE another batch of the same requests, and for a
/// VIEW-CHANGE claims that other batches prepared (and that it voted for them). (An
/// equivocating node also relays another set of VIEW-CHANGEs in a NEW-VIEW,
/// [`Forge::regroup`], and signs its other checkpoint vote; what [`alter`] changes is
/// left unsigned.)
fn equivocate(kind: &mut pb::body::Kind) {
    fn flip(digest: &mut [u8]) {
        if let Some(b) = digest.first_mut() {
            *b ^= 0xff;
        }
    }
    fn altered(b: &[u8]) -> Bytes {
        [b, b"/equivocated"].concat().into()
    }
    match kind {
        pb::body::Kind::Publication(p) => p.payload = altered(&p.payload),
        pb::body::Kind::Requests(r) => {
            if let Ok(mut body) = pb::RequestsBody::decode(r.body.clone())
                && let Some(op) = body.ops.first_mut()
            {
                *op = altered(op);
                r.body = body.encode_to_vec().into();
            }
        }
        pb::body::Kind::PrePrepare(pp) => {
            let mut batch = pb::Batch::decode(pp.batch.clone()).unwrap_or_default();
            if batch.requests.len() > 1 {
                batch.requests.reverse();
            } else {
                batch.requests.clear();
            }
            pp.batch = batch.encode_to_vec().into();
        }
        pb::body::Kind::Prepare(v) | pb::body::Kind::Commit(v) => flip(&mut v.digest),
        pb::body::Kind::Checkpoint(c) => flip(&mut c.digest),
        pb::body::Kind::Reply(r) => {
            if let Some(result) = r.results.first_mut() {
                *result = altered(result);
            }
        }
        pb::body::Kind::ReadReply(r) => r.result = altered(&r.result),
        pb::body::Kind::PerpetualResult(r) => r.result = altered(&r.result),
        pb::body::Kind::ViewChange(vc) => {
            for v in vc.prepared.iter_mut().chain(vc.voted.iter_mut()) {
                flip(&mut v.digest);
            }
        }
        _ => {}
    }
}

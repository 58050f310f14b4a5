//! Distillation (Chop Chop, seed 004), as `shared/specs/distillation.md` specifies it:
//! any number of untrusted clients broadcast small messages in total order through
//! untrusted brokers, and the servers verify almost nothing per message.
//!
//! - [`Client`] (role `distill-client`): submits one message at a time with its seq,
//!   signs the root of a batch holding it (after checking its own entry and the raise),
//!   accepts a delivery certificate, and resubmits through the next broker on a timeout.
//! - [`Broker`] (role `distill-broker`): filters submissions, batches them, has clients
//!   multi-sign the root, aggregates (stragglers keep their own signatures), gets the
//!   batch witnessed by servers, then certifies its delivery to the clients.
//! - [`Server`] (role `server`): a PBFT replica (`crate::order`) whose application is the
//!   order-dedup-deliver of spec §5 steps 8–9, run in the core: PBFT orders batch
//!   references, and deduplication, lanes, heights and sign-ups travel in its checkpoints.
//!
//! # Addresses and sessions [ours]
//!
//! Only servers are cluster members sharing MAC keys. Brokers and clients are addressed
//! by the `NodeId` their host gives them (a connection, a UDP source); a node reads their
//! frames itself ([`crate::role::RoleMachine::on_unkeyed`]). What they send is signed:
//! a client's id is inside its statements, so a broker never trusts an address for an
//! id. It answers a submission at every address that sent it (the few newest), so that
//! a replay of it from elsewhere cannot take its client's answers away. A broker opens a
//! session with each server by a signed hello (a nonce above its last); the server then
//! takes that address's offers as the broker's, keyed by its Ed25519 identity (lanes
//! belong to identities, not addresses). Hosts map their transport addresses to
//! `NodeId`s outside the servers' ids. In the simulator and the tests, a generated
//! client's address is [`CLIENT_ADDRESS_BASE`] + its directory id.
//!
//! # Safety and liveness (spec §6)
//!
//! At most one delivery per (id, msg), and every correct server delivers the same
//! (height, entries) sequence: deliveries are a deterministic function of the TOB's
//! order. Every delivered entry was signed by its client: individually (a straggler), or
//! by a multi-signature on a root under which the client checked its own entry. A client's
//! seq grows only with height records servers certified. A delivery record a client
//! accepts carries f+1 server signatures, one of them a correct server's.

mod batch;
mod broker;
mod client;
mod directory;
pub mod load;
pub mod merkle;
mod server;

pub use batch::{Batch, DeliveredBatch, Fate, Messages, PackedIds, Straggler, verify_proof};
pub(crate) use broker::Broker;
pub(crate) use client::Client;
pub use directory::{Directory, ED25519_PURPOSE, ed_key, generated_material, generated_secrets};
pub(crate) use server::Server;

use prost::Message;

use crate::config::{ConfigError, Params, Role};
use crate::crypto::{BlsKey, BlsSignature, CryptoMode, Digest, verify_multi};
use crate::node::{Ctx, Output};
use crate::statement::DistillStatement;
use crate::wire::pb;
use crate::{Nanos, NodeId};

/// In the simulator and tests: generated client `d` has address `CLIENT_ADDRESS_BASE + d`.
pub const CLIENT_ADDRESS_BASE: NodeId = 1 << 31;

/// Most broker sessions a server holds at once.
pub const MAX_SESSIONS: usize = 4096;

pub(crate) fn validate_params(p: &Params, n: u64) -> Result<(), ConfigError> {
    let fail = |m: String| Err(ConfigError(m));
    if p.distill_batch_size == 0 || p.leaf_entries == 0 || p.lanes == 0 {
        return fail("params.distill_batch_size, params.leaf_entries and params.lanes must be at least 1".into());
    }
    if p.margin as u64 > n {
        return fail(format!("params.margin = {} must be at most the number of servers, {n}", p.margin));
    }
    if p.directory_size >= CLIENT_ADDRESS_BASE as u64 {
        return fail(format!("params.directory_size = {} must be below {CLIENT_ADDRESS_BASE}", p.directory_size));
    }
    let batch = (p.distill_batch_size as u64).saturating_mul(p.max_payload as u64 + 8 + 100).saturating_add(4096);
    if batch > p.max_message_bytes as u64 {
        return fail(format!(
            "params.max_message_bytes = {} is too small for an offer of up to {batch} bytes \
             (distill_batch_size * (max_payload + 108) + 4096); raise it or lower distill_batch_size",
            p.max_message_bytes
        ));
    }
    Ok(())
}

/// What a deduplication log keeps of a message: [ours] the message itself when it is
/// shorter than a digest (its length first), else BLAKE3 of it — compared in full either
/// way, and no hash call for short messages.
pub(crate) fn msg_digest(msg: &[u8]) -> Digest {
    if msg.len() < 32 {
        let mut d = [0u8; 32];
        d[0] = msg.len() as u8;
        d[1..=msg.len()].copy_from_slice(msg);
        return d;
    }
    *blake3::hash(msg).as_bytes()
}

/// BLAKE3 of the server membership (ids and BLS keys): inside every signed statement,
/// so that none carries over to another deployment.
pub fn system_id(cluster: &crate::ClusterConfig) -> Digest {
    let mut h = blake3::Hasher::new_derive_key("phalanx v1 distill system id");
    for s in cluster.nodes.iter().filter(|n| n.role == Role::Server) {
        h.update(&s.id.to_le_bytes());
        h.update(&s.bls_public_key.0);
    }
    *h.finalize().as_bytes()
}

/// The servers as every distillation role sees them: their ids in order (certificate
/// bitmaps index them), their BLS keys, the system id, and the thresholds.
pub(crate) struct Servers {
    pub ids: Vec<NodeId>,
    keys: Vec<BlsKey>,
    pub system_id: Digest,
    /// f+1: one of them is correct.
    pub p: usize,
    /// ⌈(n+f+1)/2⌉.
    pub q: usize,
    pub mode: CryptoMode,
}

impl Servers {
    pub fn new(ctx: &Ctx) -> Servers {
        let mode = ctx.cfg.cluster.crypto;
        let servers: Vec<_> = ctx.cfg.cluster.nodes.iter().filter(|n| n.role == Role::Server).collect();
        Servers {
            ids: servers.iter().map(|s| s.id).collect(),
            // Validated with their proofs of possession by the configuration.
            keys: servers.iter().map(|s| BlsKey::parse(mode, &s.bls_public_key).expect("a validated key")).collect(),
            system_id: system_id(&ctx.cfg.cluster),
            p: ctx.quorums.one_correct(),
            q: ctx.quorums.intersecting(),
            mode,
        }
    }

    pub fn index(&self, id: NodeId) -> Option<usize> {
        self.ids.binary_search(&id).ok()
    }

    /// The certificate of the servers at `signers` (indices) on one statement.
    pub fn certificate(&self, signers: &[usize], sigs: &[BlsSignature]) -> Option<pb::DistillCertificate> {
        let shards: Vec<(usize, BlsSignature)> = signers.iter().copied().zip(sigs.iter().copied()).collect();
        load::certificate(self.mode, self.ids.len(), &shards)
    }

    /// The servers a bitmap names; `None` if it names none that exist or is too long.
    pub fn signers(&self, bitmap: &[u8]) -> Option<Vec<usize>> {
        if bitmap.len() != self.ids.len().div_ceil(8) {
            return None;
        }
        let signers: Vec<usize> = (0..self.ids.len()).filter(|i| bitmap[i / 8] & (1 << (i % 8)) != 0).collect();
        let extra = (self.ids.len()..bitmap.len() * 8).any(|i| bitmap[i / 8] & (1 << (i % 8)) != 0);
        (!extra).then_some(signers)
    }

    /// Whether at least f+1 distinct servers signed `msg` in `cert` (one verification).
    pub fn verify_certificate(&self, ctx: &mut Ctx, cert: &pb::DistillCertificate, msg: &[u8]) -> bool {
        let Some(signers) = self.signers(&cert.signers).filter(|s| s.len() >= self.p) else { return false };
        let Ok(sig) = <[u8; 96]>::try_from(cert.signature.as_slice()) else { return false };
        ctx.counters.signatures_verified += 1;
        verify_multi(self.mode, signers.iter().map(|&i| &self.keys[i]), msg, &BlsSignature(sig))
    }

    /// Whether server `index` signed `msg` with `sig`.
    pub fn verify_share(&self, ctx: &mut Ctx, index: usize, msg: &[u8], sig: &BlsSignature) -> bool {
        ctx.counters.signatures_verified += 1;
        verify_multi(self.mode, std::iter::once(&self.keys[index]), msg, sig)
    }

    /// Of shares by distinct servers on one message, those that verify: their aggregate
    /// first, one by one only if it fails.
    pub fn good_shares(
        &self,
        ctx: &mut Ctx,
        msg: &[u8],
        shares: &[(usize, BlsSignature)],
    ) -> Vec<(usize, BlsSignature)> {
        if shares.is_empty() {
            return vec![];
        }
        let sigs: Vec<BlsSignature> = shares.iter().map(|(_, s)| *s).collect();
        if let Some(agg) = crate::crypto::aggregate(self.mode, &sigs) {
            ctx.counters.signatures_verified += 1;
            if verify_multi(self.mode, shares.iter().map(|(i, _)| &self.keys[*i]), msg, &agg) {
                return shares.to_vec();
            }
        }
        shares.iter().filter(|(i, s)| self.verify_share(ctx, *i, msg, s)).copied().collect()
    }
}

/// BatchDelivery{height, root}.
pub fn delivery_statement(sys: &Digest, height: u64, root: &[u8]) -> Vec<u8> {
    DistillStatement::BatchDelivery.message(sys, &[&height.to_le_bytes(), root])
}

/// BatchWitness{broker, lane, lane_seq, root}.
pub fn witness_statement(sys: &Digest, broker: &[u8], lane: u32, lane_seq: u64, root: &[u8]) -> Vec<u8> {
    DistillStatement::BatchWitness.message(sys, &[broker, &lane.to_le_bytes(), &lane_seq.to_le_bytes(), root])
}

/// Broadcast{id, seq, msg}.
pub fn broadcast_statement(sys: &Digest, id: u64, seq: u64, msg: &[u8]) -> Vec<u8> {
    let len = (msg.len() as u32).to_le_bytes();
    DistillStatement::Broadcast.message(sys, &[&id.to_le_bytes(), &seq.to_le_bytes(), &len, msg])
}

/// Reduction{R1}.
pub fn reduction_statement(sys: &Digest, root: &[u8]) -> Vec<u8> {
    DistillStatement::Reduction.message(sys, &[root])
}

/// ReductionAuth{id, R1, share}.
pub fn reduction_auth_statement(sys: &Digest, id: u64, root: &[u8], share: &[u8]) -> Vec<u8> {
    DistillStatement::ReductionAuth.message(sys, &[&id.to_le_bytes(), root, share])
}

/// BroadcastAuth{id, height, root}.
pub fn broadcast_auth_statement(sys: &Digest, id: u64, height: u64, root: &[u8]) -> Vec<u8> {
    DistillStatement::BroadcastAuth.message(sys, &[&id.to_le_bytes(), &height.to_le_bytes(), root])
}

/// SignUp{ed_key, bls_key}.
pub fn sign_up_statement(sys: &Digest, ed: &[u8], bls: &[u8]) -> Vec<u8> {
    DistillStatement::SignUp.message(sys, &[ed, bls])
}

/// Assign{id, ed_key, bls_key}.
pub fn assign_statement(sys: &Digest, id: u64, ed: &[u8], bls: &[u8]) -> Vec<u8> {
    DistillStatement::Assign.message(sys, &[&id.to_le_bytes(), ed, bls])
}

/// Hello{broker, server, nonce}.
pub fn hello_statement(sys: &Digest, broker: &[u8], server: NodeId, nonce: u64) -> Vec<u8> {
    DistillStatement::Hello.message(sys, &[broker, &server.to_le_bytes(), &nonce.to_le_bytes()])
}

/// Sends a frame to a broker or client (no cluster MAC: its contents are signed).
pub(crate) fn send_frame(ctx: &mut Ctx, to: NodeId, kind: pb::distill_frame::Kind) {
    send_frame_to(ctx, &[to], kind);
}

/// Sends one frame to each of `to`, in order: encoded once, not once per address.
pub(crate) fn send_frame_to(ctx: &mut Ctx, to: &[NodeId], kind: pb::distill_frame::Kind) {
    let Some((&last, rest)) = to.split_last() else { return };
    let bytes = pb::DistillFrame { kind: Some(kind) }.encode_to_vec();
    for &to in rest {
        ctx.push(Output::Send { to, bytes: bytes.clone() });
    }
    ctx.push(Output::Send { to: last, bytes });
}

/// A frame from a broker or client: `None` (and a fault) if oversized or malformed.
pub(crate) fn open_frame(ctx: &mut Ctx, from: NodeId, bytes: &[u8]) -> Option<pb::distill_frame::Kind> {
    if bytes.len() > ctx.cfg.cluster.params.max_message_bytes as usize {
        ctx.fault(from, crate::FaultKind::Oversized);
        return None;
    }
    match pb::DistillFrame::decode(bytes).ok().and_then(|f| f.kind) {
        Some(kind) => Some(kind),
        None => {
            ctx.fault(from, crate::FaultKind::Malformed);
            None
        }
    }
}

/// A height record's height and root, if well formed.
pub(crate) fn record_root(r: &pb::HeightRecord) -> Option<Digest> {
    Digest::try_from(r.root.as_slice()).ok()
}

/// Whether `r` is certified by f+1 servers (one verification).
pub(crate) fn verify_record(servers: &Servers, ctx: &mut Ctx, r: &pb::HeightRecord) -> bool {
    let Some(cert) = &r.certificate else { return false };
    record_root(r).is_some()
        && servers.verify_certificate(ctx, cert, &delivery_statement(&servers.system_id, r.height, &r.root))
}

/// A deterministic generator for a role's random choices (a broker's order of servers),
/// seeded from the node's secret material: no OS randomness in the core.
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(material: &[u8; 32]) -> Rng {
        let seed = *blake3::Hasher::new_derive_key("phalanx v1 distill rng").update(material).finalize().as_bytes();
        Rng(u64::from_le_bytes(seed[..8].try_into().expect("8 bytes")) | 1)
    }

    pub fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// The earliest of several optional deadlines.
pub(crate) fn earliest(deadlines: impl IntoIterator<Item = Option<Nanos>>) -> Option<Nanos> {
    deadlines.into_iter().flatten().min()
}

//! The statements nodes sign with BLS. Each kind has its own domain in the signed bytes
//! and the one role allowed to sign it, and [`Ctx`] signs and checks statements only
//! through this module: no code path checks a statement against a key of another role
//! (a client's key on a VIEW-CHANGE proves nothing, however valid the signature).

use crate::NodeId;
use crate::config::{Protocol, Role};
use crate::crypto::{BlsPublicKey, BlsSignature};
use crate::node::Ctx;

/// What a signature vouches for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Statement {
    /// PBFT: a replica's state digest at a checkpoint.
    Checkpoint,
    /// PBFT: a replica's VIEW-CHANGE, over the digest of its encoding without signature.
    ViewChange,
}

impl Statement {
    fn domain(self) -> &'static [u8; 4] {
        match self {
            Statement::Checkpoint => b"ckpt",
            Statement::ViewChange => b"vchg",
        }
    }

    /// The only role whose keys sign this statement in a cluster of `protocol`: the
    /// replicas of PBFT, and the servers of distillation (PBFT replicas too).
    pub fn signer(self, protocol: Protocol) -> Role {
        match self {
            Statement::Checkpoint | Statement::ViewChange => protocol.replica_role(),
        }
    }

    /// The signed bytes: domain, kind, view, seq and digest, fixed-width.
    pub fn message(self, view: u64, seq: u64, digest: &[u8]) -> Vec<u8> {
        let mut m = Vec::with_capacity(17 + 4 + 16 + digest.len());
        m.extend_from_slice(b"phalanx/v1/order/");
        m.extend_from_slice(self.domain());
        m.extend_from_slice(&view.to_le_bytes());
        m.extend_from_slice(&seq.to_le_bytes());
        m.extend_from_slice(digest);
        m
    }
}

/// What distillation's signatures vouch for (shared/specs/distillation.md §1): each is
/// `tag ‖ system_id ‖ canonical bytes`, where `system_id` is BLAKE3 of the server
/// membership (so no statement carries over to another deployment) and the client's id is
/// inside every statement a client signs but `Reduction`, the one message every client
/// of a batch multi-signs. Tags 0–6 are the specification's; 7 and 8 are ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DistillStatement {
    /// Client, Ed25519: Broadcast{id, seq, msg}.
    Broadcast = 0,
    /// Client, BLS: Reduction{R1}.
    Reduction = 1,
    /// Client, Ed25519: BroadcastAuth{id, height, root}, the record justifying its seq.
    BroadcastAuth = 2,
    /// Client, Ed25519: ReductionAuth{id, R1, share}.
    ReductionAuth = 3,
    /// Server, BLS: BatchWitness{broker, lane, lane_seq, R2}.
    BatchWitness = 4,
    /// Server, BLS: BatchDelivery{height, R3}.
    BatchDelivery = 5,
    /// Client, Ed25519 and BLS: SignUp{ed_key, bls_key}, the proofs of possession.
    SignUp = 6,
    /// Server, BLS: Assign{id, ed_key, bls_key} (S1).
    Assign = 7,
    /// Broker, Ed25519: Hello{broker, server, nonce}, opening its session with a server.
    Hello = 8,
}

impl DistillStatement {
    /// Who signs it: a server (by its cluster role), or a client or broker by the key
    /// its directory entry or hello names.
    pub fn signer(self) -> Role {
        match self {
            DistillStatement::BatchWitness | DistillStatement::BatchDelivery | DistillStatement::Assign => Role::Server,
            DistillStatement::Hello => Role::DistillBroker,
            _ => Role::DistillClient,
        }
    }

    /// The signed bytes: the tag, the system id, then `parts` (fixed-width fields or a
    /// length-prefixed last one, so the encoding is unambiguous).
    pub fn message(self, system_id: &[u8; 32], parts: &[&[u8]]) -> Vec<u8> {
        let len = parts.iter().map(|p| p.len()).sum::<usize>();
        let mut m = Vec::with_capacity(1 + 32 + len);
        m.push(self as u8);
        m.extend_from_slice(system_id);
        for p in parts {
            m.extend_from_slice(p);
        }
        m
    }
}

/// A statement about (view, seq, digest).
#[derive(Clone, Copy, Debug)]
pub struct Signed<'a> {
    pub statement: Statement,
    pub view: u64,
    pub seq: u64,
    pub digest: &'a [u8],
}

impl Signed<'_> {
    fn message(&self) -> Vec<u8> {
        self.statement.message(self.view, self.seq, self.digest)
    }
}

impl Ctx {
    /// `id`'s key for `statement`: `None` unless `id` is a node of the role that signs it
    /// and one of the replicas this node orders with (in a Perpetual cluster, a member of
    /// its own group: another group's members sign their own group's checkpoints and view
    /// changes, which prove nothing here).
    pub fn signer_key(&self, statement: Statement, id: NodeId) -> Option<BlsPublicKey> {
        let node = self.cfg.cluster.node(id)?;
        (node.role == statement.signer(self.cfg.cluster.protocol) && self.is_replica(id)).then_some(node.bls_public_key)
    }

    /// This node signs `s` (only a node of its signer role ever calls this).
    pub fn sign_statement(&self, s: Signed<'_>) -> BlsSignature {
        debug_assert_eq!(self.role_of(self.me()), Some(s.statement.signer(self.cfg.cluster.protocol)), "{s:?}");
        self.sign(&s.message())
    }

    /// Whether `signer` signed `s` with `sig` (false for a signer of another role).
    pub fn verify_statement(&mut self, s: Signed<'_>, signer: NodeId, sig: &[u8]) -> bool {
        let (Some(pk), Ok(sig)) = (self.signer_key(s.statement, signer), <[u8; 96]>::try_from(sig)) else {
            return false;
        };
        self.verify_signature(&pk, &s.message(), &BlsSignature(sig))
    }

    /// Whether `sig` aggregates signatures on `s` by every one of `signers` (false if any
    /// is of another role).
    pub fn verify_statement_aggregate(&mut self, s: Signed<'_>, signers: &[NodeId], sig: &[u8]) -> bool {
        let keys: Option<Vec<BlsPublicKey>> = signers.iter().map(|&id| self.signer_key(s.statement, id)).collect();
        let (Some(pks), Ok(sig)) = (keys, <[u8; 96]>::try_from(sig)) else { return false };
        self.verify_aggregate(&pks, &s.message(), &BlsSignature(sig))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::CryptoMode;
    use crate::{ClusterSpec, Node, generate_cluster};

    #[test]
    fn only_replicas_keys_check_replica_statements() {
        let spec = ClusterSpec { crypto: CryptoMode::Real, ..ClusterSpec::pbft(1, 1) };
        let cfgs = generate_cluster(&spec, [9; 32]).unwrap();
        let (replica, client) = (&cfgs[1], &cfgs[4]);
        let mut node = Node::new(cfgs[0].clone()).unwrap();
        let ctx = node.ctx_mut();
        for statement in [Statement::Checkpoint, Statement::ViewChange] {
            let s = Signed { statement, view: 3, seq: 8, digest: &[7; 32] };
            let by_replica = replica.bls_secret.sign(&s.message());
            let by_client = client.bls_secret.sign(&s.message());
            assert!(ctx.verify_statement(s, 1, &by_replica.0));
            // The client's signature is valid for its own key, yet counts for nothing.
            assert!(client.bls_secret.public_key().verify(CryptoMode::Real, &s.message(), &by_client));
            assert!(!ctx.verify_statement(s, 4, &by_client.0));
            assert_eq!(ctx.signer_key(statement, 4), None);
            assert!(!ctx.verify_statement_aggregate(s, &[1, 4], &by_replica.0));
            // Another statement's bytes do not verify.
            let other = Signed { view: 4, ..s };
            assert!(!ctx.verify_statement(other, 1, &by_replica.0));
        }
    }

    #[test]
    fn another_groups_members_do_not_sign_for_this_group() {
        let spec =
            crate::config::PerpetualSpec { crypto: CryptoMode::Real, ..crate::config::PerpetualSpec::pair(4, 4) };
        let cfgs = crate::config::generate_perpetual(&spec, [9; 32]).unwrap();
        let mut node = Node::new(cfgs[0].clone()).unwrap();
        let ctx = node.ctx_mut();
        for statement in [Statement::Checkpoint, Statement::ViewChange] {
            let s = Signed { statement, view: 3, seq: 8, digest: &[7; 32] };
            let (mine, theirs) = (cfgs[1].bls_secret.sign(&s.message()), cfgs[5].bls_secret.sign(&s.message()));
            assert!(ctx.verify_statement(s, 1, &mine.0));
            // Node 5 is a member too, of the other group: its valid signature counts for nothing.
            assert!(!ctx.verify_statement(s, 5, &theirs.0));
            assert_eq!(ctx.signer_key(statement, 5), None);
        }
    }
}

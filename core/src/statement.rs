//! The statements nodes sign with BLS. Each kind has its own domain in the signed bytes
//! and the one role allowed to sign it, and [`Ctx`] signs and checks statements only
//! through this module: no code path checks a statement against a key of another role
//! (a client's key on a VIEW-CHANGE proves nothing, however valid the signature).

use crate::NodeId;
use crate::config::Role;
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

    /// The only role whose keys sign this statement.
    pub fn signer(self) -> Role {
        match self {
            Statement::Checkpoint | Statement::ViewChange => Role::Replica,
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
    /// `id`'s key for `statement`: `None` unless `id` is a node of the role that signs it.
    pub fn signer_key(&self, statement: Statement, id: NodeId) -> Option<BlsPublicKey> {
        let node = self.cfg.cluster.node(id)?;
        (node.role == statement.signer()).then_some(node.bls_public_key)
    }

    /// This node signs `s` (only a node of its signer role ever calls this).
    pub fn sign_statement(&self, s: Signed<'_>) -> BlsSignature {
        debug_assert_eq!(self.role_of(self.me()), Some(s.statement.signer()), "{s:?}");
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
}

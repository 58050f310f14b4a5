//! Distillation's invariants (spec §6) as checks over a simulated run's log.

use std::collections::{BTreeMap, BTreeSet};

use super::{Completion, Distilled, Log};
use crate::NodeId;

/// A message a correct client submitted: (directory id, its request number, msg).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Submitted {
    pub client: NodeId,
    pub id: u64,
    pub request: u64,
    pub msg: Vec<u8>,
}

/// What a run must show; each failed check names itself.
pub struct DistillCheck<'a> {
    pub log: &'a Log,
    /// Servers that stayed correct (they may have crashed and restarted).
    pub correct_servers: BTreeSet<NodeId>,
    /// Correct clients' ids, and everything they submitted.
    pub correct_ids: BTreeMap<u64, NodeId>,
    pub submitted: Vec<Submitted>,
    /// Whether every correct client's message must have been delivered (liveness).
    pub expect_all: bool,
}

impl DistillCheck<'_> {
    /// Every check; the first failure's description.
    pub fn run(&self) -> Result<Stats, String> {
        let per_server = self.deliveries_per_server();
        self.agreement(&per_server)?;
        let Some(longest) = per_server.values().max_by_key(|d| d.len()) else {
            return if self.expect_all && !self.submitted.is_empty() {
                Err("liveness: no server delivered anything".into())
            } else {
                Ok(Stats::default())
            };
        };
        let delivered = self.once_per_message(longest)?;
        self.authentic(longest)?;
        self.acceptances(longest, &delivered)?;
        if self.expect_all {
            self.liveness(&delivered)?;
        }
        let messages: usize = longest.values().map(|b| b.len()).sum();
        Ok(Stats { heights: longest.len() as u64, messages: messages as u64 })
    }

    /// Each correct server's deliveries by height (a restarted server delivers again
    /// what it had delivered before its crash: those must agree too).
    fn deliveries_per_server(&self) -> BTreeMap<NodeId, BTreeMap<u64, Entries>> {
        let mut out: BTreeMap<NodeId, BTreeMap<u64, Entries>> = BTreeMap::new();
        for d in self.log.distilled.iter().filter(|d| self.correct_servers.contains(&d.node)) {
            out.entry(d.node).or_default().entry(d.batch.height).or_insert_with(|| entries(d));
        }
        out
    }

    /// Invariant 1b: every correct server delivers the same (height, entries); a restarted
    /// server's second delivery of a height is the same. A server that caught up by state
    /// transfer skips the heights below the checkpoint it installed (its state holds them).
    fn agreement(&self, per_server: &BTreeMap<NodeId, BTreeMap<u64, Entries>>) -> Result<(), String> {
        for d in self.log.distilled.iter().filter(|d| self.correct_servers.contains(&d.node)) {
            if per_server[&d.node][&d.batch.height] != entries(d) {
                return Err(format!(
                    "agreement: server {} delivered height {} twice, differently",
                    d.node, d.batch.height
                ));
            }
        }
        let mut reference: BTreeMap<u64, (NodeId, &Entries)> = BTreeMap::new();
        for (&server, heights) in per_server {
            for (&h, e) in heights {
                match reference.get(&h) {
                    Some((other, known)) if *known != e => {
                        return Err(format!(
                            "agreement: servers {other} and {server} delivered height {h} differently"
                        ));
                    }
                    Some(_) => {}
                    None => {
                        reference.insert(h, (server, e));
                    }
                }
            }
        }
        Ok(())
    }

    /// Invariant 1a: at most one delivery per (id, msg). Returns where each was delivered.
    fn once_per_message(&self, heights: &BTreeMap<u64, Entries>) -> Result<BTreeMap<(u64, Vec<u8>), u64>, String> {
        let mut seen = BTreeMap::new();
        for (&h, batch) in heights {
            for (id, _, msg) in batch {
                if let Some(first) = seen.insert((*id, msg.clone()), h) {
                    return Err(format!("no duplication: id {id} delivered {msg:?} at heights {first} and {h}"));
                }
            }
        }
        Ok(seen)
    }

    /// Invariant 2 (for correct clients): everything delivered under their ids they
    /// submitted; and invariant 3: seqs grow by at most the batches delivered before.
    fn authentic(&self, heights: &BTreeMap<u64, Entries>) -> Result<(), String> {
        let mine: BTreeSet<(u64, &[u8])> = self.submitted.iter().map(|s| (s.id, s.msg.as_slice())).collect();
        for (&h, batch) in heights {
            for (id, seq, msg) in batch {
                if self.correct_ids.contains_key(id) && !mine.contains(&(*id, msg.as_slice())) {
                    return Err(format!("authenticity: id {id} never submitted {msg:?}, delivered at height {h}"));
                }
                if self.correct_ids.contains_key(id) && *seq >= h {
                    return Err(format!("seq growth: id {id} delivered at seq {seq} in height {h}"));
                }
            }
        }
        Ok(())
    }

    /// Invariant 4: a delivery a correct client accepted names a height the servers
    /// delivered, at or after the one that delivered its message.
    fn acceptances(
        &self,
        heights: &BTreeMap<u64, Entries>,
        delivered: &BTreeMap<(u64, Vec<u8>), u64>,
    ) -> Result<(), String> {
        for c in self.completions() {
            let s = self
                .submission(c)
                .ok_or_else(|| format!("client {} completed unknown request {}", c.node, c.request))?;
            let height = u64::from_le_bytes(c.result[..8].try_into().map_err(|_| "short receipt".to_string())?);
            let Some(&at) = delivered.get(&(s.id, s.msg.clone())) else {
                return Err(format!(
                    "acceptance: client {} accepted {:?} at height {height}, never delivered",
                    c.node, s.msg
                ));
            };
            if at > height || !heights.contains_key(&height) {
                return Err(format!(
                    "acceptance: client {} accepted height {height} for a message delivered at {at}",
                    c.node
                ));
            }
        }
        Ok(())
    }

    /// Invariant 6: every correct client's message was delivered and accepted.
    fn liveness(&self, delivered: &BTreeMap<(u64, Vec<u8>), u64>) -> Result<(), String> {
        let done: BTreeSet<(NodeId, u64)> = self.completions().map(|c| (c.node, c.request)).collect();
        for s in &self.submitted {
            if !delivered.contains_key(&(s.id, s.msg.clone())) {
                return Err(format!("liveness: client {} message {:?} was never delivered", s.client, s.msg));
            }
            if !done.contains(&(s.client, s.request)) {
                return Err(format!("liveness: client {} never accepted request {}", s.client, s.request));
            }
        }
        Ok(())
    }

    fn completions(&self) -> impl Iterator<Item = &Completion> {
        self.log.completed.iter().filter(|c| self.correct_ids.values().any(|n| *n == c.node))
    }

    fn submission(&self, c: &Completion) -> Option<&Submitted> {
        self.submitted.iter().find(|s| s.client == c.node && s.request == c.request)
    }
}

type Entries = Vec<(u64, u64, Vec<u8>)>;

fn entries(d: &Distilled) -> Entries {
    d.batch.entries().map(|(id, seq, msg)| (id, seq, msg.to_vec())).collect()
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub heights: u64,
    pub messages: u64,
}

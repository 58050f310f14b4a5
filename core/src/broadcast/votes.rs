//! Matching votes from distinct senders: each sender counts once, for the first content it
//! sent; a sender that later votes for other content is reported as equivocating.

use bytes::Bytes;

use crate::NodeId;

#[derive(Debug)]
pub struct Votes<T = Bytes> {
    /// (sender, index into `contents`).
    voters: Vec<(NodeId, u32)>,
    /// Distinct contents and how many senders voted for each. At most one per sender.
    contents: Vec<(T, usize)>,
}

impl<T> Default for Votes<T> {
    fn default() -> Self {
        Votes { voters: Vec::new(), contents: Vec::new() }
    }
}

/// The result of adding one vote.
#[derive(Debug, PartialEq, Eq)]
pub enum Vote {
    /// Counted: this many distinct senders now back that content.
    Counted(usize),
    /// The sender already voted for this content.
    Duplicate,
    /// The sender already voted for different content; not counted.
    Equivocation,
}

impl<T: PartialEq + Clone> Votes<T> {
    pub fn add(&mut self, sender: NodeId, content: &T) -> Vote {
        if let Some(&(_, idx)) = self.voters.iter().find(|(s, _)| *s == sender) {
            return if self.contents[idx as usize].0 == *content { Vote::Duplicate } else { Vote::Equivocation };
        }
        let idx = match self.contents.iter().position(|(c, _)| c == content) {
            Some(i) => i,
            None => {
                self.contents.push((content.clone(), 0));
                self.contents.len() - 1
            }
        };
        self.voters.push((sender, idx as u32));
        self.contents[idx].1 += 1;
        Vote::Counted(self.contents[idx].1)
    }

    /// The most senders that back any one content.
    pub fn most(&self) -> usize {
        self.contents.iter().map(|(_, k)| *k).max().unwrap_or(0)
    }

    /// The senders that voted.
    pub fn voters(&self) -> usize {
        self.voters.len()
    }

    /// Replaces `sender`'s vote (if any) with one for `content`; returns how many senders
    /// back `content` now. For answers a sender may legitimately change, such as a read
    /// answered again from a later state.
    pub fn replace(&mut self, sender: NodeId, content: &T) -> usize {
        if let Some(i) = self.voters.iter().position(|(s, _)| *s == sender) {
            let (_, idx) = self.voters.swap_remove(i);
            self.contents[idx as usize].1 -= 1;
        }
        match self.add(sender, content) {
            Vote::Counted(k) => k,
            Vote::Duplicate | Vote::Equivocation => unreachable!("the sender's vote was removed"),
        }
    }

    /// Adds a vote and tells whether it is the one that brings its content to
    /// `threshold` (`Some(true)`: deliver now); `None` if `sender` equivocated.
    pub fn reaches(&mut self, sender: NodeId, content: &T, threshold: usize) -> Option<bool> {
        match self.add(sender, content) {
            Vote::Counted(k) => Some(k == threshold),
            Vote::Duplicate => Some(false),
            Vote::Equivocation => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_distinct_senders_per_content() {
        let mut v = Votes::<Bytes>::default();
        let (m, x) = (Bytes::from_static(b"m"), Bytes::from_static(b"x"));
        assert_eq!(v.add(1, &m), Vote::Counted(1));
        assert_eq!(v.add(1, &m), Vote::Duplicate);
        assert_eq!(v.add(2, &x), Vote::Counted(1));
        assert_eq!(v.add(3, &m), Vote::Counted(2));
        assert_eq!(v.add(2, &m), Vote::Equivocation);
        assert_eq!(v.add(4, &m), Vote::Counted(3));
        assert_eq!((v.most(), v.voters()), (3, 4));
        // A replaced vote moves, with no equivocation.
        assert_eq!(v.replace(4, &x), 2);
        assert_eq!((v.most(), v.voters()), (2, 4));
        assert_eq!(v.replace(5, &x), 3);
    }
}

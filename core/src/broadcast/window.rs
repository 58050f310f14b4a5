//! Bounded instance tables. Each stream (publisher, topic, history?) keeps the instances
//! with sequence numbers in `[low, low + cap)`; everything below `low` is finished and
//! costs nothing, so a replayed or late message for it is dropped in O(1).
//!
//! The window moves forward when its lowest instances finish, or when an instance beyond
//! it is vouched for: directly by the stream's own source (who can only hurt its own
//! stream), or by f+1 distinct replicas (at least one of them correct). A Byzantine
//! replica flooding distinct sequence numbers therefore moves nothing and allocates at
//! most one attestation slot.
//!
//! Sequence numbers come from the network, so every one in 1..=u64::MAX is valid and no
//! arithmetic here adds to one: positions are offsets from `low` (`seq - low`, with
//! `seq >= low`), and `low` never passes the last sequence number (once u64::MAX is
//! finished it stays as the window's one Done slot).

use std::collections::{BTreeMap, VecDeque};

use crate::NodeId;

#[derive(Debug)]
enum Slot<T> {
    /// Inside the window, nothing received yet.
    Empty,
    Live(T),
    Done,
}

/// Where a sequence number falls in a window.
pub enum Entry<'a, T> {
    Live(&'a mut T),
    /// Finished (below the window or marked done): drop the message.
    Done,
    /// Beyond the window and not (yet) vouched for: drop the message.
    Beyond,
}

#[derive(Debug)]
pub struct Window<T> {
    low: u64,
    cap: u64,
    /// Slot `i` is sequence number `low + i`; never longer than `cap`.
    slots: VecDeque<Slot<T>>,
    /// Highest sequence number each replica sent beyond the window.
    attested: BTreeMap<NodeId, u64>,
}

impl<T> Window<T> {
    /// Sequence numbers start at 1.
    pub fn new(cap: u32) -> Self {
        Window { low: 1, cap: cap.max(1) as u64, slots: VecDeque::new(), attested: BTreeMap::new() }
    }

    pub fn low(&self) -> u64 {
        self.low
    }

    /// Instances holding state or marked done above the window's low end.
    pub fn live(&self) -> usize {
        self.slots.iter().filter(|s| !matches!(s, Slot::Empty)).count()
    }

    pub fn is_beyond(&self, seq: u64) -> bool {
        beyond(self.low, self.cap, seq)
    }

    /// The instance for `seq`, created by `make` if it is new and inside the window.
    pub fn entry(&mut self, seq: u64, make: impl FnOnce() -> T) -> Entry<'_, T> {
        if seq < self.low {
            return Entry::Done;
        }
        let at = seq - self.low;
        if at >= self.cap {
            return Entry::Beyond;
        }
        let at = at as usize;
        if at >= self.slots.len() {
            self.slots.resize_with(at + 1, || Slot::Empty);
        }
        let slot = &mut self.slots[at];
        if let Slot::Empty = slot {
            *slot = Slot::Live(make());
        }
        match slot {
            Slot::Live(t) => Entry::Live(t),
            _ => Entry::Done,
        }
    }

    /// Marks `seq` finished, freeing its state.
    pub fn finish(&mut self, seq: u64) {
        if seq >= self.low && seq - self.low < self.cap {
            let at = (seq - self.low) as usize;
            if at >= self.slots.len() {
                self.slots.resize_with(at + 1, || Slot::Empty);
            }
            self.slots[at] = Slot::Done;
            self.advance();
        }
    }

    fn advance(&mut self) {
        while let Some(Slot::Done) = self.slots.front() {
            let Some(next) = self.low.checked_add(1) else { return };
            self.slots.pop_front();
            self.low = next;
        }
    }

    /// Moves the window so that `seq` is its last slot, abandoning what falls below.
    pub fn slide_to(&mut self, seq: u64) {
        let new_low = seq.saturating_sub(self.cap - 1);
        if new_low <= self.low {
            return;
        }
        let dropped = (new_low - self.low).min(self.slots.len() as u64) as usize;
        self.slots.drain(..dropped);
        self.low = new_low;
        let cap = self.cap;
        self.attested.retain(|_, s| beyond(new_low, cap, *s));
        self.advance();
    }

    /// Records that replica `from` sent `seq` beyond the window; once `quorum` replicas
    /// have, slides to the highest sequence number that `quorum` of them vouch for.
    /// Returns whether the window moved.
    pub fn attest(&mut self, from: NodeId, seq: u64, quorum: usize) -> bool {
        let slot = self.attested.entry(from).or_insert(0);
        *slot = (*slot).max(seq);
        if self.attested.len() < quorum {
            return false;
        }
        let mut seen: Vec<u64> = self.attested.values().copied().collect();
        seen.sort_unstable_by(|a, b| b.cmp(a));
        let before = self.low;
        self.slide_to(seen[quorum - 1]);
        self.low != before
    }
}

/// Whether `seq` lies past the window of `cap` slots from `low`.
fn beyond(low: u64, cap: u64, seq: u64) -> bool {
    seq >= low && seq - low >= cap
}

/// Windows per stream. Each stream is charged to the node whose message opened it, and
/// each (publisher, opener) pair may open a bounded number: a Byzantine node can spend
/// only its own budget, never a correct publisher's or a correct relay's.
#[derive(Debug)]
pub struct Streams<K, T> {
    cap: u32,
    max_per_opener: u32,
    windows: BTreeMap<(NodeId, K), Window<T>>,
    opened: BTreeMap<(NodeId, NodeId), u32>,
}

impl<K: Ord + Copy, T> Streams<K, T> {
    pub fn new(cap: u32, max_per_opener: u32) -> Self {
        Streams { cap, max_per_opener, windows: BTreeMap::new(), opened: BTreeMap::new() }
    }

    /// The window of (publisher, key), opened on `opener`'s budget if it is new.
    pub fn window(&mut self, publisher: NodeId, key: K, opener: NodeId) -> Option<&mut Window<T>> {
        if !self.windows.contains_key(&(publisher, key)) {
            let count = self.opened.entry((publisher, opener)).or_insert(0);
            if *count >= self.max_per_opener {
                return None;
            }
            *count += 1;
            self.windows.insert((publisher, key), Window::new(self.cap));
        }
        self.windows.get_mut(&(publisher, key))
    }

    /// The window of an existing stream.
    pub fn existing(&mut self, publisher: NodeId, key: K) -> Option<&mut Window<T>> {
        self.windows.get_mut(&(publisher, key))
    }

    /// Live instances over all streams (for bounds checks in tests).
    pub fn live(&self) -> usize {
        self.windows.values().map(Window::live).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finished_prefix_is_forgotten_and_stays_done() {
        let mut w: Window<u8> = Window::new(4);
        assert!(matches!(w.entry(2, || 0), Entry::Live(_)));
        w.finish(2);
        assert_eq!(w.low(), 1);
        assert!(matches!(w.entry(2, || 0), Entry::Done));
        w.finish(1);
        assert_eq!((w.low(), w.live()), (3, 0));
        assert!(matches!(w.entry(1, || 0), Entry::Done));
        assert!(matches!(w.entry(7, || 0), Entry::Beyond));
    }

    #[test]
    fn one_replica_cannot_slide_but_f_plus_one_can() {
        let mut w: Window<u8> = Window::new(4);
        for seq in 100..1000 {
            assert!(!w.attest(9, seq, 2));
        }
        assert_eq!(w.low(), 1);
        assert!(w.attest(3, 20, 2));
        // Both vouch for at least 20, so 20 becomes the last slot.
        assert_eq!(w.low(), 17);
        assert!(matches!(w.entry(20, || 0), Entry::Live(_)));
    }

    /// Finding C: sequence numbers up to u64::MAX slide, attest and finish without
    /// overflow, and the last one stays done.
    #[test]
    fn the_last_sequence_number_slides_finishes_and_stays_done() {
        let mut w: Window<u8> = Window::new(4);
        assert!(w.is_beyond(u64::MAX));
        assert!(!w.attest(2, u64::MAX, 2));
        assert!(w.attest(3, u64::MAX, 2));
        assert_eq!(w.low(), u64::MAX - 3);
        w.slide_to(u64::MAX);
        assert!(matches!(w.entry(u64::MAX, || 0), Entry::Live(_)));
        for seq in (u64::MAX - 3..=u64::MAX).rev() {
            w.finish(seq);
        }
        assert_eq!((w.low(), w.live()), (u64::MAX, 1));
        assert!(matches!(w.entry(u64::MAX, || 0), Entry::Done));
        assert!(matches!(w.entry(u64::MAX - 1, || 0), Entry::Done));
        w.slide_to(u64::MAX);
        assert!(!w.attest(4, u64::MAX, 1));
        assert_eq!(w.low(), u64::MAX);
    }

    #[test]
    fn streams_are_bounded_per_publisher_and_opener() {
        let mut s: Streams<u64, ()> = Streams::new(8, 2);
        assert!(s.window(1, 10, 7).is_some());
        assert!(s.window(1, 11, 7).is_some());
        assert!(s.window(1, 12, 7).is_none());
        // Existing streams stay reachable; another opener has its own budget.
        assert!(s.window(1, 10, 7).is_some());
        assert!(s.window(1, 12, 8).is_some());
        assert!(s.window(2, 12, 7).is_some());
    }
}

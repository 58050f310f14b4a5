//! A linearizability checker for the key-value store's registers, in the style of Wing
//! and Gong with Lowe's memoisation (the algorithm Knossos and Porcupine use): per key
//! (linearizability is compositional, so keys are checked apart), search for an order
//! of the operations that respects real time — an operation that completed before
//! another was invoked comes first — and in which every completed operation returns
//! what the store would have returned.
//!
//! Operations whose outcome is unknown (the client gave up waiting) may have taken
//! effect at any point after their invocation, or never: they have no return event, so
//! the search may place them anywhere after their call or leave them out. Before the
//! search, unknown reads are dropped (they change nothing), and so are unknown writes
//! whose value no kept operation may have seen: every completed operation returns the
//! value it found, so such a write, had it taken effect, was either overwritten unseen
//! or the last — and in both cases the history without it is linearizable too. An
//! unknown compare-and-swap returns nothing, yet may have swapped on its expected value
//! (and its own value be seen): so when it is kept, the value it expects counts as seen
//! too, and the unknown writes of that value are kept with it, and so on.

use std::collections::{BTreeMap, HashMap, HashSet};

/// An operation on one key, as a client invoked it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Put(Vec<u8>),
    /// A read, ordered or not: both must return the current value.
    Get,
    Delete,
    Cas {
        expected: Option<Vec<u8>>,
        new: Vec<u8>,
    },
}

/// What an operation returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Return {
    /// put, delete: the value before; get: the current value.
    Value(Option<Vec<u8>>),
    Cas {
        swapped: bool,
        before: Option<Vec<u8>>,
    },
}

/// One operation of a key's history: invoked at `invoked`, and returned `ret` at
/// `completed` — or, with `completed: None`, never (outcome unknown).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    pub call: Call,
    pub invoked: u64,
    pub completed: Option<(u64, Return)>,
}

/// Why a history is not linearizable: the operation the longest valid order could not
/// get past, and the value the key had at that point of that order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub stuck: Operation,
    pub state: Option<Vec<u8>>,
    /// How many operations the longest valid order placed, of those considered.
    pub placed: usize,
    pub considered: usize,
}

/// Values as small numbers, so search states are cheap to copy and remember.
type Value = Option<u32>;

/// An operation with its values numbered.
#[derive(Clone, Copy)]
enum Step {
    Put(u32),
    Get(Value),
    Delete,
    Cas {
        expected: Value,
        new: u32,
    },
    /// A read that returned something no read returns: placed nowhere.
    Impossible,
}

/// The register's transition for `step` from `state`, if what the operation returned
/// (`ret`, `None` when unknown) is what it would return there.
fn apply(step: Step, state: Value, ret: Option<&NumberedReturn>) -> Option<Value> {
    let before_matches = |before: &Value| ret.is_none_or(|_| *before == state);
    match (step, ret) {
        (Step::Put(v), None) => Some(Some(v)),
        (Step::Put(v), Some(NumberedReturn::Value(before))) if before_matches(before) => Some(Some(v)),
        (Step::Get(seen), _) => (seen == state).then_some(state),
        (Step::Delete, None) => Some(None),
        (Step::Delete, Some(NumberedReturn::Value(before))) if before_matches(before) => Some(None),
        (Step::Cas { expected, new }, None) => Some(if state == expected { Some(new) } else { state }),
        (Step::Cas { expected, new }, Some(NumberedReturn::Cas { swapped, before })) => {
            let swaps = state == expected;
            (*before == state && *swapped == swaps).then_some(if swaps { Some(new) } else { state })
        }
        _ => None,
    }
}

enum NumberedReturn {
    Value(Value),
    Cas { swapped: bool, before: Value },
}

/// Numbers every value of `ops`, in order of first appearance.
struct Values(BTreeMap<Vec<u8>, u32>, Vec<Vec<u8>>);

impl Values {
    fn number(&mut self, v: &[u8]) -> u32 {
        if let Some(&n) = self.0.get(v) {
            return n;
        }
        let n = self.1.len() as u32;
        self.0.insert(v.to_vec(), n);
        self.1.push(v.to_vec());
        n
    }

    fn option(&mut self, v: &Option<Vec<u8>>) -> Value {
        v.as_deref().map(|v| self.number(v))
    }

    fn bytes(&self, v: Value) -> Option<Vec<u8>> {
        v.map(|n| self.1[n as usize].clone())
    }
}

/// The operations worth searching over: completed ones, unknown deletes, and unknown
/// writes whose value some kept operation may have seen (see the module docs).
fn relevant(ops: &[Operation]) -> Vec<&Operation> {
    let mut unknown_writes: HashMap<&[u8], Vec<usize>> = HashMap::new();
    // Values seen, whose unknown writes are not kept yet: first what completed ones returned.
    let mut seen: Vec<&[u8]> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        match (&op.call, &op.completed) {
            (_, Some((_, Return::Value(Some(v)) | Return::Cas { before: Some(v), .. }))) => seen.push(v),
            (Call::Put(v) | Call::Cas { new: v, .. }, None) => unknown_writes.entry(v).or_default().push(i),
            _ => {}
        }
    }
    let mut kept: Vec<bool> = ops.iter().map(|op| op.completed.is_some() || op.call == Call::Delete).collect();
    while let Some(v) = seen.pop() {
        for i in unknown_writes.remove(v).unwrap_or_default() {
            kept[i] = true;
            // A kept unknown swap may have swapped on its expected value unseen.
            if let Call::Cas { expected: Some(e), .. } = &ops[i].call {
                seen.push(e);
            }
        }
    }
    ops.iter().zip(kept).filter(|&(_, k)| k).map(|(op, _)| op).collect()
}

/// Checks one key's history, starting from an absent value.
/// A violation is boxed: it is rare, and large next to `Ok(())`.
pub fn check(ops: &[Operation]) -> Result<(), Box<Violation>> {
    let ops = relevant(ops);
    let mut values = Values(BTreeMap::new(), Vec::new());
    let steps: Vec<(Step, Option<NumberedReturn>)> = ops
        .iter()
        .map(|op| {
            let step = match (&op.call, &op.completed) {
                (Call::Put(v), _) => Step::Put(values.number(v)),
                (Call::Get, Some((_, Return::Value(v)))) => Step::Get(values.option(v)),
                // Unknown reads were dropped.
                (Call::Get, _) => Step::Impossible,
                (Call::Delete, _) => Step::Delete,
                (Call::Cas { expected, new }, _) => {
                    Step::Cas { expected: values.option(expected), new: values.number(new) }
                }
            };
            let ret = op.completed.as_ref().map(|(_, r)| match r {
                Return::Value(v) => NumberedReturn::Value(values.option(v)),
                Return::Cas { swapped, before } => {
                    NumberedReturn::Cas { swapped: *swapped, before: values.option(before) }
                }
            });
            (step, ret)
        })
        .collect();

    // Events in time order: (time, return-before-call at equal times, op, is_return). A
    // return at the instant of another's call does not precede it, so calls go first.
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * ops.len());
    for (i, op) in ops.iter().enumerate() {
        events.push((op.invoked, false, i));
        if let Some((at, _)) = &op.completed {
            events.push((*at, true, i));
        }
    }
    events.sort_unstable();
    let list = List::new(events.iter().map(|&(_, is_return, op)| (op, is_return)).collect(), ops.len());
    search(list, &steps).map_err(|(stuck, state, placed)| {
        Box::new(Violation { stuck: ops[stuck].clone(), state: values.bytes(state), placed, considered: ops.len() })
    })
}

/// A doubly linked list of call and return events over an array, with a head sentinel
/// at index 0; an operation's two events are taken out together when it is placed, and
/// put back when the search backtracks over it.
struct List {
    /// Per event (index 0 is the head): (op, is_return), previous, next.
    events: Vec<(usize, bool)>,
    prev: Vec<usize>,
    next: Vec<usize>,
    /// Per op: its call event, and its return event (0: none).
    call: Vec<usize>,
    ret: Vec<usize>,
}

const END: usize = usize::MAX;

impl List {
    fn new(events: Vec<(usize, bool)>, ops: usize) -> List {
        let n = events.len() + 1;
        let mut list = List {
            events: std::iter::once((usize::MAX, false)).chain(events).collect(),
            prev: (0..n).map(|i| i.wrapping_sub(1)).collect(),
            next: (1..=n).map(|i| if i == n { END } else { i }).collect(),
            call: vec![0; ops],
            ret: vec![0; ops],
        };
        for (i, &(op, is_return)) in list.events.iter().enumerate().skip(1) {
            if is_return { list.ret[op] = i } else { list.call[op] = i }
        }
        list
    }

    fn unlink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        self.next[p] = n;
        if n != END {
            self.prev[n] = p;
        }
    }

    fn relink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        self.next[p] = e;
        if n != END {
            self.prev[n] = e;
        }
    }

    /// Takes op's events out (return first, so relinking in reverse restores them).
    fn lift(&mut self, op: usize) {
        if self.ret[op] != 0 {
            self.unlink(self.ret[op]);
        }
        self.unlink(self.call[op]);
    }

    fn unlift(&mut self, op: usize) {
        self.relink(self.call[op]);
        if self.ret[op] != 0 {
            self.relink(self.ret[op]);
        }
    }
}

/// The search; on failure, the op whose return the deepest order stopped at, the state
/// there and how many ops that order had placed.
fn search(mut list: List, steps: &[(Step, Option<NumberedReturn>)]) -> Result<(), (usize, Value, usize)> {
    let words = steps.len().div_ceil(64);
    let mut placed = vec![0u64; words];
    let mut seen: HashSet<(Vec<u64>, Value)> = HashSet::new();
    // Placed ops, each with the state before it.
    let mut stack: Vec<(usize, Value)> = Vec::new();
    let mut state: Value = None;
    let mut deepest = (0, 0usize, None);
    let mut e = list.next[0];
    while e != END {
        let (op, is_return) = list.events[e];
        if !is_return {
            let (step, ret) = &steps[op];
            if let Some(after) = apply(*step, state, ret.as_ref()) {
                placed[op / 64] |= 1 << (op % 64);
                if seen.insert((placed.clone(), after)) {
                    stack.push((op, state));
                    state = after;
                    list.lift(op);
                    e = list.next[0];
                    continue;
                }
                placed[op / 64] &= !(1 << (op % 64));
            }
            e = list.next[e];
            continue;
        }
        // A return of an op not placed yet: undo the last placement and try past it.
        if stack.len() >= deepest.0 {
            deepest = (stack.len(), op, state);
        }
        let Some((last, before)) = stack.pop() else {
            return Err((deepest.1, deepest.2, deepest.0));
        };
        state = before;
        placed[last / 64] &= !(1 << (last % 64));
        list.unlift(last);
        e = list.next[list.call[last]];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Option<Vec<u8>> {
        Some(s.as_bytes().to_vec())
    }

    fn op(call: Call, invoked: u64, completed: Option<(u64, Return)>) -> Operation {
        Operation { call, invoked, completed }
    }

    fn put(value: &str, from: u64, to: u64, before: Option<Vec<u8>>) -> Operation {
        op(Call::Put(value.as_bytes().to_vec()), from, Some((to, Return::Value(before))))
    }

    fn get(from: u64, to: u64, seen: Option<Vec<u8>>) -> Operation {
        op(Call::Get, from, Some((to, Return::Value(seen))))
    }

    fn unknown(call: Call, from: u64) -> Operation {
        op(call, from, None)
    }

    #[test]
    fn sequential_histories_check_against_the_store() {
        let ok = [put("a", 0, 1, None), get(2, 3, v("a")), put("b", 4, 5, v("a")), get(6, 7, v("b"))];
        assert_eq!(check(&ok), Ok(()));
        let stale = [put("a", 0, 1, None), put("b", 2, 3, v("a")), get(4, 5, v("a"))];
        let err = check(&stale).unwrap_err();
        assert_eq!((err.stuck.call, err.state), (Call::Get, v("b")));
        let lost = [put("a", 0, 1, None), get(2, 3, None)];
        assert!(check(&lost).is_err());
    }

    #[test]
    fn concurrent_operations_may_take_effect_in_either_order() {
        // Two overlapping puts; reads after both settle on one, consistently.
        let ops = [put("a", 0, 10, None), put("b", 1, 9, v("a")), get(11, 12, v("b"))];
        assert_eq!(check(&ops), Ok(()));
        let ops = [put("a", 0, 10, v("b")), put("b", 1, 9, None), get(11, 12, v("a"))];
        assert_eq!(check(&ops), Ok(()));
        // But not a read of the first after one that saw the second completed.
        let ops = [put("a", 0, 10, None), put("b", 1, 9, v("a")), get(11, 12, v("b")), get(13, 14, v("a"))];
        assert!(check(&ops).is_err());
    }

    #[test]
    fn unknown_operations_may_or_may_not_have_taken_effect() {
        let seen = [unknown(Call::Put(b"a".to_vec()), 0), get(5, 6, v("a")), get(7, 8, v("a"))];
        assert_eq!(check(&seen), Ok(()));
        let not_seen = [unknown(Call::Put(b"a".to_vec()), 0), get(5, 6, None)];
        assert_eq!(check(&not_seen), Ok(()));
        // Once seen, it cannot be unseen: it took effect, and only once.
        let flicker = [unknown(Call::Put(b"a".to_vec()), 0), get(5, 6, v("a")), get(7, 8, None)];
        assert!(check(&flicker).is_err());
        // Not before it was invoked.
        let early = [get(0, 1, v("a")), unknown(Call::Put(b"a".to_vec()), 2)];
        assert!(check(&early).is_err());
        // An unknown delete explains an absent value, once.
        let deleted = [put("a", 0, 1, None), unknown(Call::Delete, 2), get(5, 6, None)];
        assert_eq!(check(&deleted), Ok(()));
        let back = [put("a", 0, 1, None), unknown(Call::Delete, 2), get(5, 6, None), get(7, 8, v("a"))];
        assert!(check(&back).is_err());
    }

    #[test]
    fn compare_and_swap_returns_and_writes_what_the_store_would() {
        let cas = |expected: Option<Vec<u8>>, new: &str| Call::Cas { expected, new: new.as_bytes().to_vec() };
        let swapped = |before| Return::Cas { swapped: true, before };
        let failed = |before| Return::Cas { swapped: false, before };
        let ok = [
            put("a", 0, 1, None),
            op(cas(v("a"), "b"), 2, Some((3, swapped(v("a"))))),
            op(cas(v("a"), "c"), 4, Some((5, failed(v("b"))))),
            get(6, 7, v("b")),
        ];
        assert_eq!(check(&ok), Ok(()));
        // A swap reported where the value did not match.
        let lie = [put("a", 0, 1, None), op(cas(v("x"), "b"), 2, Some((3, swapped(v("a")))))];
        assert!(check(&lie).is_err());
        // An unknown cas swaps exactly when its expectation holds where it is placed.
        let maybe = [put("a", 0, 1, None), unknown(cas(v("a"), "b"), 2), get(5, 6, v("b"))];
        assert_eq!(check(&maybe), Ok(()));
        let never = [put("a", 0, 1, None), unknown(cas(v("z"), "b"), 2), get(5, 6, v("b"))];
        assert!(check(&never).is_err());
    }

    /// An unknown put no completed operation saw is kept when an unknown swap seen may
    /// have swapped on it, down a chain of them: put x, cas x -> y, cas y -> z, get z.
    #[test]
    fn an_unseen_unknown_write_an_unknown_swap_may_have_swapped_on_is_kept() {
        let cas = |expected: &str, new: &str| unknown(Call::Cas { expected: v(expected), new: new.into() }, 1);
        let ops = [unknown(Call::Put(b"x".to_vec()), 0), cas("x", "y"), get(5, 6, v("y"))];
        assert_eq!(check(&ops), Ok(()), "a linearizable history (put x, cas x->y, get y) was rejected");
        let chain = [unknown(Call::Put(b"x".to_vec()), 0), cas("x", "y"), cas("y", "z"), get(5, 6, v("z"))];
        assert_eq!(check(&chain), Ok(()));
        // Without the put, nothing explains the "y" the first swap expects.
        assert!(check(&chain[1..]).is_err());
    }

    fn cas(expected: Option<Vec<u8>>, new: &str) -> Call {
        Call::Cas { expected, new: new.as_bytes().to_vec() }
    }

    fn cas_done(
        expected: Option<Vec<u8>>,
        new: &str,
        from: u64,
        to: u64,
        swapped: bool,
        before: Option<Vec<u8>>,
    ) -> Operation {
        op(cas(expected, new), from, Some((to, Return::Cas { swapped, before })))
    }

    #[test]
    fn a_read_after_a_completed_write_that_returns_the_older_value_is_rejected() {
        // Two clients: one writes b over a and is told so; a later read by another sees a.
        let ops = [put("a", 0, 10, None), put("b", 20, 30, v("a")), get(31, 40, v("a"))];
        assert!(check(&ops).is_err());
        // Even when the stale read overlaps a third write that could not restore a.
        let ops = [put("a", 0, 10, None), put("b", 20, 30, v("a")), put("c", 32, 50, v("b")), get(35, 45, v("a"))];
        assert!(check(&ops).is_err());
        // Seen fresh, then stale again: a read may not go back in time.
        let ops = [put("a", 0, 10, None), put("b", 15, 40, v("a")), get(20, 25, v("b")), get(30, 35, v("a"))];
        assert!(check(&ops).is_err());
    }

    #[test]
    fn a_swap_acknowledged_and_then_not_seen_is_rejected() {
        // The swap a -> b succeeded, yet the next read finds a: the swap was lost.
        let ops = [put("a", 0, 10, None), cas_done(v("a"), "b", 20, 30, true, v("a")), get(40, 50, v("a"))];
        assert!(check(&ops).is_err());
        // Two swaps from the same value cannot both succeed.
        let ops = [
            put("a", 0, 10, None),
            cas_done(v("a"), "b", 20, 40, true, v("a")),
            cas_done(v("a"), "c", 21, 41, true, v("a")),
        ];
        assert!(check(&ops).is_err());
        // A swap that failed while its expectation held (no concurrent write) is a lie.
        let ops = [put("a", 0, 10, None), cas_done(v("a"), "b", 20, 30, false, v("a"))];
        assert!(check(&ops).is_err());
        // A failed swap may not have written.
        let ops = [put("a", 0, 10, None), cas_done(v("x"), "b", 20, 30, false, v("a")), get(40, 50, v("b"))];
        assert!(check(&ops).is_err());
    }

    #[test]
    fn a_read_of_a_value_nobody_wrote_is_rejected() {
        assert!(check(&[get(0, 1, v("ghost"))]).is_err());
        assert!(check(&[put("a", 0, 10, None), get(20, 30, v("ghost"))]).is_err());
        // Concurrent with every write, it still matches none of them.
        let ops = [put("a", 0, 100, None), get(1, 99, v("ghost")), put("b", 2, 98, v("a"))];
        assert!(check(&ops).is_err());
        // Unknown operations write only what they were asked to.
        let ops = [unknown(Call::Put(b"a".to_vec()), 0), unknown(cas(v("a"), "b"), 1), get(5, 6, v("ghost"))];
        assert!(check(&ops).is_err());
        // A write's answer that reports a value nobody wrote as the one before it.
        assert!(check(&[put("a", 0, 10, v("ghost"))]).is_err());
        assert!(check(&[cas_done(None, "a", 0, 10, false, v("ghost"))]).is_err());
        // A delete's too.
        assert!(check(&[op(Call::Delete, 0, Some((10, Return::Value(v("ghost")))))]).is_err());
    }

    #[test]
    fn concurrent_operations_in_an_order_no_interleaving_explains_are_rejected() {
        // a and b written concurrently; one reader sees a then b, another b then a.
        let ops = [
            put("a", 0, 100, None),
            put("b", 0, 100, None),
            get(1, 2, v("a")),
            get(3, 4, v("b")),
            get(1, 2, v("b")),
            get(3, 4, v("a")),
        ];
        assert!(check(&ops).is_err());
        // Both puts claim to have found the key empty, which only one of them can.
        let ops = [put("a", 0, 100, None), put("b", 0, 100, None)];
        assert!(check(&ops).is_err());
        // Each saw the other's value before it: a cycle.
        let ops = [put("a", 0, 100, v("b")), put("b", 0, 100, v("a"))];
        assert!(check(&ops).is_err());
        // A read overlapping nothing cannot see a write invoked after it returned.
        let ops = [get(0, 10, v("a")), put("a", 20, 30, None)];
        assert!(check(&ops).is_err());
    }

    #[test]
    fn linearizable_histories_with_overlap_are_accepted() {
        // Concurrent puts, each finding the other's value or none, in one order.
        let ops =
            [put("a", 0, 100, None), put("b", 0, 100, v("a")), get(1, 2, None), get(3, 4, v("a")), get(5, 200, v("b"))];
        assert_eq!(check(&ops), Ok(()));
        // A read overlapping a write may see either side of it.
        let ops = [put("a", 0, 10, None), put("b", 20, 40, v("a")), get(21, 30, v("a")), get(25, 35, v("b"))];
        assert_eq!(check(&ops), Ok(()));
        // Racing swaps: one wins, the other fails against the winner's value.
        let ops = [
            put("a", 0, 10, None),
            cas_done(v("a"), "b", 20, 40, true, v("a")),
            cas_done(v("a"), "c", 21, 41, false, v("b")),
            get(50, 60, v("b")),
        ];
        assert_eq!(check(&ops), Ok(()));
        // Delete then put, a read between them in real time sees nothing.
        let ops = [
            put("a", 0, 10, None),
            op(Call::Delete, 20, Some((30, Return::Value(v("a"))))),
            get(31, 32, None),
            put("b", 40, 50, None),
            get(51, 52, v("b")),
        ];
        assert_eq!(check(&ops), Ok(()));
        // A swap expecting absence succeeds on an empty key.
        let ops = [cas_done(None, "a", 0, 10, true, None), get(11, 12, v("a"))];
        assert_eq!(check(&ops), Ok(()));
    }

    #[test]
    fn a_long_history_with_many_unknown_writes_is_searched_without_blowing_up() {
        let mut ops = Vec::new();
        let mut last = None;
        for i in 0..5_000u64 {
            let value = format!("v{i}");
            ops.push(put(&value, 10 * i, 10 * i + 5, last.clone()));
            ops.push(unknown(Call::Put(format!("lost{i}").into_bytes()), 10 * i + 1));
            ops.push(get(10 * i + 6, 10 * i + 9, v(&value)));
            last = v(&value);
        }
        assert_eq!(check(&ops), Ok(()));
        ops.push(get(50_000, 50_001, v("v17")));
        assert!(check(&ops).is_err());
    }
}

//! A small deterministic key-value store: the application `phalanxd` replicas serve and
//! the simulator's replicas execute, and the reference the checker replays the agreed
//! order against.
//!
//! PBFT orders opaque bytes, so operations and results are bytes too. Every field is
//! length-prefixed (`len` is a u32, little-endian), so no two values share an encoding:
//!
//! | operation | encoding |
//! |---|---|
//! | put(key, value) | `P` field(key) field(value) |
//! | get(key) | `G` field(key) |
//! | delete(key) | `D` field(key) |
//! | cas(key, expected, new) | `C` field(key) option(expected) field(new) |
//!
//! where field(x) = len(x) x, and option(x) = `0` for none, `1` field(x) for some.
//!
//! | result | encoding |
//! |---|---|
//! | value: put and delete give the value before, get the current one | `V` option(value) |
//! | cas swapped (the current value was `expected`, now it is `new`) | `S` option(before) |
//! | cas failed (the current value was not `expected`; unchanged) | `F` option(current) |
//! | the operation did not decode (unchanged) | `E` utf-8 reason |
//!
//! Decoding is total: garbage yields an error (an `E` result from [`Kv::execute`]),
//! never a panic, and never allocates more than its input. Snapshots list the entries
//! in ascending key order as field(key) field(value); [`Kv::restore`] accepts only that
//! canonical form, so equal snapshots mean equal states and equal digests.
//!
//! [`Kv::digest`] names the state without encoding it: the XOR of
//! BLAKE3(field(key) field(value)) over the entries. A write leaves its entry unhashed; the
//! digest hashes the entries written since it was last asked for, each once however often
//! it was written, so a host that reports it now and then (phalanxd's metrics, which the
//! fault-injection suite compares replicas by) does not hash every value it stores.

use std::collections::BTreeMap;

use crate::Operation;
use crate::crypto::Digest;
use crate::host::Application;

/// A decoded operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Get {
        key: Vec<u8>,
    },
    Delete {
        key: Vec<u8>,
    },
    /// Writes `new` only if the current value is `expected` (`None`: the key is absent).
    Cas {
        key: Vec<u8>,
        expected: Option<Vec<u8>>,
        new: Vec<u8>,
    },
}

/// A decoded result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// put, delete: the value before; get: the current value.
    Value(Option<Vec<u8>>),
    /// cas: whether the expected value matched (and `new` was written), and the value before.
    Cas { swapped: bool, before: Option<Vec<u8>> },
    /// The operation did not decode; the store is unchanged.
    Invalid(String),
}

pub fn put(key: &[u8], value: &[u8]) -> Vec<u8> {
    Op::Put { key: key.to_vec(), value: value.to_vec() }.encode()
}

pub fn get(key: &[u8]) -> Vec<u8> {
    Op::Get { key: key.to_vec() }.encode()
}

pub fn delete(key: &[u8]) -> Vec<u8> {
    Op::Delete { key: key.to_vec() }.encode()
}

pub fn cas(key: &[u8], expected: Option<&[u8]>, new: &[u8]) -> Vec<u8> {
    Op::Cas { key: key.to_vec(), expected: expected.map(<[u8]>::to_vec), new: new.to_vec() }.encode()
}

fn field(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn option(out: &mut Vec<u8>, value: Option<&[u8]>) {
    match value {
        None => out.push(0),
        Some(v) => {
            out.push(1);
            field(out, v);
        }
    }
}

/// A cursor over untrusted bytes: every read checks the length first.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, String> {
        let (&b, rest) = self.0.split_first().ok_or("truncated: expected a tag byte")?;
        self.0 = rest;
        Ok(b)
    }

    fn field(&mut self) -> Result<&'a [u8], String> {
        let (len, rest) = self.0.split_first_chunk::<4>().ok_or("truncated: expected a length")?;
        let len = u32::from_le_bytes(*len) as usize;
        if rest.len() < len {
            return Err(format!("truncated: a field of {len} bytes with {} left", rest.len()));
        }
        let (value, rest) = rest.split_at(len);
        self.0 = rest;
        Ok(value)
    }

    fn option(&mut self) -> Result<Option<&'a [u8]>, String> {
        match self.byte()? {
            0 => Ok(None),
            1 => self.field().map(Some),
            b => Err(format!("option tag {b} is neither 0 nor 1")),
        }
    }

    fn finish<T>(&self, value: T) -> Result<T, String> {
        if self.0.is_empty() { Ok(value) } else { Err(format!("{} trailing bytes", self.0.len())) }
    }
}

impl Op {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Op::Put { key, value } => {
                out.push(b'P');
                field(&mut out, key);
                field(&mut out, value);
            }
            Op::Get { key } => {
                out.push(b'G');
                field(&mut out, key);
            }
            Op::Delete { key } => {
                out.push(b'D');
                field(&mut out, key);
            }
            Op::Cas { key, expected, new } => {
                out.push(b'C');
                field(&mut out, key);
                option(&mut out, expected.as_deref());
                field(&mut out, new);
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Op, String> {
        let mut r = Reader(bytes);
        let op = match r.byte()? {
            b'P' => Op::Put { key: r.field()?.to_vec(), value: r.field()?.to_vec() },
            b'G' => Op::Get { key: r.field()?.to_vec() },
            b'D' => Op::Delete { key: r.field()?.to_vec() },
            b'C' => Op::Cas {
                key: r.field()?.to_vec(),
                expected: r.option()?.map(<[u8]>::to_vec),
                new: r.field()?.to_vec(),
            },
            t => return Err(format!("unknown operation tag {t:#04x}")),
        };
        r.finish(op)
    }
}

impl Reply {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Reply::Value(v) => {
                out.push(b'V');
                option(&mut out, v.as_deref());
            }
            Reply::Cas { swapped, before } => {
                out.push(if *swapped { b'S' } else { b'F' });
                option(&mut out, before.as_deref());
            }
            Reply::Invalid(why) => {
                out.push(b'E');
                out.extend_from_slice(why.as_bytes());
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Reply, String> {
        let mut r = Reader(bytes);
        let reply = match r.byte()? {
            b'V' => Reply::Value(r.option()?.map(<[u8]>::to_vec)),
            tag @ (b'S' | b'F') => Reply::Cas { swapped: tag == b'S', before: r.option()?.map(<[u8]>::to_vec) },
            b'E' => return Ok(Reply::Invalid(String::from_utf8_lossy(r.0).into_owned())),
            t => return Err(format!("unknown result tag {t:#04x}")),
        };
        r.finish(reply)
    }
}

/// The store: a `BTreeMap`, so snapshots come out in one order on every run.
#[derive(Clone, Debug, Default)]
pub struct Kv {
    map: BTreeMap<Vec<u8>, Entry>,
    /// The XOR of the hashes of the entries that have one.
    hashed: Digest,
    /// How many entries were written since the digest was last asked for: they have no
    /// hash yet.
    unhashed: usize,
}

/// Equal entries are equal stores, however far each has hashed them.
impl PartialEq for Kv {
    fn eq(&self, other: &Self) -> bool {
        self.entries().eq(other.entries())
    }
}

impl Eq for Kv {}

/// A value, with its entry's hash once the digest took it in, so that overwriting or
/// removing it need not hash the old value again.
#[derive(Clone, Debug)]
struct Entry {
    value: Vec<u8>,
    hash: Option<Digest>,
}

/// What an entry adds to (and, removed, takes from) [`Kv::digest`]: BLAKE3 of
/// field(key) field(value), hashed in place rather than copied together first.
fn entry_hash(key: &[u8], value: &[u8]) -> Digest {
    let mut hasher = blake3::Hasher::new();
    for bytes in [key, value] {
        hasher.update(&(bytes.len() as u32).to_le_bytes());
        hasher.update(bytes);
    }
    *hasher.finalize().as_bytes()
}

fn xor(into: &mut Digest, other: &Digest) {
    into.iter_mut().zip(other).for_each(|(a, b)| *a ^= b);
}

impl Kv {
    pub fn new() -> Self {
        Kv::default()
    }

    /// Executes one encoded operation and returns the encoded result.
    pub fn execute(&mut self, op: &[u8]) -> Vec<u8> {
        self.apply(op).encode()
    }

    /// Evaluates a read-only operation (a get) without changing the store; any other
    /// operation is an error result.
    pub fn query(&self, op: &[u8]) -> Vec<u8> {
        let reply = match Op::decode(op) {
            Ok(Op::Get { key }) => Reply::Value(self.get(&key).map(<[u8]>::to_vec)),
            Ok(_) => Reply::Invalid("not a read-only operation".into()),
            Err(why) => Reply::Invalid(why),
        };
        reply.encode()
    }

    fn apply(&mut self, op: &[u8]) -> Reply {
        match Op::decode(op) {
            Ok(Op::Put { key, value }) => Reply::Value(self.insert(key, value)),
            Ok(Op::Get { key }) => Reply::Value(self.get(&key).map(<[u8]>::to_vec)),
            Ok(Op::Delete { key }) => Reply::Value(self.remove(&key)),
            Ok(Op::Cas { key, expected, new }) => {
                let before = self.get(&key).map(<[u8]>::to_vec);
                let swapped = before == expected;
                if swapped {
                    self.insert(key, new);
                }
                Reply::Cas { swapped, before }
            }
            Err(why) => Reply::Invalid(why),
        }
    }

    fn insert(&mut self, key: Vec<u8>, value: Vec<u8>) -> Option<Vec<u8>> {
        self.unhashed += 1;
        let old = self.map.insert(key, Entry { value, hash: None })?;
        self.forget(old.hash);
        Some(old.value)
    }

    fn remove(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        let old = self.map.remove(key)?;
        self.forget(old.hash);
        Some(old.value)
    }

    /// Takes a replaced or removed entry out of the digest: its hash if the digest took it
    /// in, else out of the count of entries it has yet to.
    fn forget(&mut self, hash: Option<Digest>) {
        match hash {
            Some(hash) => xor(&mut self.hashed, &hash),
            None => self.unhashed -= 1,
        }
    }

    /// A digest of the whole state ([module docs](self)): equal states have equal digests,
    /// whatever writes led to them. Hashes the entries written since the last call,
    /// walking the store to find them.
    pub fn digest(&mut self) -> Digest {
        if self.unhashed > 0 {
            for (key, entry) in self.map.iter_mut().filter(|(_, e)| e.hash.is_none()) {
                let hash = entry_hash(key, &entry.value);
                xor(&mut self.hashed, &hash);
                entry.hash = Some(hash);
            }
            self.unhashed = 0;
        }
        self.hashed
    }

    /// Every key with its value, in key order.
    fn entries(&self) -> impl Iterator<Item = (&Vec<u8>, &Vec<u8>)> {
        self.map.iter().map(|(k, e)| (k, &e.value))
    }

    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.map.get(key).map(|e| e.value.as_slice())
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The canonical encoding of the whole state.
    pub fn snapshot(&self) -> Vec<u8> {
        // Sized up front: a state of megabytes would otherwise be copied as it grows.
        let mut out = Vec::with_capacity(self.entries().map(|(k, v)| 8 + k.len() + v.len()).sum());
        for (k, v) in self.entries() {
            field(&mut out, k);
            field(&mut out, v);
        }
        out
    }

    /// The state a [`snapshot`](Self::snapshot) encodes; anything else is an error.
    pub fn restore(bytes: &[u8]) -> Result<Kv, String> {
        let mut r = Reader(bytes);
        let mut kv = Kv::new();
        while !r.0.is_empty() {
            let (k, v) = (r.field()?, r.field()?);
            if kv.map.last_key_value().is_some_and(|(last, _)| last.as_slice() >= k) {
                return Err("snapshot keys are not in strictly ascending order".into());
            }
            kv.insert(k.to_vec(), v.to_vec());
        }
        Ok(kv)
    }
}

impl Application for Kv {
    fn execute(&mut self, _seq: u64, ops: &[Operation]) -> Vec<Vec<u8>> {
        ops.iter().map(|o| Kv::execute(self, &o.op)).collect()
    }

    fn snapshot(&self) -> Vec<u8> {
        Kv::snapshot(self)
    }

    fn restore(&mut self, _seq: u64, snapshot: &[u8]) -> Result<(), String> {
        *self = Kv::restore(snapshot)?;
        Ok(())
    }

    fn query(&self, op: &[u8]) -> Option<Vec<u8>> {
        Some(Kv::query(self, op))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(kv: &mut Kv, op: Vec<u8>) -> Reply {
        Reply::decode(&kv.execute(&op)).expect("results decode")
    }

    fn some(v: &[u8]) -> Option<Vec<u8>> {
        Some(v.to_vec())
    }

    #[test]
    fn operations_return_what_they_document() {
        let mut kv = Kv::new();
        assert_eq!(run(&mut kv, get(b"a")), Reply::Value(None));
        assert_eq!(run(&mut kv, put(b"a", b"1")), Reply::Value(None));
        assert_eq!(run(&mut kv, put(b"a", b"2")), Reply::Value(some(b"1")));
        assert_eq!(run(&mut kv, get(b"a")), Reply::Value(some(b"2")));
        assert_eq!(run(&mut kv, cas(b"a", Some(b"1"), b"3")), Reply::Cas { swapped: false, before: some(b"2") });
        assert_eq!(run(&mut kv, cas(b"a", Some(b"2"), b"3")), Reply::Cas { swapped: true, before: some(b"2") });
        assert_eq!(run(&mut kv, cas(b"b", None, b"x")), Reply::Cas { swapped: true, before: None });
        assert_eq!(run(&mut kv, cas(b"b", None, b"y")), Reply::Cas { swapped: false, before: some(b"x") });
        assert_eq!(run(&mut kv, delete(b"a")), Reply::Value(some(b"3")));
        assert_eq!(run(&mut kv, delete(b"a")), Reply::Value(None));
        assert_eq!(kv.get(b"b"), Some(&b"x"[..]));
        assert_eq!(kv.len(), 1);
    }

    #[test]
    fn empty_keys_and_values_are_values_like_any_other() {
        let mut kv = Kv::new();
        assert_eq!(run(&mut kv, put(b"", b"")), Reply::Value(None));
        assert_eq!(run(&mut kv, get(b"")), Reply::Value(some(b"")));
        assert_eq!(run(&mut kv, cas(b"", Some(b""), b"z")), Reply::Cas { swapped: true, before: some(b"") });
    }

    #[test]
    fn encodings_roundtrip() {
        let ops = [
            Op::Put { key: b"k".to_vec(), value: b"v".to_vec() },
            Op::Get { key: vec![] },
            Op::Delete { key: vec![0, 1, 2] },
            Op::Cas { key: b"k".to_vec(), expected: None, new: b"n".to_vec() },
            Op::Cas { key: b"k".to_vec(), expected: some(b""), new: vec![] },
        ];
        for op in ops {
            assert_eq!(Op::decode(&op.encode()), Ok(op));
        }
        let replies = [
            Reply::Value(None),
            Reply::Value(some(b"v")),
            Reply::Cas { swapped: true, before: None },
            Reply::Cas { swapped: false, before: some(b"x") },
            Reply::Invalid("why".into()),
        ];
        for reply in replies {
            assert_eq!(Reply::decode(&reply.encode()), Ok(reply));
        }
    }

    #[test]
    fn garbage_is_an_error_result_and_changes_nothing() {
        let mut kv = Kv::new();
        kv.execute(&put(b"a", b"1"));
        let before = kv.clone();
        let mut garbage: Vec<Vec<u8>> = vec![vec![], vec![b'X'], vec![b'P', 0xff, 0xff, 0xff, 0xff], b"G\x01".to_vec()];
        let valid = cas(b"key", Some(b"old"), b"new");
        garbage.extend((0..valid.len()).map(|len| valid[..len].to_vec()));
        garbage.push([&valid[..], b"!"].concat());
        let mut bad_option = valid.clone();
        bad_option[1 + 4 + 3] = 7;
        garbage.push(bad_option);
        for g in garbage {
            assert!(Op::decode(&g).is_err(), "{g:?} decoded");
            assert!(matches!(run(&mut kv, g.clone()), Reply::Invalid(_)), "{g:?}");
        }
        assert_eq!(kv, before);
        assert!(Reply::decode(b"").is_err());
        assert!(Reply::decode(b"V\x01\x05\x00\x00\x00ab").is_err());
        assert!(Reply::decode(b"S\x00trailing").is_err());
    }

    #[test]
    fn every_byte_string_decodes_without_panic() {
        // Every input of up to 6 bytes over the bytes that matter to the decoder.
        let alphabet = [0u8, 1, 2, b'P', b'G', b'D', b'C', b'V', b'S', b'F', b'E', 0xff];
        let mut kv = Kv::new();
        let mut layer = vec![vec![]];
        for _ in 0..6 {
            for input in &layer {
                let _ = Op::decode(input);
                let _ = Reply::decode(input);
                let _ = Kv::restore(input);
                kv.execute(input);
            }
            layer = layer.iter().flat_map(|p| alphabet.iter().map(move |&b| [&p[..], &[b]].concat())).collect();
        }
    }

    #[test]
    fn the_digest_follows_the_state_not_the_writes_that_made_it() {
        let mut a = Kv::new();
        let empty = a.digest();
        for op in [put(b"k", b"1"), put(b"j", b"2"), cas(b"k", Some(b"1"), b"3"), delete(b"j"), put(b"j", b"")] {
            a.execute(&op);
        }
        let mut b = Kv::new();
        b.execute(&put(b"j", b""));
        b.execute(&put(b"k", b"3"));
        assert_eq!(a.digest(), b.digest());
        assert_eq!(Kv::restore(&a.snapshot()).unwrap().digest(), a.digest());
        b.execute(&cas(b"k", Some(b"2"), b"4"));
        assert_eq!(a.digest(), b.digest(), "a failed cas changes nothing");
        b.execute(&put(b"k", b"4"));
        assert_ne!(a.digest(), b.digest());
        for key in [&b"j"[..], b"k"] {
            b.execute(&delete(key));
        }
        assert_eq!(b.digest(), empty);
    }

    /// However the digest is asked for between writes (entries hashed, then overwritten
    /// or removed; written twice before it is asked), it is the digest of the state.
    #[test]
    fn the_digest_asked_for_now_and_then_is_the_states() {
        let mut kv = Kv::new();
        let mut x: u64 = 7;
        for i in 0..2_000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let key = [(x >> 60) as u8];
            let op = match (x >> 40) % 4 {
                0 => delete(&key),
                1 => cas(&key, Some(&[(x >> 20) as u8 % 3]), &i.to_le_bytes()),
                _ => put(&key, &[(x >> 20) as u8 % 3]),
            };
            kv.execute(&op);
            if (x >> 8).is_multiple_of(5) {
                let fresh = Kv::restore(&kv.snapshot()).expect("snapshots restore").digest();
                assert_eq!(kv.digest(), fresh, "after write {i}");
            }
        }
    }

    #[test]
    fn snapshots_are_canonical_and_restore_exactly() {
        let mut a = Kv::new();
        let mut b = Kv::new();
        for (k, v) in [(&b"z"[..], &b"1"[..]), (b"a", b""), (b"m", b"3")] {
            a.execute(&put(k, v));
        }
        for (k, v) in [(&b"m"[..], &b"3"[..]), (b"a", b""), (b"z", b"1")] {
            b.execute(&put(k, v));
        }
        assert_eq!(a.snapshot(), b.snapshot(), "insertion order must not show");
        assert_eq!(a.digest(), b.digest());
        assert_eq!(Kv::restore(&a.snapshot()), Ok(a.clone()));
        assert_eq!(Kv::restore(&[]), Ok(Kv::new()));
        assert_eq!(Kv::new().snapshot(), Vec::<u8>::new());

        let snap = a.snapshot();
        for len in 0..snap.len() {
            let cut = Kv::restore(&snap[..len]);
            // A prefix ending exactly between entries is a valid smaller state.
            assert!(cut.is_err() || cut.unwrap().len() < a.len(), "prefix {len}");
        }
        // Out of order or duplicated keys: the same state could then have two encodings.
        let mut swapped = Vec::new();
        for (k, v) in [(&b"b"[..], &b"1"[..]), (b"a", b"2")] {
            field(&mut swapped, k);
            field(&mut swapped, v);
        }
        assert!(Kv::restore(&swapped).is_err());
        let mut dup = Vec::new();
        for _ in 0..2 {
            field(&mut dup, b"a");
            field(&mut dup, b"1");
        }
        assert!(Kv::restore(&dup).is_err());
    }
}

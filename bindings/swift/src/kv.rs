//! The key-value application `phalanxd` replicates: its operation encoders, its results,
//! and the store itself (for Swift replicas that serve it).

use std::sync::Mutex;

use phalanx_core::kv::{self, Kv, Reply};

use crate::errors::PhalanxError;

/// A key-value result.
#[uniffi::remote(Enum)]
pub enum Reply {
    /// put, delete: the value before; get: the current value (`nil`: absent).
    Value(Option<Vec<u8>>),
    /// cas: whether the expected value matched (and the new one was written), and the
    /// value before.
    Cas { swapped: bool, before: Option<Vec<u8>> },
    /// The operation did not decode; the store is unchanged.
    Invalid(String),
}

/// put(key, value); its result is the value before.
#[uniffi::export]
pub fn kv_put(key: Vec<u8>, value: Vec<u8>) -> Vec<u8> {
    kv::put(&key, &value)
}

/// get(key); its result is the current value.
#[uniffi::export]
pub fn kv_get(key: Vec<u8>) -> Vec<u8> {
    kv::get(&key)
}

/// delete(key); its result is the value before.
#[uniffi::export]
pub fn kv_delete(key: Vec<u8>) -> Vec<u8> {
    kv::delete(&key)
}

/// Compare-and-swap: writes `new` if the value is `expected` (`nil`: absent).
#[uniffi::export]
pub fn kv_cas(key: Vec<u8>, expected: Option<Vec<u8>>, new: Vec<u8>) -> Vec<u8> {
    kv::cas(&key, expected.as_deref(), &new)
}

/// Decodes a result; a `.kv` error if the bytes are not one.
#[uniffi::export]
pub fn kv_decode_reply(reply: Vec<u8>) -> Result<Reply, PhalanxError> {
    Reply::decode(&reply).map_err(|e| PhalanxError::Kv { message: format!("result does not decode: {e}") })
}

/// The store `phalanxd` replicates, for a Swift `Application` to serve: its results, its
/// answers to reads and its snapshots are byte for byte those of native replicas.
#[derive(Default, uniffi::Object)]
pub struct KvStore {
    kv: Mutex<Kv>,
}

impl KvStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, Kv> {
        self.kv.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[uniffi::export]
impl KvStore {
    #[uniffi::constructor]
    pub fn new() -> Self {
        KvStore::default()
    }

    /// Executes one encoded operation; its encoded result.
    pub fn execute(&self, op: Vec<u8>) -> Vec<u8> {
        self.lock().execute(&op)
    }

    /// Evaluates a read-only op (a get) without changing the store.
    pub fn query(&self, op: Vec<u8>) -> Vec<u8> {
        self.lock().query(&op)
    }

    pub fn snapshot(&self) -> Vec<u8> {
        self.lock().snapshot()
    }

    /// Replaces the store with a snapshot; a `.kv` error if it is not one.
    pub fn restore(&self, snapshot: Vec<u8>) -> Result<(), PhalanxError> {
        let kv = Kv::restore(&snapshot)
            .map_err(|e| PhalanxError::Kv { message: format!("snapshot does not decode: {e}") })?;
        *self.lock() = kv;
        Ok(())
    }

    pub fn get(&self, key: Vec<u8>) -> Option<Vec<u8>> {
        self.lock().get(&key).map(<[u8]>::to_vec)
    }

    pub fn count(&self) -> u64 {
        self.lock().len() as u64
    }
}

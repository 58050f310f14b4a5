//! The key-value application `phalanxd` replicates: operation encoders, result decoding
//! and the store itself (`phalanx_core::kv`), so a JavaScript replica running it agrees
//! byte for byte with native ones.

use napi_derive::napi;
use phalanx_core::kv::{self, Kv, Reply};

use crate::convert::Bytes;
use crate::{Code, Result, fail};

/// put(key, value); its result is the value before.
#[napi(ts_return_type = "Buffer")]
pub fn kv_put(
    #[napi(ts_arg_type = "Uint8Array")] key: Bytes,
    #[napi(ts_arg_type = "Uint8Array")] value: Bytes,
) -> Bytes {
    Bytes(kv::put(&key.0, &value.0))
}

/// get(key); its result is the current value.
#[napi(ts_return_type = "Buffer")]
pub fn kv_get(#[napi(ts_arg_type = "Uint8Array")] key: Bytes) -> Bytes {
    Bytes(kv::get(&key.0))
}

/// delete(key); its result is the value before.
#[napi(ts_return_type = "Buffer")]
pub fn kv_delete(#[napi(ts_arg_type = "Uint8Array")] key: Bytes) -> Bytes {
    Bytes(kv::delete(&key.0))
}

/// Compare-and-swap: write `next` if the value is `expected` (`null`: absent).
#[napi(ts_return_type = "Buffer")]
pub fn kv_cas(
    #[napi(ts_arg_type = "Uint8Array")] key: Bytes,
    #[napi(ts_arg_type = "Uint8Array | null")] expected: Option<Bytes>,
    #[napi(ts_arg_type = "Uint8Array")] next: Bytes,
) -> Bytes {
    Bytes(kv::cas(&key.0, expected.as_ref().map(|e| e.0.as_slice()), &next.0))
}

/// A decoded key-value result.
#[napi(discriminant = "type", discriminant_case = "lowercase")]
pub enum KvReply {
    /// put, delete: the value before; get: the current value (`null`: absent).
    Value {
        #[napi(ts_type = "Buffer | null")]
        value: Option<Bytes>,
    },
    /// cas: whether it wrote, and the value before.
    Cas {
        swapped: bool,
        #[napi(ts_type = "Buffer | null")]
        before: Option<Bytes>,
    },
}

/// Decodes a key-value result; throws `KvError` for an invalid-operation result or bytes
/// that do not decode.
#[napi]
pub fn kv_decode_reply(#[napi(ts_arg_type = "Uint8Array")] reply: Bytes) -> Result<KvReply> {
    match Reply::decode(&reply.0).map_err(|e| fail(Code::Kv, format!("result does not decode: {e}")))? {
        Reply::Value(v) => Ok(KvReply::Value { value: v.map(Bytes) }),
        Reply::Cas { swapped, before } => Ok(KvReply::Cas { swapped, before: before.map(Bytes) }),
        Reply::Invalid(why) => Err(fail(Code::Kv, format!("the replicas rejected the operation: {why}"))),
    }
}

/// The key-value store phalanxd replicates, as a replica application: `execute(op)`,
/// `query(op)` (a get, read-only), `snapshot()`, `restore(snapshot)`.
#[napi]
#[derive(Default)]
pub struct KvStore {
    kv: Kv,
}

#[napi]
impl KvStore {
    #[napi(constructor)]
    pub fn new() -> Self {
        KvStore { kv: Kv::new() }
    }

    #[napi(ts_return_type = "Buffer")]
    pub fn execute(&mut self, #[napi(ts_arg_type = "Uint8Array")] op: Bytes) -> Bytes {
        Bytes(self.kv.execute(&op.0))
    }

    /// Evaluates a read-only op (a get) without changing the store.
    #[napi(ts_return_type = "Buffer")]
    pub fn query(&self, #[napi(ts_arg_type = "Uint8Array")] op: Bytes) -> Bytes {
        Bytes(self.kv.query(&op.0))
    }

    #[napi(ts_return_type = "Buffer")]
    pub fn snapshot(&self) -> Bytes {
        Bytes(self.kv.snapshot())
    }

    /// Throws `KvError` for a snapshot that does not decode.
    #[napi]
    pub fn restore(&mut self, #[napi(ts_arg_type = "Uint8Array")] snapshot: Bytes) -> Result<()> {
        self.kv = Kv::restore(&snapshot.0).map_err(|e| fail(Code::Kv, format!("snapshot does not decode: {e}")))?;
        Ok(())
    }

    /// The value at `key`, or `null`.
    #[napi(ts_return_type = "Buffer | null")]
    pub fn get(&self, #[napi(ts_arg_type = "Uint8Array")] key: Bytes) -> Option<Bytes> {
        self.kv.get(&key.0).map(|v| Bytes(v.to_vec()))
    }

    #[napi(getter)]
    pub fn size(&self) -> u32 {
        self.kv.len() as u32
    }
}

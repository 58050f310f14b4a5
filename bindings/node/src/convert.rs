//! The values that cross the addon's boundary one by one: bytes and 64-bit numbers.
//! (The node's inputs and outputs cross as the core's boundary records: see
//! [`crate::vocabulary`].) Bytes cross as copies (`Uint8Array` in, `Buffer` out: cheaper than external buffers
//! with finalizers at these sizes); 64-bit numbers as `bigint` (a non-negative safe
//! integer `number` is accepted too).

use napi::bindgen_prelude::*;
use napi::sys;

/// A `u64` that crosses as a `bigint`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct U64(pub u64);

impl TypeName for U64 {
    fn type_name() -> &'static str {
        "bigint"
    }

    fn value_type() -> ValueType {
        ValueType::BigInt
    }
}

impl ValidateNapiValue for U64 {}

impl FromNapiValue for U64 {
    unsafe fn from_napi_value(env: sys::napi_env, value: sys::napi_value) -> Result<Self> {
        let mut kind = 0;
        check_status!(unsafe { sys::napi_typeof(env, value, &mut kind) })?;
        if kind == sys::ValueType::napi_bigint {
            let (mut v, mut lossless) = (0u64, false);
            check_status!(unsafe { sys::napi_get_value_bigint_uint64(env, value, &mut v, &mut lossless) })?;
            // A negative bigint also reports a lossy conversion.
            if lossless {
                return Ok(U64(v));
            }
            return Err(Error::new(Status::InvalidArg, "expected a bigint in 0..2n**64n".to_owned()));
        }
        if kind == sys::ValueType::napi_number {
            let mut v = 0f64;
            check_status!(unsafe { sys::napi_get_value_double(env, value, &mut v) })?;
            if v >= 0.0 && v.fract() == 0.0 && v <= 9_007_199_254_740_991.0 {
                return Ok(U64(v as u64));
            }
            return Err(Error::new(
                Status::InvalidArg,
                format!("expected a bigint or a non-negative safe integer, got {v}"),
            ));
        }
        Err(Error::new(Status::InvalidArg, "expected a bigint".to_owned()))
    }
}

impl ToNapiValue for U64 {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> Result<sys::napi_value> {
        unsafe { ToNapiValue::to_napi_value(env, val.0) }
    }
}

/// Bytes: read from any `Uint8Array` (a `Buffer` is one), given back as a `Buffer`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl TypeName for Bytes {
    fn type_name() -> &'static str {
        "Uint8Array"
    }

    fn value_type() -> ValueType {
        ValueType::Object
    }
}

impl ValidateNapiValue for Bytes {}

/// Where a `Uint8Array`'s bytes are, and how many.
unsafe fn uint8_array(env: sys::napi_env, value: sys::napi_value) -> Result<(*mut u8, usize)> {
    let mut is_typed = false;
    check_status!(unsafe { sys::napi_is_typedarray(env, value, &mut is_typed) })?;
    let not_bytes = || Error::new(Status::InvalidArg, "expected a Uint8Array or Buffer".to_owned());
    if !is_typed {
        return Err(not_bytes());
    }
    let (mut kind, mut len, mut data, mut buffer, mut offset) =
        (0, 0usize, std::ptr::null_mut(), std::ptr::null_mut(), 0);
    check_status!(unsafe {
        sys::napi_get_typedarray_info(env, value, &mut kind, &mut len, &mut data, &mut buffer, &mut offset)
    })?;
    if kind != sys::TypedarrayType::uint8_array && kind != sys::TypedarrayType::uint8_clamped_array {
        return Err(not_bytes());
    }
    if len == 0 || data.is_null() {
        return Ok((std::ptr::NonNull::dangling().as_ptr(), 0));
    }
    Ok((data.cast(), len))
}

/// The bytes of a `Uint8Array`, borrowed for as long as the value is reachable.
pub(crate) unsafe fn uint8_slice<'a>(env: sys::napi_env, value: sys::napi_value) -> Result<&'a [u8]> {
    let (data, len) = unsafe { uint8_array(env, value) }?;
    Ok(unsafe { std::slice::from_raw_parts(data, len) })
}

/// The bytes of a `Uint8Array` to write into, for as long as the value is reachable
/// (nothing else reads or writes them meanwhile: JavaScript waits for the call).
pub(crate) unsafe fn uint8_slice_mut<'a>(env: sys::napi_env, value: sys::napi_value) -> Result<&'a mut [u8]> {
    let (data, len) = unsafe { uint8_array(env, value) }?;
    Ok(unsafe { std::slice::from_raw_parts_mut(data, len) })
}

impl FromNapiValue for Bytes {
    unsafe fn from_napi_value(env: sys::napi_env, value: sys::napi_value) -> Result<Self> {
        Ok(Bytes(unsafe { uint8_slice(env, value) }?.to_vec()))
    }
}

impl ToNapiValue for Bytes {
    unsafe fn to_napi_value(env: sys::napi_env, val: Self) -> Result<sys::napi_value> {
        unsafe { to_buffer(env, &val.0) }
    }
}

/// A new `Buffer` holding a copy of `bytes`.
pub(crate) unsafe fn to_buffer(env: sys::napi_env, bytes: &[u8]) -> Result<sys::napi_value> {
    let (mut out, mut data) = (std::ptr::null_mut(), std::ptr::null_mut());
    check_status!(unsafe {
        sys::napi_create_buffer_copy(env, bytes.len(), bytes.as_ptr().cast(), &mut data, &mut out)
    })?;
    Ok(out)
}

impl U64 {
    /// From any JavaScript value (an `Unknown` argument or field).
    pub fn from_unknown(env: &Env, v: Unknown) -> Result<U64> {
        unsafe { U64::from_napi_value(env.raw(), v.raw()) }
    }
}

impl Bytes {
    /// From any JavaScript value, as a `TypeError` unless it is a `Uint8Array`.
    pub fn from_unknown(env: &Env, v: Unknown) -> crate::Result<Bytes> {
        unsafe { Bytes::from_napi_value(env.raw(), v.raw()) }.map_err(crate::napi_error)
    }
}

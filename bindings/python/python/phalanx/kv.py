"""The key-value application ``phalanxd`` replicates: operation encoders and result
decoding (the encoding of ``phalanx_core::kv``)."""

from __future__ import annotations

from typing import NamedTuple, Optional

from ._native import KvStore, kv_cas, kv_decode_reply, kv_delete, kv_get, kv_put


def put(key: bytes, value: bytes) -> bytes:
    """Encodes put(key, value); its result is the value before."""
    return kv_put(key, value)


def get(key: bytes) -> bytes:
    """Encodes get(key); its result is the current value."""
    return kv_get(key)


def delete(key: bytes) -> bytes:
    """Encodes delete(key); its result is the value before."""
    return kv_delete(key)


def cas(key: bytes, expected: Optional[bytes], new: bytes) -> bytes:
    """Encodes compare-and-swap: write ``new`` if the value is ``expected`` (None: absent)."""
    return kv_cas(key, expected, new)


class CasResult(NamedTuple):
    """The result of a compare-and-swap: whether it wrote, and the value before."""

    swapped: bool
    before: Optional[bytes]


def decode_value(reply: bytes) -> Optional[bytes]:
    """Decodes the result of put/get/delete (raises ``KvError`` otherwise)."""
    r = kv_decode_reply(reply)
    if r[0] != "value":
        from ._native import KvError

        raise KvError(f"expected a value result, got a {r[0]} result")
    return r[1]


def decode_cas(reply: bytes) -> CasResult:
    """Decodes the result of cas (raises ``KvError`` otherwise)."""
    r = kv_decode_reply(reply)
    if r[0] != "cas":
        from ._native import KvError

        raise KvError(f"expected a cas result, got a {r[0]} result")
    return CasResult(r[1], r[2])


__all__ = ["CasResult", "KvStore", "cas", "decode_cas", "decode_value", "delete", "get", "put"]

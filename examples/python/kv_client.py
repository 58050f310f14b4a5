#!/usr/bin/env python3
"""A key-value client of a running phalanxd cluster, on asyncio.

    phalanxd keygen --dir mycluster --insecure-test-crypto
    for i in 0 1 2 3; do phalanxd run --config mycluster/cluster.toml --id $i & done
    python examples/python/kv_client.py mycluster/cluster.toml

Writes a few keys, reads them back, does a compare-and-swap, and times 200 concurrent
puts. An ordered result stands once a quorum of replicas agrees (⌈(n+f+1)/2⌉, 2f+1 at
n = 3f+1); a read (`Client.read`) is not ordered and stands once 2f+1 replicas give the
same answer (otherwise it is ordered).
"""

import asyncio
import sys
import time

import phalanx


async def read(client: phalanx.Client, key: bytes):
    """A get without ordering: answered by the replicas from their current state."""
    return phalanx.kv.decode_value(await client.read(phalanx.kv.get(key)))


async def main(config: str) -> None:
    async with phalanx.Client.from_cluster_file(config, timeout=10) as client:
        print(f"client {client.id} of {config}")
        before = await client.put(b"greeting", b"hello")
        print(f"put greeting=hello (before: {before!r})")
        print(f"read greeting -> {await read(client, b'greeting')!r}")
        r = await client.cas(b"greeting", b"hello", b"bonjour")
        print(f"cas greeting hello->bonjour: swapped={r.swapped} before={r.before!r}")
        r = await client.cas(b"greeting", b"hello", b"hola")
        print(f"cas greeting hello->hola: swapped={r.swapped} before={r.before!r}")
        started = time.perf_counter()
        await asyncio.gather(*(client.put(b"key-%d" % i, b"value-%d" % i) for i in range(200)))
        elapsed = time.perf_counter() - started
        print(f"200 concurrent puts in {elapsed:.3f}s ({200 / elapsed:,.0f} ops/s)")
        print(f"read key-42 -> {await read(client, b'key-42')!r}")
        print(f"delete key-42 -> {await client.delete(b'key-42')!r}")
        print(f"get key-42 -> {await client.get(b'key-42')!r}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        asyncio.run(main(sys.argv[1]))
    except phalanx.TimeoutError as e:
        sys.exit(f"error: {e}")
    except phalanx.ConfigError as e:
        sys.exit(f"error: {e}")

#!/usr/bin/env python3
"""A replicated counter whose application is written in Python: four PBFT replicas
(f = 1) and a client in one asyncio program, talking over loopback TCP with phalanxd's
framing. One replica (the primary) is stopped half-way; the other three change view and
go on. The final value is read without ordering: each replica answers it with
Counter.query, and the client takes it once 2f+1 answers agree.

    python examples/python/counter.py
"""

import asyncio
import json
import socket

import phalanx


class Counter:
    """The state machine: deterministic execute(op) -> result, snapshot(), restore(), and
    query(op) -> result for the read-only op ``read``."""

    def __init__(self) -> None:
        self.value = 0

    def execute(self, op: bytes) -> bytes:
        if op.startswith(b"add "):
            self.value += int(op[4:])
        return str(self.value).encode()

    def query(self, op: bytes) -> bytes:
        # Read-only: must not change the state. Raising leaves the read unanswered, and
        # the client then has the op ordered instead.
        if op != b"read":
            raise ValueError(f"{op!r} is not a read-only op")
        return str(self.value).encode()

    def snapshot(self) -> bytes:
        return json.dumps(self.value).encode()

    def restore(self, snapshot: bytes) -> None:
        self.value = json.loads(snapshot)


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


async def main() -> None:
    ms = 1_000_000
    configs = phalanx.generate_cluster(
        f=1, protocol="pbft", clients=1, seed=2024,
        params={"request_timeout_ns": 300 * ms, "client_retry_ns": 100 * ms},
    )
    addresses = {i: ("127.0.0.1", p) for i, p in enumerate(free_ports(4))}
    replicas = [phalanx.Replica(configs[i], addresses, Counter()) for i in range(4)]
    for r in replicas:
        await r.start()
    try:
        async with phalanx.Client(configs[4], addresses) as client:
            for i in range(1, 6):
                print(f"add {i} -> {int(await client.execute(b'add %d' % i))}")
            print("stopping replica 0 (the primary)")
            await replicas[0].stop()
            totals = await asyncio.gather(*(client.execute(b"add 10") for _ in range(5)))
            print(f"5 concurrent 'add 10' -> {sorted(int(t) for t in totals)}")
            print(f"read -> {int(await client.read(b'read'))}")
        await asyncio.sleep(0.2)
        for r in replicas[1:]:
            st = r.status()
            print(f"replica {r.id}: value={r.app.value} view={st['view']} executed={st['executed']}")
    finally:
        for r in replicas:
            await r.stop()


if __name__ == "__main__":
    asyncio.run(main())

"""A cluster of four Python-hosted replicas on loopback (asyncio, phalanxd's framing):
they agree on a workload, also with one replica stopped; a file-backed replica recovers
from its log; reads are answered without ordering by applications with `query`, and
ordered otherwise."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

import phalanx

from .conftest import free_ports

MS = 1_000_000
PARAMS = {
    "checkpoint_interval": 8,
    "pipeline": 8,
    "batch_timeout_ns": MS,
    "request_timeout_ns": 300 * MS,
    "client_retry_ns": 100 * MS,
}


class Counter:
    """The replicated application: a counter and the history of its operations."""

    def __init__(self):
        self.value = 0
        self.ops = 0

    def execute(self, op: bytes) -> bytes:
        self.ops += 1
        if op.startswith(b"add:"):
            self.value += int(op[4:])
        return str(self.value).encode()

    def snapshot(self) -> bytes:
        return json.dumps([self.value, self.ops]).encode()

    def restore(self, snapshot: bytes) -> None:
        self.value, self.ops = json.loads(snapshot)


class ReadableCounter(Counter):
    """The counter with a read-only op: `query(b"get")` is its value, unexecuted."""

    def __init__(self):
        super().__init__()
        self.queries = 0

    def query(self, op: bytes) -> bytes:
        self.queries += 1
        if op != b"get":
            raise ValueError(f"{op!r} is not read-only")
        return str(self.value).encode()


def cluster(seed: int, clients: int = 1, **params):
    configs = phalanx.generate_cluster(f=1, protocol="pbft", clients=clients, seed=seed, params={**PARAMS, **params})
    ports = free_ports(4)
    addrs = {i: ("127.0.0.1", ports[i]) for i in range(4)}
    return configs, addrs


async def eventually(condition, what, timeout=10.0):
    """Waits until `condition()` holds; fails with `what()` after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end and not condition():
        await asyncio.sleep(0.02)
    assert condition(), what()


async def settle(replicas, want_ops, timeout=10.0):
    """Waits until every replica has executed `want_ops` operations."""
    await eventually(
        lambda: all(r.app.ops >= want_ops for r in replicas),
        lambda: f"replicas executed {[r.app.ops for r in replicas]}, expected {want_ops}",
        timeout,
    )


@contextlib.asynccontextmanager
async def running(configs, addrs, apps):
    """Replicas 0, 1, … with the applications `apps`, started, and stopped on the way out."""
    replicas = [phalanx.Replica(configs[i], addrs, app) for i, app in enumerate(apps)]
    try:
        for r in replicas:
            await r.start()
        yield replicas
    finally:
        for r in replicas:
            await r.stop()


def test_four_python_replicas_agree_with_one_stopped():
    async def main():
        configs, addrs = cluster(seed=11)
        replicas = [phalanx.Replica(configs[i], addrs, Counter()) for i in range(4)]
        for r in replicas:
            await r.start()
        client = phalanx.Client(configs[4], addrs, timeout=15)
        try:
            async with client:
                results = []
                for i in range(1, 21):
                    results.append(int(await client.execute(b"add:%d" % i)))
                assert results == [sum(range(1, i + 1)) for i in range(1, 21)]
                # Concurrent submissions are ordered too.
                concurrent = await asyncio.gather(*(client.execute(b"add:1") for _ in range(10)))
                assert sorted(int(x) for x in concurrent) == list(range(211, 221))
                await settle(replicas, 30)
                assert len({r.app.value for r in replicas}) == 1

                # Stop the primary of view 0: a view change, then progress with three.
                assert replicas[0].status()["primary"]
                await replicas[0].stop()
                live = replicas[1:]
                for i in range(10):
                    assert int(await client.execute(b"add:100")) == 220 + 100 * (i + 1)
                await settle(live, 40)
                assert {r.app.value for r in live} == {1220}
                assert {r.app.ops for r in live} == {40}
                assert all(r.status()["view"] >= 1 for r in live)
                assert sum(r.status()["view_changes"] for r in live) >= 1
                assert await client.execute(b"get") == b"1220"
        finally:
            for r in replicas:
                await r.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_replica_recovers_from_its_log(tmp_path):
    """A replica with file storage is stopped and restarted: it recovers from its log and
    catches up with the others."""

    async def main():
        configs, addrs = cluster(seed=12)
        storage = {i: tmp_path / f"replica-{i}.log" for i in range(4)}
        replicas = [phalanx.Replica(configs[i], addrs, Counter(), storage=storage[i]) for i in range(4)]
        for r in replicas:
            await r.start()
        client = phalanx.Client(configs[4], addrs, timeout=15, storage=tmp_path / "client.log")
        try:
            async with client:
                for _ in range(10):
                    await client.execute(b"add:1")
                await replicas[3].stop()
                for _ in range(10):
                    await client.execute(b"add:1")
                # Restart replica 3 from its log, with a fresh application object.
                replicas[3] = phalanx.Replica(configs[3], addrs, Counter(), storage=storage[3])
                await replicas[3].start()
                for _ in range(12):
                    await client.execute(b"add:1")
                # Stop another replica: replica 3 is needed for the quorum now.
                await replicas[1].stop()
                for _ in range(4):
                    assert int(await client.execute(b"add:1")) > 32
                assert int(await client.execute(b"get")) == 36
                live = [replicas[0], replicas[2], replicas[3]]
                loop = asyncio.get_running_loop()
                end = loop.time() + 10
                while loop.time() < end and len({r.app.value for r in live}) != 1:
                    await asyncio.sleep(0.02)
                assert {r.app.value for r in live} == {36}
        finally:
            for r in replicas:
                await r.stop()

    asyncio.run(asyncio.wait_for(main(), 90))


def test_client_times_out_without_a_quorum():
    async def main():
        configs, addrs = cluster(seed=13)
        # Only two replicas: no quorum.
        replicas = [phalanx.Replica(configs[i], addrs, Counter()) for i in range(2)]
        for r in replicas:
            await r.start()
        try:
            async with phalanx.Client(configs[4], addrs) as client:
                with pytest.raises(phalanx.TimeoutError, match="no quorum of matching replies within 0.5s"):
                    await client.execute(b"add:1", timeout=0.5)
                with pytest.raises(TypeError):
                    await client.execute("add:1")
        finally:
            for r in replicas:
                await r.stop()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_replica_argument_errors():
    configs, addrs = cluster(seed=14)
    with pytest.raises(TypeError, match="execute"):
        phalanx.Replica(configs[0], addrs, object())
    with pytest.raises(phalanx.PhalanxError, match="not a PBFT replica"):
        phalanx.Replica(configs[4], addrs, Counter())
    with pytest.raises(phalanx.PhalanxError, match="not a PBFT client"):
        phalanx.Client(configs[0], addrs)
    with pytest.raises(phalanx.PhalanxError, match="no address"):
        phalanx.Client(configs[4], {0: addrs[0]})
    with pytest.raises(phalanx.ConfigError):
        phalanx.Replica(b"garbage", addrs, Counter())


def test_a_read_completes_without_ordering():
    """Three replicas answer reads with `query` (2f+1), the fourth's application has
    none: reads complete from the three matching answers, and nothing is executed."""

    async def main():
        configs, addrs = cluster(seed=15)
        apps = [ReadableCounter(), ReadableCounter(), ReadableCounter(), Counter()]
        async with running(configs, addrs, apps) as replicas:
            async with phalanx.Client(configs[4], addrs, timeout=15) as client:
                for i in range(1, 6):
                    await client.execute(b"add:%d" % i)
                await settle(replicas, 5)
                executed = [r.status()["executed"] for r in replicas]
                assert await client.read(b"get") == b"15"
                assert await asyncio.gather(*(client.read(b"get") for _ in range(5))) == [b"15"] * 5
                # Every replica got each read as a Query; three answered it.
                await eventually(
                    lambda: [r.answered_queries for r in replicas] == [6, 6, 6, 0],
                    lambda: f"answered {[r.answered_queries for r in replicas]}",
                )
                assert [a.queries for a in apps[:3]] == [6, 6, 6]
                # Longer than client_retry_ns: a read that fell back to ordering would show.
                await asyncio.sleep(0.3)
                assert [r.app.ops for r in replicas] == [5] * 4
                assert [r.status()["executed"] for r in replicas] == executed
                # Ordered ops go on as before.
                assert int(await client.execute(b"add:1")) == 16
                assert await client.read(b"get") == b"16"

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_read_without_query_is_ordered():
    """Applications without `query`: the replicas never answer, so the client has the
    read ordered after `client_retry_ns`, and it completes as an executed op."""

    async def main():
        retry = 20 * MS
        configs, addrs = cluster(seed=16, client_retry_ns=retry)
        async with running(configs, addrs, [Counter() for _ in range(4)]) as replicas:
            async with phalanx.Client(configs[4], addrs, timeout=15) as client:
                assert await client.execute(b"add:7") == b"7"
                loop = asyncio.get_running_loop()
                started = loop.time()
                assert await client.read(b"get") == b"7"
                assert loop.time() - started >= 0.9 * retry / 1e9
                await settle(replicas, 2)
                assert all(r.answered_queries == 0 for r in replicas)

    asyncio.run(asyncio.wait_for(main(), 60))


def read_in_memory(configs, apps):
    """A client's read of b"get" through four replica host loops wired in memory, with
    `apps`: the client's `Completed` results and each loop's answered queries."""
    client = phalanx.Node(configs[4])
    loops = [phalanx.HostLoop(phalanx.Node(configs[i]), app) for i, app in enumerate(apps)]
    (persist,) = client.handle_many([(0, phalanx.Read(b"get"))])
    frames = [o for o in client.handle_many([(1, phalanx.Persisted(persist.token))]) if isinstance(o, phalanx.Send)]
    replies = []
    for frame in frames:
        loops[frame.to].handle(2, phalanx.Message(4, frame.data))
        replies += [(frame.to, o.data) for o in loops[frame.to].drain(2) if isinstance(o, phalanx.Send) and o.to == 4]
    completed = client.handle_many([(3, phalanx.Message(i, data)) for i, data in replies])
    results = [o.result for o in completed if isinstance(o, phalanx.Completed)]
    return results, [loop.answered_queries for loop in loops]


def test_replica_answers_queries_only_with_bytes_from_query():
    configs, _ = cluster(seed=17)

    class Raising(Counter):
        def query(self, op):
            raise RuntimeError("no")

    class NotBytes(Counter):
        def query(self, op):
            return "15"

    def readable():
        app = ReadableCounter()
        app.value = 15
        return app

    # Three applications answer b"15": the read completes with it.
    assert read_in_memory(configs, [readable(), readable(), readable(), Counter()]) == ([b"15"], [1, 1, 1, 0])
    # No query, one that raises, one that returns str: nothing is answered.
    for app in (Counter, Raising, NotBytes):
        assert read_in_memory(configs, [app() for _ in range(4)]) == ([], [0, 0, 0, 0])


def test_strangers_cannot_take_a_clients_slots_or_replies(monkeypatch):
    """Strangers without keys open more connections to every replica than it has slots,
    naming the client and sending frames nobody MAC'd. The client's connections take the
    oldest strangers' slots, and once a frame with its MAC proved them, strangers naming
    it later get none of its replies: its requests complete before and after."""
    monkeypatch.setattr(phalanx._host, "MAX_CONNECTIONS", 8)

    async def main():
        configs, addrs = cluster(seed=13)
        client = phalanx.Client(configs[4], addrs, timeout=15)
        hello = phalanx._host.HELLO_MAGIC + client.id.to_bytes(4, "little")
        junk = len(b"junk").to_bytes(4, "little") + b"junk"
        strangers = []

        async def crowd(count):
            for addr in addrs.values():
                for _ in range(count):
                    reader, writer = await asyncio.open_connection(*addr)
                    writer.write(hello + junk)
                    strangers.append((reader, writer))

        async with running(configs, addrs, [Counter() for _ in range(4)]) as replicas:
            # The replicas' own connections prove themselves first.
            await eventually(
                lambda: all(len(r._host._proven) == 3 for r in replicas),
                lambda: "the replicas' connections to each other are not all proven",
            )
            await crowd(12)
            async with client:
                for i in range(1, 6):
                    assert int(await client.execute(b"add:1")) == i
                await crowd(4)
                for i in range(6, 11):
                    assert int(await client.execute(b"add:1")) == i
            closed = 0
            for reader, writer in strangers:
                try:
                    got = await asyncio.wait_for(reader.read(64), 0.05)
                    assert got == b"", "a stranger got a frame"
                    closed += 1
                except asyncio.TimeoutError:
                    pass
                writer.close()
            # Each replica's 8 slots: the 3 other replicas, the client, and the 4 newest
            # strangers.
            assert closed == len(strangers) - 4 * len(addrs)

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_client_is_proven_before_it_sends_anything():
    """A dialer sends its proof (``Node.proof``, a frame carrying nothing MAC'd for the
    replica) right after its hello, so a client that has sent nothing yet, as a subscriber
    may never, holds a proven connection at every replica (a slot strangers cannot take,
    as the test above shows)."""

    async def main():
        configs, addrs = cluster(seed=17)
        proof = phalanx.Node(configs[4]).proof(0)
        assert phalanx.Node(configs[0]).authentic(4, proof)
        assert not phalanx.Node(configs[1]).authentic(4, proof), "a proof for replica 0 only"
        client = phalanx.Client(configs[4], addrs, timeout=15)
        async with running(configs, addrs, [Counter() for _ in range(4)]) as replicas:
            async with client:
                await eventually(
                    lambda: all(client.id in r._host._proven for r in replicas),
                    lambda: "the client is not proven at every replica before it sends",
                )
                assert int(await client.execute(b"add:1")) == 1

    asyncio.run(asyncio.wait_for(main(), 60))


def test_slots_fit_the_open_file_limit(monkeypatch):
    """A host accepts no more connections than the process's open files leave room for:
    past the limit an accept fails, and takes no stranger's slot."""
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (100, 4096))
    assert phalanx._host._connection_room() == 100 - phalanx._host.FILES_BESIDE_CONNECTIONS
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1 << 20, 1 << 20))
    assert phalanx._host._connection_room() == phalanx._host.MAX_CONNECTIONS

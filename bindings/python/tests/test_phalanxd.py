"""The asyncio client against real phalanxd processes started by the test (insecure
test crypto, free loopback ports, killed at the end); and a mixed cluster of three
phalanxd replicas and one Python-hosted replica."""

from __future__ import annotations

import asyncio

import pytest

import phalanx

from .conftest import PhalanxdCluster


@pytest.fixture
def native_cluster(phalanxd, tmp_path):
    c = PhalanxdCluster(phalanxd, tmp_path / "cluster")
    try:
        yield c
    finally:
        c.stop_all()
        print(c.logs())  # shown when the test failed


def test_client_against_phalanxd(native_cluster):
    c = native_cluster
    c.start([0, 1, 2, 3])

    async def main():
        async with phalanx.Client.from_cluster_file(c.config, timeout=20) as client:
            assert client.id == phalanx.load_cluster(c.config).clients[0]
            assert await client.put(b"greeting", b"hello") is None
            assert await client.get(b"greeting") == b"hello"
            assert await client.cas(b"greeting", b"hello", b"bonjour") == (True, b"hello")
            r = await client.cas(b"greeting", b"hello", b"hola")
            assert r.swapped is False and r.before == b"bonjour"
            assert await client.put(b"greeting", b"hi") == b"bonjour"
            many = await asyncio.gather(*(client.put(b"k%d" % i, b"v%d" % i) for i in range(50)))
            assert many == [None] * 50
            # One replica killed: a quorum (2f+1) of matching replies still comes.
            c.kill(2)
            assert await client.get(b"k7") == b"v7"
            assert await client.delete(b"k7") == b"v7"
            assert await client.get(b"k7") is None
        # A second client (the other id) sees the same state.
        ids = phalanx.load_cluster(c.config).clients
        async with phalanx.Client.from_cluster_file(c.config, ids[1], storage=False, timeout=20) as other:
            assert await other.get(b"greeting") == b"hi"

    asyncio.run(asyncio.wait_for(main(), 120))


def test_client_timeout_against_stopped_cluster(native_cluster):
    c = native_cluster  # keygen only: nothing runs

    async def main():
        async with phalanx.Client.from_cluster_file(c.config, storage=False) as client:
            with pytest.raises(phalanx.TimeoutError, match="no quorum of matching replies"):
                await client.put(b"k", b"v", timeout=0.5)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_mixed_cluster_python_and_native_replicas(native_cluster):
    """Replicas 0-2 are phalanxd, replica 3 is Python with phalanx.KvStore: they form one
    cluster; the Python replica executes the same operations, and with a native replica
    killed the Python one is part of every quorum."""
    c = native_cluster
    c.start([0, 1, 2])

    async def main():
        store = phalanx.KvStore()
        replica = phalanx.Replica.from_cluster_file(c.config, 3, store)
        await replica.start()
        try:
            async with phalanx.Client.from_cluster_file(c.config, timeout=20) as client:
                for i in range(20):
                    await client.put(b"key%d" % i, b"value%d" % i)
                loop = asyncio.get_running_loop()
                end = loop.time() + 10
                while loop.time() < end and len(store) < 20:
                    await asyncio.sleep(0.05)
                assert len(store) == 20 and store.get(b"key5") == b"value5"
                # Kill a native replica: progress needs the Python replica now.
                c.kill(0)
                assert await client.cas(b"key1", b"value1", b"changed") == (True, b"value1")
                assert await client.get(b"key1") == b"changed"
                # A read, answered by KvStore.query here and by phalanxd's store there.
                assert phalanx.kv.decode_value(await client.read(phalanx.kv.get(b"key1"))) == b"changed"
                end = loop.time() + 10
                while loop.time() < end and store.get(b"key1") != b"changed":
                    await asyncio.sleep(0.05)
                assert store.get(b"key1") == b"changed"
                assert not any(kind == "bad_mac" for (_, kind) in replica.faults)
        finally:
            await replica.stop()

    asyncio.run(asyncio.wait_for(main(), 120))

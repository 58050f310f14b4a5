"""``phalanx.DistillClient`` against a distillation deployment of real phalanxd
processes (4 servers, 2 brokers, a directory of 16 clients; insecure test crypto, free
loopback ports, killed at the end): clients submitting concurrently are delivered, each
message exactly once in a server's deliveries feed; and its errors."""

from __future__ import annotations

import asyncio
import re
import subprocess
import urllib.request
from collections import Counter

import pytest

import phalanx

from .conftest import PhalanxdCluster

DIRECTORY = 16
# keygen numbers brokers from 1000.
BROKERS = [1000, 1001]
# The directory's clients are nodes 2^31 + index.
CLIENT_ADDRESS_BASE = 1 << 31


@pytest.fixture
def deployment(phalanxd, tmp_path):
    d = PhalanxdCluster(
        phalanxd, tmp_path / "deployment", protocol="distill", clients=DIRECTORY, brokers=len(BROKERS), metrics=True
    )
    try:
        yield d
    finally:
        d.stop_all()
        print(d.logs())  # shown when the test failed


def feed(d: PhalanxdCluster, server: int, batches: int) -> Counter:
    """``(height, client, seq, message)`` of every entry in the first ``batches`` batches
    server ``server`` delivered, as ``phalanxd client deliveries`` prints them."""
    out = subprocess.run(
        [
            str(d.binary), "client", "--config", str(d.config),
            "deliveries", "--server", str(server), "--count", str(batches),
        ],
        check=True, capture_output=True, text=True, timeout=30,
    ).stdout
    entry = re.compile(r'height (\d+) client (\d+) seq (\d+): "(.*)"')
    entries = Counter()
    for line in out.splitlines():
        m = entry.fullmatch(line)
        assert m, f"not an entry: {line!r}"
        height, client, seq, message = m.groups()
        entries[(int(height), int(client), int(seq), message)] += 1
    return entries


def metric(d: PhalanxdCluster, server: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_base + server}/metrics", timeout=10) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"server {server} exports no {name}")


def test_clients_submit_concurrently_and_each_message_is_delivered_once(deployment):
    d = deployment
    d.start(range(4))
    d.start(BROKERS, "broker")
    clients, messages = [0, 7, DIRECTORY - 1], 4

    async def submit_all(index: int):
        async with phalanx.DistillClient.from_cluster_file(d.config, index, timeout=30) as client:
            assert client.id == CLIENT_ADDRESS_BASE + index
            # All at once on one client: they go one after the other.
            texts = [f"c{index}-m{n}" for n in range(messages)]
            return texts, await asyncio.gather(*(client.submit(t) for t in texts))

    async def main():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        started = asyncio.get_running_loop().time()
        results = await asyncio.gather(*(submit_all(i) for i in clients))
        elapsed = asyncio.get_running_loop().time() - started
        ticker.cancel()
        # The event loop went on while the clients waited for their deliveries.
        assert ticks >= elapsed / 0.05 / 2, f"{ticks} ticks of 50 ms in {elapsed:.1f}s"
        return results

    results = asyncio.run(asyncio.wait_for(main(), 90))
    expected = Counter()
    for index, (texts, deliveries) in zip(clients, results):
        assert all(isinstance(x, phalanx.Delivery) and x.height > 0 for x in deliveries)
        seqs = [x.seq for x in deliveries]
        assert seqs == sorted(set(seqs)), f"client {index}: seqs {seqs}"
        for text, x in zip(texts, deliveries):
            expected[(x.height, index, x.seq, text)] += 1
    top = max(height for (height, _, _, _) in expected)
    # A fresh deployment: heights 1..top hold these messages and nothing else.
    assert feed(d, 0, top) == expected
    assert metric(d, 0, "phalanx_distill_messages_delivered_total") == len(clients) * messages


def test_distill_client_errors(deployment):
    d = deployment  # keygen only: nothing runs

    async def main():
        with pytest.raises(phalanx.ConfigError, match=f"directory has {DIRECTORY} clients"):
            await phalanx.DistillClient.from_cluster_file(d.config, DIRECTORY).start()
        async with phalanx.DistillClient.from_cluster_file(d.config, 3) as client:
            with pytest.raises(phalanx.HandleError, match="longer than max_payload"):
                await client.submit(b"x" * 1000)
            with pytest.raises(phalanx.TimeoutError, match="may still take effect"):
                await client.submit(b"nobody hears this", timeout=0.5)
        with pytest.raises(phalanx.PhalanxError, match="stopped"):
            await client.submit(b"after close")

    asyncio.run(asyncio.wait_for(main(), 30))

"""Perpetual groups hosted in Python (asyncio, phalanxd's framing): a bank group calling a
ledger group through the futures API, one ledger member replaced by a fresh one mid-run
(it catches up by state transfer, which restores its service); services that call
asynchronously and serve out of order; aborts by agreement; and a Python ledger member
in a group of phalanxd members."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import subprocess

import phalanx
from phalanx.perpetual import CallAborted, Member

from .conftest import free_port_block, free_ports

MS = 1_000_000
PARAMS = {
    "checkpoint_interval": 4,
    "pipeline": 8,
    "batch_timeout_ns": MS,
    "request_timeout_ns": 300 * MS,
    "client_retry_ns": 100 * MS,
}


def i64(b: bytes) -> int:
    return struct.unpack("<q", b)[0]


def le(x: int) -> bytes:
    return struct.pack("<q", x)


class Ledger:
    """A balance: each request adds its amount; the answer is the new balance."""

    def __init__(self):
        self.balance = 0

    async def run(self, group):
        while True:
            request = await group.next_request()
            self.balance += i64(request.op)
            group.send_result(request, le(self.balance))

    def snapshot(self) -> bytes:
        return le(self.balance)

    def restore(self, state: bytes) -> None:
        self.balance = i64(state)


class Bank:
    """`ops` increments then as many decrements, one call at a time; an aborted call is
    made again. Its state names the call in flight, so a restored program takes up
    where the checkpoint's left off."""

    def __init__(self, ops: int):
        self.ops = ops
        self.done = 0
        self.last = 0
        self.in_flight = None  # (call, amount)

    async def run(self, group):
        while self.done < 2 * self.ops:
            if self.in_flight is None:
                amount = 1 if self.done < self.ops else -1
                self.in_flight = (group.invoke(1, le(amount)).call, amount)
            call, _ = self.in_flight
            try:
                self.last = i64(await group.invocation(call).get())
                self.done += 1
            except CallAborted:
                pass
            self.in_flight = None

    def snapshot(self) -> bytes:
        call, amount = self.in_flight or (0, 0)
        return struct.pack("<qqQq", self.done, self.last, call, amount)

    def restore(self, state: bytes) -> None:
        self.done, self.last, call, amount = struct.unpack("<qqQq", state)
        self.in_flight = (call, amount) if call else None


def members(sizes, seed):
    configs = phalanx.generate_perpetual(sizes, seed=seed, params=PARAMS)
    ports = free_ports(len(configs))
    return configs, {i: ("127.0.0.1", p) for i, p in enumerate(ports)}


async def eventually(condition, what, timeout=20.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end and not condition():
        await asyncio.sleep(0.02)
    assert condition(), what()


@contextlib.asynccontextmanager
async def running(nodes):
    try:
        for n in nodes:
            await n.start()
        yield nodes
    finally:
        for n in nodes:
            await n.stop()


def test_a_bank_group_calls_a_ledger_group_and_a_replaced_ledger_member_catches_up():
    async def main():
        configs, addrs = members([4, 4], seed=3)
        banks = [Bank(ops=12) for _ in range(4)]
        ledgers = [Ledger() for _ in range(4)]
        nodes = [Member(configs[i], addrs, s) for i, s in enumerate(banks + ledgers)]
        async with running(nodes):
            await eventually(lambda: banks[0].done >= 6, lambda: f"bank at {banks[0].done}")
            # A ledger member loses everything (memory storage) and comes back fresh.
            await nodes[7].stop()
            ledgers[3] = Ledger()
            nodes[7] = Member(configs[7], addrs, ledgers[3])
            await nodes[7].start()
            await eventually(
                lambda: all(b.done == 24 for b in banks), lambda: f"banks at {[b.done for b in banks]}", 60
            )
            assert [b.last for b in banks] == [0, 0, 0, 0]
            # The fresh member learns the balance from a checkpoint once one passes it.
            await eventually(
                lambda: [l.balance for l in ledgers] == [0, 0, 0, 0], lambda: f"{[l.balance for l in ledgers]}"
            )

    asyncio.run(asyncio.wait_for(main(), 120))


class Fanout:
    """Ten calls in flight, outcomes taken newest first; then two whose outcomes come in
    completion order (`next_result`)."""

    def __init__(self):
        self.newest_first = None
        self.last = None

    async def run(self, group):
        calls = [group.invoke(1, le(i)) for i in range(1, 11)]
        self.newest_first = [i64(await c.get()) for c in reversed(calls)]
        group.invoke(1, le(11))
        group.invoke(1, le(12))
        self.last = {i64((await group.next_result()).value) for _ in range(2)}

    def snapshot(self) -> bytes:
        return b""

    def restore(self, state: bytes) -> None:
        pass


class SquaresInPairs:
    """Serves asynchronously: takes two requests, answers the second first, each with its
    amount squared."""

    async def run(self, group):
        while True:
            first = await group.next_request()
            second = await group.next_request()
            for r in (second, first):
                group.send_result(r, le(i64(r.op) ** 2))

    def snapshot(self) -> bytes:
        return b""

    def restore(self, state: bytes) -> None:
        pass


def test_calls_in_flight_and_requests_served_out_of_order():
    async def main():
        configs, addrs = members([1, 4], seed=4)
        fanout = Fanout()
        nodes = [Member(configs[0], addrs, fanout)] + [Member(c, addrs, SquaresInPairs()) for c in configs[1:]]
        async with running(nodes):
            await eventually(lambda: fanout.last is not None, lambda: f"fanout: {fanout.newest_first}")
        assert fanout.newest_first == [i * i for i in range(10, 0, -1)]
        assert fanout.last == {121, 144}

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_call_whose_target_is_down_is_aborted_by_the_callers_agreement():
    async def main():
        configs, addrs = members([4, 1], seed=5)
        outcomes = []

        class Impatient:
            async def run(self, group):
                group.set_abort_policy(0.2, target=1)
                try:
                    outcomes.append(await group.invoke(1, le(1)).get())
                except CallAborted:
                    outcomes.append("aborted")

            def snapshot(self):
                return b""

            def restore(self, state):
                pass

        # The target group's only member never starts.
        async with running([Member(configs[i], addrs, Impatient()) for i in range(4)]):
            await eventually(lambda: len(outcomes) == 4, lambda: f"outcomes {outcomes}")
        assert outcomes == ["aborted"] * 4

    asyncio.run(asyncio.wait_for(main(), 60))


class CountingLedger(Ledger):
    """A ledger that counts its requests and restores."""

    def __init__(self):
        super().__init__()
        self.served = 0
        self.restores = 0

    async def run(self, group):
        while True:
            request = await group.next_request()
            self.balance += i64(request.op)
            self.served += 1
            group.send_result(request, le(self.balance))

    def restore(self, state: bytes) -> None:
        super().restore(state)
        self.restores += 1


def test_a_python_ledger_member_in_a_group_of_phalanxd_members(phalanxd, tmp_path):
    """phalanxd's bank and ledger members with one Python-hosted ledger member, another
    ledger member down: the ledger group's checkpoints need the Python member's vote, so
    they become stable only if its executor state is phalanxd's bytes."""
    base = free_port_block(8)
    subprocess.run(
        [
            str(phalanxd), "keygen", "--protocol", "perpetual", "--groups", "4,4", "--ops", "40",
            "--dir", str(tmp_path), "--insecure-test-crypto", "--base-port", str(base),
            "--metrics-base-port", "0",
        ],
        check=True, capture_output=True, timeout=60,
    )
    config = tmp_path / "cluster.toml"
    # Checkpoints within the 80 batches served (by default one every 128).
    config.write_text(config.read_text().replace("[params]\n", "[params]\ncheckpoint_interval = 32\n", 1))
    cluster = phalanx.load_cluster(config)
    procs = []
    try:
        for i in range(6):  # member 6, a ledger member, stays down
            log = open(tmp_path / f"member-{i}.log", "wb")
            procs.append(subprocess.Popen(
                [str(phalanxd), "run", "--config", str(config), "--id", str(i)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            ))
        ledger = CountingLedger()

        async def main():
            async with Member(cluster.node_config(7), cluster.replicas, ledger) as member:
                await eventually(
                    lambda: ledger.served == 80 and ledger.balance == 0,
                    lambda: f"served {ledger.served}, balance {ledger.balance}",
                    60,
                )
                await eventually(lambda: member.node.status()["stable"] > 0, lambda: "no stable checkpoint")

        asyncio.run(asyncio.wait_for(main(), 90))
        assert ledger.restores == 0
    finally:
        for p in procs:
            p.kill()
            p.wait(10)

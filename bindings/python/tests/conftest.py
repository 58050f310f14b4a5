"""Shared helpers: the repository root, the reference traces, free loopback ports, the
phalanxd binary, clusters of phalanxd processes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Dict, Iterable, List

import pytest

REPO = Path(__file__).resolve().parents[3]
TRACES = REPO / "tests" / "traces"


# Ports come from below the ephemeral range, as the Rust tests' `free_ports` does: a port
# the OS picks (bind to 0) lies in that range, where any process's outgoing connection
# (a node already up, dialing its peers) may take it as its source port before the node
# meant to listen on it binds.
_LOWEST_PORT = 10_000
_handed_out: set = set()


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _is_free(port: int) -> bool:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port_block(count: int) -> int:
    """A base port such that base..base+count-1 are free on loopback now: below the
    ephemeral range, and not handed out before by this process."""
    top = max(_ephemeral_start(), _LOWEST_PORT + 2 * count)
    span = top - _LOWEST_PORT - count
    offset = (os.getpid() * 7919 + len(_handed_out) * 4) % span
    for _ in range(span // count):
        block = range(_LOWEST_PORT + offset, _LOWEST_PORT + offset + count)
        if not _handed_out.intersection(block) and all(_is_free(p) for p in block):
            _handed_out.update(block)
            return block[0]
        offset = (offset + count + 1) % span
    raise RuntimeError(f"no {count} consecutive free loopback ports below {top}")


def free_ports(count: int) -> List[int]:
    """`count` distinct free loopback ports (see `free_port_block`)."""
    base = free_port_block(count)
    return list(range(base, base + count))


def _find_phalanxd() -> Path | None:
    env = os.environ.get("PHALANXD")
    if env:
        return Path(env)
    candidates = []
    target = os.environ.get("CARGO_TARGET_DIR")
    if target:
        candidates.append(Path(target) / "debug" / "phalanxd")
    candidates.append(REPO / "target" / "debug" / "phalanxd")
    for c in candidates:
        if c.exists():
            return c
    found = shutil.which("phalanxd")
    return Path(found) if found else None


@pytest.fixture(scope="session")
def phalanxd() -> Path:
    path = _find_phalanxd()
    if path is None or not path.exists():
        if os.environ.get("PHALANX_REQUIRE_PHALANXD"):
            pytest.fail("phalanxd not found: build it with `cargo build -p phalanx-host --bin phalanxd` (or set PHALANXD)")
        pytest.skip("phalanxd not built (set PHALANXD or build it with cargo build -p phalanx-host --bin phalanxd)")
    return path


class PhalanxdCluster:
    """A ``phalanxd keygen`` cluster in ``dir`` on free loopback ports (insecure test
    crypto), whose processes the test starts; ``stop_all`` kills them. ``metrics`` gives
    every node a metrics address (``metrics_base + i``)."""

    def __init__(
        self, binary: Path, dir: Path, *, protocol: str = "pbft", clients: int = 2, brokers: int = 0,
        metrics: bool = False,
    ):
        self.binary = binary
        self.dir = dir
        nodes = 4 + brokers
        base = free_port_block(2 * nodes if metrics else nodes)
        self.metrics_base = base + nodes if metrics else 0
        subprocess.run(
            [
                str(binary), "keygen", "--dir", str(dir), "--insecure-test-crypto", "--protocol", protocol,
                "--base-port", str(base), "--metrics-base-port", str(self.metrics_base),
                "--clients", str(clients), "--brokers", str(brokers),
            ],
            check=True, capture_output=True, timeout=60,
        )
        self.config = dir / "cluster.toml"
        self.procs: Dict[int, subprocess.Popen] = {}

    def start(self, ids: Iterable[int], command: str = "run") -> None:
        """Starts ``phalanxd <command> --id i`` (``run``: replicas, ``broker``: brokers)."""
        for i in ids:
            with open(self.dir / f"{command}-{i}.log", "wb") as log:
                self.procs[i] = subprocess.Popen(
                    [str(self.binary), command, "--config", str(self.config), "--id", str(i)],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )

    def kill(self, i: int) -> None:
        p = self.procs.pop(i, None)
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(10)

    def stop_all(self) -> None:
        for i in list(self.procs):
            self.kill(i)

    def logs(self) -> str:
        return "\n".join(
            f"--- {log.stem} ---\n" + log.read_text(errors="replace")[-2000:] for log in sorted(self.dir.glob("*.log"))
        )

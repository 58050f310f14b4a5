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


def free_ports(count: int) -> List[int]:
    """`count` distinct free loopback ports (the OS picks them)."""
    socks, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def free_port_block(count: int) -> int:
    """A base port such that base..base+count-1 are all free on loopback."""
    for _ in range(200):
        base = free_ports(1)[0]
        if base + count >= 65535:
            continue
        ok = True
        for p in range(base, base + count):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                ok = False
            finally:
                s.close()
            if not ok:
                break
        if ok:
            return base
    raise RuntimeError("no block of free ports found")


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

"""Shared helpers: the repository root, the reference traces, free loopback ports, the
phalanxd binary."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from typing import List

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

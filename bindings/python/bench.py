#!/usr/bin/env python3
"""Benchmark (not a test): inputs per second through the Python API — single
``handle``/``drain`` calls and the batch form ``handle_many`` — against the same trace
replayed by the core alone in Rust (``Trace.time_native``), and their ratios.

    python bindings/python/bench.py [TRACE ...] [--seconds S]

Defaults to every trace in tests/traces/ (the figures are summed over them)."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import phalanx

REPO = Path(__file__).resolve().parents[2]


def per_call(trace, inputs) -> float:
    node = phalanx.Node(trace.node_config)
    started = time.perf_counter()
    handle, drain = node.handle, node.drain
    for now, inp in inputs:
        try:
            handle(now, inp)
        except phalanx.HandleError:
            pass
        drain()
    return time.perf_counter() - started


def batch(trace, inputs) -> float:
    node = phalanx.Node(trace.node_config)
    errors: list = []
    started = time.perf_counter()
    node.handle_many(inputs, errors)
    return time.perf_counter() - started


def best(fn, seconds: float) -> float:
    """The fastest of repeated runs within about `seconds`."""
    times = []
    end = time.perf_counter() + seconds
    while not times or time.perf_counter() < end:
        times.append(fn())
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--seconds", type=float, default=1.0, help="time spent per trace and mode")
    args = ap.parse_args()
    paths = args.traces or sorted((REPO / "tests" / "traces").glob("*.trace"))
    total = {"rust": 0.0, "single": 0.0, "batch": 0.0}
    n_inputs = 0
    ratios = {"single": [], "batch": []}
    print(f"{'trace':48} {'inputs':>7} {'rust in/s':>12} {'single in/s':>12} {'batch in/s':>12} {'single':>7} {'batch':>7}")
    for path in paths:
        trace = phalanx.Trace.load(path)
        inputs = [(r.now, r.input) for r in trace]
        n = len(inputs)
        rust = best(lambda: trace.time_native(1), args.seconds)
        single = best(lambda: per_call(trace, inputs), args.seconds)
        bat = best(lambda: batch(trace, inputs), args.seconds)
        total["rust"] += rust
        total["single"] += single
        total["batch"] += bat
        n_inputs += n
        ratios["single"].append(rust / single)
        ratios["batch"].append(rust / bat)
        print(
            f"{path.name:48} {n:7d} {n / rust:12,.0f} {n / single:12,.0f} {n / bat:12,.0f} "
            f"{rust / single:6.2f}x {rust / bat:6.2f}x"
        )
    r, s, b = (n_inputs / total[k] for k in ("rust", "single", "batch"))
    print(f"{'ALL (' + str(len(paths)) + ' traces)':48} {n_inputs:7d} {r:12,.0f} {s:12,.0f} {b:12,.0f} {s / r:6.2f}x {b / r:6.2f}x")
    gs, gb = (math.exp(sum(map(math.log, ratios[k])) / len(ratios[k])) for k in ("single", "batch"))
    print(f"{'geometric mean of the per-trace ratios':48} {'':7} {'':12} {'':12} {'':12} {gs:6.2f}x {gb:6.2f}x")
    print(f"\ninputs/s: Rust {r:,.0f}; Python single calls {s:,.0f} ({s / r:.2f}x Rust); "
          f"Python batch {b:,.0f} ({b / r:.2f}x Rust; target >= 0.5x)")


if __name__ == "__main__":
    main()

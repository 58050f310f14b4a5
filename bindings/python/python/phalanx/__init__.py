"""Phalanx: Byzantine-fault-tolerant broadcast and ordering, from Python.

The sans-IO node API (``Node``, ``Input``, ``Output``) is the Rust core itself, through
a thin pyo3 adapter (``phalanx._native``). On top of it, in Python:

- ``HostLoop``: the core's host loop (storage, acknowledgements, compaction, execution
  against a Python application, queries, restores), for hosts of one's own;
- ``Trace`` (load, iterate and ``replay()`` a trace through this API) and ``simulate``;
- ``Client``: an asyncio client of a ``phalanxd`` cluster (key-value put/get/delete/cas,
  ``execute`` for ordered ops and ``read`` for read-only ones);
- ``DistillClient``: an asyncio client of a distillation deployment (``phalanxd`` servers
  and brokers), ``await submit(message)`` returning its ``Delivery(height, seq)``;
- ``Replica``: an asyncio PBFT replica whose application is a Python object, speaking
  ``phalanxd``'s wire framing so Python and native replicas form one cluster.

Quick start::

    import phalanx
    configs = phalanx.generate_cluster(f=1, protocol="pbft", clients=1, seed=7)
    node = phalanx.Node(configs[4])                 # the client
    node.handle(0, phalanx.Submit(b"op"))
    for out in node:                                # drains outputs
        print(out)
"""

from __future__ import annotations

import builtins
import os
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _native
from ._native import (
    FAULT_KINDS,
    BackpressureError,
    ClusterFile,
    ConfigError,
    DivergenceError,
    Event,
    HandleError,
    HostLoop,
    Input,
    KvError,
    KvStore,
    Node,
    Operation,
    Output,
    PhalanxError,
    TraceError,
    TraceRecord,
    describe_config,
    generate_cluster,
    generate_perpetual,
    simulate,
)

__version__ = _native.__version__


class TimeoutError(PhalanxError, builtins.TimeoutError):  # noqa: A001 - deliberately shadows
    """An operation did not complete in time (e.g. no quorum of matching replies).

    A subclass of both ``phalanx.PhalanxError`` and the builtin ``TimeoutError``.
    """


# Input variants, importable at the top level: ``phalanx.Message(sender, data)``.
Message = Input.Message
Publish = Input.Publish
Subscribe = Input.Subscribe
Submit = Input.Submit
Read = Input.Read
Timeout = Input.Timeout
Persisted = Input.Persisted
Executed = Input.Executed
Recover = Input.Recover
Answered = Input.Answered
Call = Input.Call
Respond = Input.Respond
Abort = Input.Abort
Snapshot = Input.Snapshot

# Output variants: ``isinstance(out, phalanx.Send)``.
Send = Output.Send
Deliver = Output.Deliver
Persist = Output.Persist
Fault = Output.Fault
Execute = Output.Execute
Completed = Output.Completed
Query = Output.Query
Restore = Output.Restore
Compact = Output.Compact
Delivered = Output.Delivered
# Perpetual: ``Output.Event(event)`` carries an ``Event`` (``Event.Request``, ``Event.Reply``, ...).


class Trace(_native.Trace):
    """A trace file (DESIGN §3). ``Trace.load(path)`` or ``Trace(data)``; iterate for
    ``TraceRecord(now, input, outputs, next_timeout, error, deferred)``."""

    def replay(self, *, batch: bool = False) -> int:
        """Replays the trace through the Python API (``Node``, ``handle``/``poll`` or
        ``handle_many``) and checks every record: the refusal, each output (equal
        field by field, in order) and the next deadline (a deferred record's input goes
        in without a poll: its round's outputs come with the round's last record).
        Returns the number of outputs compared; raises ``DivergenceError`` naming the
        first differing record.

        ``batch=True`` feeds each round (the deferred records and the one after them)
        with one ``handle_many`` call and compares its outputs and refusals instead.
        """
        node = Node(self.node_config)
        records = self.records
        if batch:
            compared, first = 0, 0
            while first < len(records):
                last = next((i for i in range(first, len(records)) if not records[i].deferred), len(records) - 1)
                round_ = records[first : last + 1]
                where = f"records {first}..{last}"
                errors: List[Tuple[int, str]] = []
                got = node.handle_many([(r.now, r.input) for r in round_], errors)
                want_errors = [(i, r.error) for i, r in enumerate(round_) if r.error is not None]
                if errors != want_errors:
                    raise DivergenceError(f"{where}: refusals: expected {want_errors!r}, got {errors!r}")
                first = last + 1
                if records[last].deferred:  # a trace cut inside a round: never polled
                    break
                expected = records[last].outputs
                if got != expected:
                    i = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(got), len(expected)))
                    exp = expected[i] if i < len(expected) else None
                    g = got[i] if i < len(got) else None
                    raise DivergenceError(f"{where}: output {i}: expected {exp!r}, got {g!r}")
                if node.poll_timeout() != records[last].next_timeout:
                    raise DivergenceError(
                        f"{where}: next timeout: expected {records[last].next_timeout!r}, got {node.poll_timeout()!r}"
                    )
                compared += len(got)
            return compared
        compared = 0
        for i, r in enumerate(records):
            try:
                node.handle(r.now, r.input)
                error = None
            except HandleError as e:
                error = str(e)
            if error != r.error:
                raise DivergenceError(f"record {i}: handle: expected {r.error or 'Ok'!r}, got {error or 'Ok'!r}")
            if r.deferred:
                if r.outputs or r.next_timeout is not None:
                    raise DivergenceError(f"record {i}: a deferred record with outputs or a next timeout")
                continue
            got = node.drain()
            if got != r.outputs:
                j = next((j for j, (a, b) in enumerate(zip(r.outputs, got)) if a != b), min(len(got), len(r.outputs)))
                exp = r.outputs[j] if j < len(r.outputs) else None
                g = got[j] if j < len(got) else None
                raise DivergenceError(
                    f"record {i}: output {j}: expected {exp!r}, got {g!r} "
                    f"({len(r.outputs)} recorded, {len(got)} produced)"
                )
            compared += len(got)
            if node.poll_timeout() != r.next_timeout:
                raise DivergenceError(
                    f"record {i}: next timeout: expected {r.next_timeout!r}, got {node.poll_timeout()!r}"
                )
        return compared


def load_cluster(path: Union[str, "os.PathLike[str]"]) -> ClusterFile:
    """Loads a ``cluster.toml`` written by ``phalanxd keygen`` (raises ``ConfigError``)."""
    return ClusterFile.load(os.fspath(path))


from . import kv  # noqa: E402
from .client import Client  # noqa: E402
from .distill import Delivery, DistillClient  # noqa: E402
from .replica import Replica  # noqa: E402
from . import perpetual  # noqa: E402

__all__ = [
    "Abort",
    "Answered",
    "BackpressureError",
    "Call",
    "Client",
    "ClusterFile",
    "Compact",
    "Completed",
    "ConfigError",
    "Deliver",
    "Delivered",
    "Delivery",
    "DistillClient",
    "DivergenceError",
    "Event",
    "Execute",
    "Executed",
    "FAULT_KINDS",
    "Fault",
    "HandleError",
    "HostLoop",
    "Input",
    "KvError",
    "KvStore",
    "Message",
    "Node",
    "Operation",
    "Output",
    "Persist",
    "Persisted",
    "PhalanxError",
    "Publish",
    "Query",
    "Read",
    "Recover",
    "Replica",
    "Respond",
    "Restore",
    "Send",
    "Snapshot",
    "Submit",
    "Subscribe",
    "Timeout",
    "TimeoutError",
    "Trace",
    "TraceError",
    "TraceRecord",
    "describe_config",
    "generate_cluster",
    "generate_perpetual",
    "kv",
    "perpetual",
    "load_cluster",
    "simulate",
]

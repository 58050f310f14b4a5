"""``phalanx.Replica``: a PBFT replica hosted on asyncio whose application is a Python
object. It speaks ``phalanxd``'s framing, so Python and native replicas form one cluster."""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, Mapping, Optional, Union

from ._host import Address, Host, Hosted
from ._native import ClusterFile, Input, Output, PhalanxError

log = logging.getLogger("phalanx")
PathLike = Union[str, "os.PathLike[str]"]


class Replica(Hosted):
    """A PBFT replica whose state machine is ``app``:

    - ``app.execute(op: bytes) -> bytes`` runs one ordered operation (deterministic!);
    - ``app.snapshot() -> bytes`` captures the state at checkpoints;
    - ``app.restore(snapshot: bytes)`` replaces it (state transfer, restart);
    - optionally ``app.query(op: bytes) -> bytes`` evaluates a client's read-only op
      (``Client.read``) against the current state WITHOUT changing it. Without it the
      replica answers no read, and clients have their reads ordered (``execute``) after
      ``client_retry_ns``.

    ``Replica(config, replicas, app)`` listens on its own address in ``replicas`` (or
    ``listen``) and dials the others. Persistence: with ``storage=None`` the core's
    records are acknowledged at once and kept nowhere, so a restarted replica starts
    empty (it must rejoin as a new, lagging replica: do not restart more than f of them);
    with ``storage=<directory>`` they go to phalanxd's write-ahead log, synced before
    being acknowledged, and are fed back (``Input.Recover``) on start.

    An exception from ``execute`` is logged and the operation's result is ``b""``; an
    exception from ``query``, or a result that is not bytes, is logged and the read is
    left unanswered (the client has it ordered).
    To share state with native ``phalanxd`` replicas use ``phalanx.KvStore()``.
    """

    def __init__(
        self,
        config: bytes,
        replicas: Mapping[int, Address],
        app: Any,
        *,
        storage: Optional[PathLike] = None,
        listen: Optional[Address] = None,
    ):
        for name in ("execute", "snapshot", "restore"):
            if not callable(getattr(app, name, None)):
                raise TypeError(f"the application must have a callable {name}() method ({type(app).__name__} has none)")
        self.app = app
        query = getattr(app, "query", None)
        self._query = query if callable(query) else None
        self._host = Host(config, replicas, on_output=self._on_output, storage=storage, listen=None)
        node = self._host.node
        if node.protocol != "pbft" or node.role != "replica":
            raise PhalanxError(f"node {node.id} is a {node.protocol} {node.role}, not a PBFT replica")
        self._host._listen = listen or self._host._replicas[node.id]
        self.executed_ops = 0
        self.answered_queries = 0

    @classmethod
    def from_cluster_file(
        cls, path: PathLike, id: int, app: Any, *, storage: Optional[PathLike] = None
    ) -> "Replica":
        """Replica ``id`` of the cluster in ``path`` (``cluster.toml`` from ``phalanxd keygen``)."""
        cluster = ClusterFile.load(os.fspath(path))
        return cls(cluster.node_config(id), cluster.replicas, app, storage=storage)

    @property
    def faults(self) -> Dict:
        """Fault evidence seen so far: ``{(node, kind): count}``."""
        return dict(self._host.faults)

    def status(self) -> Dict[str, Any]:
        return self._host.node.status()

    def _on_output(self, out: Output) -> Optional[Input]:
        if isinstance(out, Output.Execute):
            results = []
            for op in out.ops:
                try:
                    r = self.app.execute(op.op)
                    results.append(bytes(r))
                except Exception:
                    log.exception("replica %d: execute raised on batch %d; result b''", self.id, out.seq)
                    results.append(b"")
            self.executed_ops += len(results)
            snapshot = bytes(self.app.snapshot()) if out.snapshot else None
            return Input.Executed(out.seq, results, snapshot)
        if isinstance(out, Output.Query):
            return self._answer(out)
        if isinstance(out, Output.Restore):
            log.info("replica %d: restoring the application at batch %d", self.id, out.seq)
            self.app.restore(out.snapshot)
        return None

    def _answer(self, out: Output.Query) -> Optional[Input]:
        """The application's answer to a read-only op, or nothing (the client orders it)."""
        if self._query is None:
            return None
        try:
            result = self._query(out.op)
        except Exception:
            log.exception(
                "replica %d: query raised on request %d of client %d; not answered", self.id, out.request, out.client
            )
            return None
        if not isinstance(result, (bytes, bytearray, memoryview)):
            log.error(
                "replica %d: query returned %s, not bytes, on request %d of client %d; not answered",
                self.id,
                type(result).__name__,
                out.request,
                out.client,
            )
            return None
        self.answered_queries += 1
        return Input.Answered(out.client, out.request, bytes(result))

    def __repr__(self) -> str:
        return f"Replica(id={self.id}, app={type(self.app).__name__})"

"""``phalanx.Replica``: a PBFT replica hosted on asyncio whose application is a Python
object. It speaks ``phalanxd``'s framing, so Python and native replicas form one cluster;
the core's host loop (``HostLoop``) executes, snapshots, answers queries, restores and
keeps the write-ahead log, as in ``phalanxd``."""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Union

from ._host import Address, Host, Hosted
from ._native import ClusterFile, PhalanxError

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
        self.app = app
        self._host = Host(config, replicas, app=app, storage=storage)
        node = self._host.node
        if node.protocol != "pbft" or node.role != "replica":
            raise PhalanxError(f"node {node.id} is a {node.protocol} {node.role}, not a PBFT replica")
        self._host._listen = listen or self._host._replicas[node.id]

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

    @property
    def executed_ops(self) -> int:
        """Operations ``app.execute`` ran."""
        return self._host.host_loop.executed_ops

    @property
    def answered_queries(self) -> int:
        """Read-only ops ``app.query`` answered."""
        return self._host.host_loop.answered_queries

    def __repr__(self) -> str:
        return f"Replica(id={self.id}, app={type(self.app).__name__})"

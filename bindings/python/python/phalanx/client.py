"""``phalanx.Client``: an asyncio client of a PBFT cluster (``phalanxd`` or Python
``Replica``\\ s). The core client node decides when a result stands: a quorum of
⌈(n+f+1)/2⌉ replicas (2f+1 at n = 3f+1) agrees on an ordered op (``execute``), 2f+1 on
a read-only one (``read``)."""

from __future__ import annotations

import asyncio
import os
from typing import Callable, Dict, Mapping, Optional, Tuple, Union

from . import kv
from ._host import Address, Host, Hosted
from ._native import BackpressureError, ClusterFile, Input, Output, PhalanxError

PathLike = Union[str, "os.PathLike[str]"]


class Client(Hosted):
    """A PBFT client node hosted on asyncio, connected to every replica.

    ``Client(config, replicas)`` takes this client's encoded configuration and every
    replica's ``(host, port)``; ``Client.from_cluster_file(path, id)`` reads them from a
    ``phalanxd keygen`` cluster file. Use it as ``async with`` (or ``await start()`` /
    ``await close()``).

    Request numbers: the core persists a lease on them before the first request leaves.
    With ``storage=None`` the lease is acknowledged in memory only, so a client restarted
    with the same id reuses request numbers and its first requests may be answered from
    the replicas' reply cache; pass ``storage=<directory>`` (phalanxd's write-ahead log, synced
    before acknowledging) to avoid that. ``from_cluster_file`` defaults to
    ``data/client-<id>`` beside the cluster file, the directory ``phalanxd client`` uses.
    """

    def __init__(
        self,
        config: bytes,
        replicas: Mapping[int, Address],
        *,
        storage: Optional[PathLike] = None,
        timeout: float = 10.0,
    ):
        self._host = Host(config, replicas, on_output=self._on_output, storage=storage)
        if self._host.node.protocol != "pbft" or self._host.node.role != "client":
            raise PhalanxError(
                f"node {self._host.id} is a {self._host.node.protocol} {self._host.node.role}, not a PBFT client"
            )
        self.timeout = timeout
        self._pending: Dict[int, asyncio.Future] = {}
        self._completed_event: Optional[asyncio.Event] = None
        self._started = False

    @classmethod
    def from_cluster_file(
        cls,
        path: PathLike,
        id: Optional[int] = None,
        *,
        storage: Union[PathLike, None, bool] = True,
        timeout: float = 10.0,
    ) -> "Client":
        """A client of the cluster in ``path`` (``cluster.toml``); ``id`` defaults to the
        first client. ``storage=True`` keeps leases in ``data/client-<id>`` beside
        the file, ``False``/``None`` in memory."""
        cluster = ClusterFile.load(os.fspath(path))
        if id is None:
            if not cluster.clients:
                raise PhalanxError(f"{cluster.path}: the cluster file lists no client")
            id = cluster.clients[0]
        if storage is True:
            storage = os.path.join(os.path.dirname(os.path.abspath(os.fspath(path))), "data", f"client-{id}")
        elif storage is False:
            storage = None
        return cls(cluster.node_config(id), cluster.replicas, storage=storage, timeout=timeout)

    async def start(self) -> None:
        if not self._started:
            self._completed_event = asyncio.Event()
            await super().start()
            self._started = True

    async def stop(self) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.cancel()
        await super().stop()

    close = stop

    def _on_output(self, out: Output) -> None:
        if isinstance(out, Output.Completed):
            fut = self._pending.pop(out.request, None)
            if fut is not None and not fut.done():
                fut.set_result(out.result)
            if self._completed_event is not None:
                self._completed_event.set()

    async def execute(self, op: bytes, *, timeout: Optional[float] = None) -> bytes:
        """Orders ``op`` and returns its result once a quorum of replicas agrees
        (⌈(n+f+1)/2⌉, 2f+1 at n = 3f+1). Raises
        ``phalanx.TimeoutError`` if that takes longer than ``timeout`` seconds."""
        return await self._request(Input.Submit, op, timeout, "no quorum of matching replies")

    async def read(self, op: bytes, *, timeout: Optional[float] = None) -> bytes:
        """Evaluates the read-only ``op`` at every replica without ordering it, and
        returns its result once 2f+1 replicas agree (each replica's application answers
        with ``query(op)``, from the state it has executed). When they disagree, or 2f+1
        matching answers do not arrive within the cluster's ``client_retry_ns`` (e.g. the
        replicas' application has no ``query``), the core has ``op`` ordered like
        ``execute`` instead, under the same request number. Raises
        ``phalanx.TimeoutError`` if it takes longer than ``timeout`` seconds."""
        return await self._request(Input.Read, op, timeout, "no 2f+1 matching answers nor a quorum of matching replies")

    async def _request(
        self, kind: Callable[[bytes], Input], op: bytes, timeout: Optional[float], missing: str
    ) -> bytes:
        """Feeds ``kind(op)`` (``Submit`` or ``Read``) under the next request number,
        waiting while the core applies backpressure, and awaits its ``Completed``."""
        from . import TimeoutError

        if not isinstance(op, (bytes, bytearray, memoryview)):
            raise TypeError(f"op must be bytes, got {type(op).__name__}")
        await self.start()
        timeout = self.timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            request = self._host.node.next_request()
            fut = loop.create_future()
            if request is not None:
                self._pending[request] = fut
            try:
                self._host.process(kind(bytes(op)), raise_errors=True)
                break
            except BackpressureError:
                self._pending.pop(request, None)
                assert self._completed_event is not None
                self._completed_event.clear()
                left = deadline - loop.time()
                try:
                    await asyncio.wait_for(self._completed_event.wait(), max(left, 0))
                except asyncio.TimeoutError:
                    raise TimeoutError(
                        f"client {self.id}: {len(self._pending)} requests outstanding and none completed "
                        f"within {timeout:g}s (is a quorum of replicas running?)"
                    ) from None
            except BaseException:
                self._pending.pop(request, None)
                raise
        try:
            return await asyncio.wait_for(asyncio.shield(fut), max(deadline - loop.time(), 0))
        except asyncio.TimeoutError:
            raise TimeoutError(
                f"client {self.id}: request {request}: {missing} within {timeout:g}s "
                f"(is a quorum of replicas running and reachable?)"
            ) from None

    async def put(self, key: bytes, value: bytes, *, timeout: Optional[float] = None) -> Optional[bytes]:
        """Writes ``value`` at ``key``; returns the value before (None: absent)."""
        return kv.decode_value(await self.execute(kv.put(key, value), timeout=timeout))

    async def get(self, key: bytes, *, timeout: Optional[float] = None) -> Optional[bytes]:
        """Reads ``key`` through consensus (None: absent)."""
        return kv.decode_value(await self.execute(kv.get(key), timeout=timeout))

    async def delete(self, key: bytes, *, timeout: Optional[float] = None) -> Optional[bytes]:
        """Deletes ``key``; returns the value before."""
        return kv.decode_value(await self.execute(kv.delete(key), timeout=timeout))

    async def cas(
        self, key: bytes, expected: Optional[bytes], new: bytes, *, timeout: Optional[float] = None
    ) -> kv.CasResult:
        """Writes ``new`` if the value is ``expected`` (None: absent); returns
        ``CasResult(swapped, before)``."""
        return kv.decode_cas(await self.execute(kv.cas(key, expected, new), timeout=timeout))

    def __repr__(self) -> str:
        return f"Client(id={self.id}, replicas={sorted(self._host._replicas)})"

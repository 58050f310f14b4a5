"""``phalanx.DistillClient``: an asyncio client of a distillation deployment (``phalanxd
run`` servers and ``phalanxd broker``\\ s). It is phalanx-host's client, the one
``phalanxd client submit`` runs: one of the generated directory's clients, reaching the
brokers over UDP, resubmitting through the next broker when one goes quiet."""

from __future__ import annotations

import asyncio
import os
from typing import NamedTuple, Optional, Union

from . import _native
from ._native import ClusterFile, PhalanxError

PathLike = Union[str, "os.PathLike[str]"]


class Delivery(NamedTuple):
    """Where a message was delivered: the height of the batch that held it, and the seq
    it was delivered with (a client's seqs increase with each message it submits)."""

    height: int
    seq: int


class DistillClient:
    """Client ``index`` of a distillation deployment's generated directory, hosted in
    this process (its node, event loop and UDP socket on threads of their own).

    ``DistillClient.from_cluster_file(path, index)`` reads the deployment from a
    ``phalanxd keygen --protocol distill`` cluster file. Use it as ``async with`` (or
    ``await start()`` / ``await close()``); ``submit`` starts it when needed.

    The client keeps its seq range and last height record in phalanxd's write-ahead log,
    so a restarted client goes on from there: ``storage=True`` or ``None`` puts it in
    ``data/client-<id>`` beside the cluster file, where ``phalanxd client submit`` keeps
    it; a path puts it there. There is no in-memory storage.
    """

    def __init__(
        self,
        cluster: ClusterFile,
        index: int = 0,
        *,
        storage: Union[PathLike, bool, None] = True,
        timeout: float = 10.0,
    ):
        if storage is False:
            raise ValueError("a distillation client always keeps its write-ahead log: pass storage=True or a directory")
        self.cluster = cluster
        self.index = index
        self.timeout = timeout
        self._data_dir = None if storage is True or storage is None else os.fspath(storage)
        self._native: Optional[_native.DistillClient] = None
        # Held while starting and while a message is in flight: one at a time, as
        # phalanxd's client (the core client takes them in turn). Made on first use, on
        # the running loop.
        self._turn: Optional[asyncio.Lock] = None

    @classmethod
    def from_cluster_file(
        cls,
        path: PathLike,
        index: int = 0,
        *,
        storage: Union[PathLike, bool, None] = True,
        timeout: float = 10.0,
    ) -> "DistillClient":
        """Client ``index`` of the deployment in ``path`` (``cluster.toml``). Raises
        ``ConfigError`` for a file that does not load; an index beyond the directory
        raises it on ``start``."""
        return cls(ClusterFile.load(os.fspath(path)), index, storage=storage, timeout=timeout)

    @property
    def id(self) -> int:
        """The client's node id (the directory's base address plus ``index``), once started."""
        if self._native is None:
            raise PhalanxError(f"distillation client {self.index}: not started")
        return self._native.id

    def _lock(self) -> asyncio.Lock:
        if self._turn is None:
            self._turn = asyncio.Lock()
        return self._turn

    async def start(self) -> None:
        """Starts the client's node (raises ``ConfigError`` when the directory has no
        client ``index``, ``StorageError`` when its log cannot be opened)."""
        async with self._lock():
            await self._started()

    async def _started(self) -> _native.DistillClient:
        """The native client, started now if it was not (with the lock held)."""
        if self._native is None:
            self._native = await asyncio.to_thread(_native.DistillClient, self.cluster, self.index, self._data_dir)
        return self._native

    async def close(self) -> None:
        """Stops the client's node once a message in flight returns; submissions waiting
        their turn then raise ``PhalanxError``."""
        if self._native is not None:
            await asyncio.to_thread(self._native.stop)

    async def __aenter__(self) -> "DistillClient":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def submit(
        self, message: Union[bytes, bytearray, memoryview, str], *, timeout: Optional[float] = None
    ) -> Delivery:
        """Broadcasts ``message`` (a ``str`` is sent as UTF-8) through the brokers and
        returns its certified ``Delivery``. Concurrent calls wait their turn. Raises
        ``phalanx.TimeoutError`` when no delivery comes within ``timeout`` seconds of its
        turn (default the client's): the message may still be delivered, as the client
        resubmits it meanwhile; ``HandleError`` when the core refuses it (longer than the
        deployment's ``max_payload``)."""
        if isinstance(message, str):
            message = message.encode()
        timeout = self.timeout if timeout is None else timeout
        async with self._lock():
            native = await self._started()
            # Cancelling this await leaves the call running in its thread; the native
            # client still takes one message at a time.
            height, seq = await asyncio.to_thread(native.submit, message, timeout)
        return Delivery(height, seq)

    def __repr__(self) -> str:
        return f"DistillClient(index={self.index}, cluster={self.cluster.path!r})"

"""The asyncio host shared by ``Client`` and ``Replica``: one core ``Node`` in the
core's host loop (``HostLoop``: storage, acknowledgements, compaction, the application),
TCP connections with ``phalanxd``'s framing, and the core's timers.

Wire framing (as ``host-native/src/net.rs``): every node dials every replica; a
connection opens with a hello, the 4 bytes ``PHX1`` and the dialer's node id (u32
little-endian), then frames, each a u32 little-endian length and that many bytes. A node
sends to a replica on the connection it dialed, and to a client on the connection the
client dialed. Frames are fed to the core as ``Message(sender=<peer id>, data)``; the
hello is not trusted (the core authenticates every frame).

Slots (as ``phalanxd``): at most ``MAX_CONNECTIONS`` accepted connections (fewer if the
process's limit on open files leaves less room). One is proven once a frame on it
carries a valid MAC from the node its hello named (``Node.authentic``); a dialer sends
one right after its hello (``Node.proof``: a frame carrying nothing). When every slot
is taken, a newcomer takes the slot of the oldest unproven connection, so strangers
without keys cannot lock out the nodes that hold them; a node keeps at most
``MAX_PER_ID`` proven connections (its oldest go), so a faulty one cannot either. A
client is sent to on its newest proven connection, or, before it has one, on the newest
that named it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import struct
import time
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Tuple

from ._native import HandleError, HostLoop, Input, Node, Output, PhalanxError

log = logging.getLogger("phalanx")

HELLO_MAGIC = b"PHX1"
# Far above any frame the core sends (max_message_bytes defaults to 1 MiB): a length
# prefix over this closes the connection instead of allocating.
MAX_FRAME = 64 << 20
# Frames queued for a replica while its connection is down; the oldest are dropped.
MAX_QUEUED = 8192
MAX_CONNECTIONS = 1024
MAX_PER_ID = 4
# Descriptors a process keeps beside a host's accepted connections.
FILES_BESIDE_CONNECTIONS = 64
_LEN = struct.Struct("<I")

Address = Tuple[str, int]


class _Peer:
    """A replica this node dials: its connection (when up) and the frames waiting for it."""

    def __init__(self, id: int, address: Address):
        self.id = id
        self.address = address
        self.writer: Optional[asyncio.StreamWriter] = None
        self.queue: Deque[bytes] = collections.deque(maxlen=MAX_QUEUED)
        self.task: Optional[asyncio.Task] = None


class _Accepted:
    """An accepted connection: the id its hello named, and whether a frame proved it."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.writer = writer
        self.sender: Optional[int] = None
        self.proven = False


def _connection_room() -> int:
    """``MAX_CONNECTIONS``, or fewer where the process's soft limit on open files leaves
    less room: past it an accept fails and takes no stranger's slot."""
    try:
        import resource
    except ImportError:  # not a Unix
        return MAX_CONNECTIONS
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(0, min(MAX_CONNECTIONS, soft - FILES_BESIDE_CONNECTIONS))


def _frame(data: bytes) -> bytes:
    return _LEN.pack(len(data)) + data


class Host:
    """Runs one core node on asyncio, in the core's host loop with ``app`` (a PBFT
    replica's application) and ``storage`` (a directory for phalanxd's write-ahead log, or
    ``None``: memory). ``on_output`` sees what is for the application (``Completed``,
    ``Deliver``)."""

    def __init__(
        self,
        config: bytes,
        replicas: Mapping[int, Address],
        *,
        on_output: Callable[[Output], None] = lambda out: None,
        app: Any = None,
        storage: Optional["os.PathLike[str] | str"] = None,
        listen: Optional[Address] = None,
    ):
        self.node = Node(config)
        self.id: int = self.node.id
        self._replicas = {int(k): (str(v[0]), int(v[1])) for k, v in replicas.items()}
        missing = [r for r in self.node.replica_ids if r not in self._replicas]
        if missing:
            raise PhalanxError(f"no address for replica(s) {missing}: pass every replica's (host, port)")
        self._on_output = on_output
        self.host_loop = HostLoop(self.node, app, storage=None if storage is None else os.fspath(storage))
        self._listen = listen
        self._start_ns = time.monotonic_ns()
        self._peers: Dict[int, _Peer] = {
            r: _Peer(r, self._replicas[r]) for r in self.node.replica_ids if r != self.id
        }
        # Accepted connections, oldest first; those that named each id, and those its
        # frames proved, oldest first.
        self._accepted: Dict[_Accepted, None] = {}
        self._claims: Dict[int, List[_Accepted]] = collections.defaultdict(list)
        self._proven: Dict[int, List[_Accepted]] = collections.defaultdict(list)
        self._conn_tasks: set = set()
        self._max_connections = MAX_CONNECTIONS
        self._server: Optional[asyncio.base_events.Server] = None
        self._timer: Optional[asyncio.TimerHandle] = None
        self._timer_at: Optional[int] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._closed = False
        self.faults: Dict[Tuple[int, str], int] = collections.Counter()
        self.frames_in = 0
        self.frames_out = 0

    def now(self) -> int:
        return time.monotonic_ns() - self._start_ns

    # -- life cycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.host_loop.recover(self.now()):
            self._settle()
        if self._listen is not None:
            self._max_connections = _connection_room()
            host, port = self._listen
            self._server = await asyncio.start_server(self._on_accept, host, port)
        for peer in self._peers.values():
            peer.task = self._loop.create_task(self._dial(peer))
        self._reschedule()

    async def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._server is not None:
            self._server.close()
        tasks = [p.task for p in self._peers.values() if p.task is not None] + list(self._conn_tasks)
        for p in self._peers.values():
            if p.writer is not None:
                p.writer.close()
        for conn in list(self._accepted):
            conn.writer.close()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            except (asyncio.TimeoutError, Exception):
                pass

    # -- the core -------------------------------------------------------------------------

    def process(self, input: Input, *, raise_errors: bool = False) -> None:
        """Feeds one input and settles. A refused input raises ``HandleError`` when
        ``raise_errors``, and is logged otherwise."""
        if self._closed:
            raise PhalanxError("this node is stopped")
        try:
            self.host_loop.handle(self.now(), input)
        except HandleError:
            if raise_errors:
                self._settle()
                raise
            log.exception("node %d refused %r", self.id, input)
        self._settle()

    def _feed(self, inputs: List[Tuple[int, Input]]) -> None:
        if self._closed:
            return
        errors: List[Tuple[int, str]] = []
        self.host_loop.handle_many(inputs, errors)
        for i, e in errors:
            log.error("node %d refused input %d: %s", self.id, i, e)
        self._settle()

    def _settle(self) -> None:
        """Everything the node has for the world: sends, faults, and for the application
        completions and deliveries (the host loop syncs storage and acknowledges it,
        executes, answers queries and restores on its own)."""
        for out in self.host_loop.drain(self.now()):
            if isinstance(out, Output.Send):
                self._send(out.to, out.data)
            elif isinstance(out, Output.Fault):
                self.faults[(out.node, out.kind)] += 1
                log.debug("node %d: fault by %d: %s", self.id, out.node, out.kind)
            else:
                self._on_output(out)
        self._reschedule()

    def _reschedule(self) -> None:
        if self._closed or self._loop is None:
            return
        at = self.host_loop.poll_timeout()
        if at == self._timer_at and (self._timer is not None or at is None):
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at is not None:
            delay = max(0.0, (at - self.now()) / 1e9)
            self._timer = self._loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if self._closed:
            return
        at = self.host_loop.poll_timeout()
        if at is not None and at <= self.now():
            self.process(Input.Timeout())
        else:
            self._reschedule()

    # -- network --------------------------------------------------------------------------

    def _send(self, to: int, data: bytes) -> None:
        frame = _frame(data)
        peer = self._peers.get(to)
        if peer is not None:
            if peer.writer is not None and not peer.writer.is_closing():
                peer.writer.write(frame)
                self.frames_out += 1
            else:
                peer.queue.append(frame)
            return
        w = self._route(to)
        if w is not None and not w.is_closing():
            if w.transport.get_write_buffer_size() < MAX_FRAME:
                w.write(frame)
                self.frames_out += 1
        # Otherwise: a client that is not connected; it retries.

    async def _dial(self, peer: _Peer) -> None:
        backoff = 0.02
        while not self._closed:
            try:
                reader, writer = await asyncio.open_connection(*peer.address)
            except OSError:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 0.5)
                continue
            backoff = 0.02
            writer.write(HELLO_MAGIC + _LEN.pack(self.id))
            # Proven before it has anything to say (a subscriber may never say anything).
            proof = self.node.proof(peer.id)
            if proof is not None:
                writer.write(_frame(proof))
            while peer.queue:
                writer.write(peer.queue.popleft())
            peer.writer = writer
            try:
                await self._read_frames(reader, peer.id)
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                peer.writer = None
                writer.close()
            if not self._closed:
                await asyncio.sleep(backoff)

    def _route(self, to: int) -> Optional[asyncio.StreamWriter]:
        """The connection a client is sent to: its newest proven one, else the newest that
        named it."""
        claims = self._claims.get(to)
        if not claims:
            return None
        newest_proven = next((c for c in reversed(claims) if c.proven), None)
        return (newest_proven or claims[-1]).writer

    def _drop(self, conn: _Accepted) -> None:
        """Forgets an accepted connection and closes it."""
        if conn in self._accepted:
            del self._accepted[conn]
            for lists in (self._claims, self._proven):
                held = lists.get(conn.sender)  # type: ignore[arg-type]
                if held is not None and conn in held:
                    held.remove(conn)
                    if not held:
                        del lists[conn.sender]  # type: ignore[arg-type]
        conn.writer.close()

    def _prove(self, conn: _Accepted) -> None:
        """A frame with ``conn.sender``'s MAC proved ``conn``; that node's proven
        connections beyond ``MAX_PER_ID`` go, the oldest first."""
        conn.proven = True
        proven = self._proven[conn.sender]  # type: ignore[index]
        proven.append(conn)
        if len(proven) > MAX_PER_ID:
            self._drop(proven[0])

    async def _on_accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Accepted(writer)
        if len(self._accepted) >= self._max_connections:
            oldest = next((c for c in self._accepted if not c.proven), None)
            if oldest is None:
                writer.close()
                return
            self._drop(oldest)
        self._accepted[conn] = None
        task = asyncio.current_task()
        self._conn_tasks.add(task)
        try:
            hello = await asyncio.wait_for(reader.readexactly(8), 10.0)
            if hello[:4] != HELLO_MAGIC or conn not in self._accepted:
                return
            (conn.sender,) = _LEN.unpack(hello[4:])
            self._claims[conn.sender].append(conn)
            await self._read_frames(reader, conn.sender, conn)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            pass
        except asyncio.CancelledError:
            # Closing: end quietly (asyncio's server callback would report a cancelled
            # handler task as an error on Python < 3.12).
            pass
        finally:
            self._drop(conn)
            self._conn_tasks.discard(task)

    async def _read_frames(
        self, reader: asyncio.StreamReader, sender: int, accepted: Optional[_Accepted] = None
    ) -> None:
        """Feeds the frames from ``sender`` to the core; on an ``accepted`` connection,
        checks them until one proves it."""
        buf = bytearray()
        while not self._closed:
            chunk = await reader.read(1 << 16)
            if not chunk:
                return
            buf += chunk
            batch = []
            at = 0
            while len(buf) - at >= 4:
                (n,) = _LEN.unpack_from(buf, at)
                if n > MAX_FRAME:
                    log.warning("node %d: frame of %d bytes from %d: closing", self.id, n, sender)
                    return
                if len(buf) - at - 4 < n:
                    break
                data = bytes(buf[at + 4 : at + 4 + n])
                if accepted is not None and not accepted.proven and self.node.authentic(sender, data):
                    self._prove(accepted)
                batch.append(Input.Message(sender, data))
                at += 4 + n
            del buf[:at]
            if batch:
                self.frames_in += len(batch)
                now = self.now()
                self._feed([(now, m) for m in batch])


class Hosted:
    """What the asyncio client and replica share: a :class:`Host` started and stopped
    with them, usable as ``async with``."""

    _host: Host

    @property
    def id(self) -> int:
        return self._host.id

    @property
    def node(self):
        """The core node (for ``status()`` and ``stats()``; do not feed it directly)."""
        return self._host.node

    async def start(self) -> None:
        await self._host.start()

    async def stop(self) -> None:
        await self._host.close()

    async def __aenter__(self):
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

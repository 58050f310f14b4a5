"""``phalanx.perpetual``: Perpetual groups (seed 002) hosted on asyncio — replicated
services calling replicated services — with the seed's futures API.

A member runs its group's service, ``service.run(group)``, a coroutine written against
:class:`Group`: ``group.invoke(target, op)`` returns an :class:`Invocation` whose
``await get()`` gives the agreed outcome (its reply, or raises :class:`CallAborted`);
``get(timeout=…)`` and ``cancel()`` only *request* an abort, as an abort policy does;
``await group.next_result()`` takes outcomes in agreement order; serving, ``await
group.next_request()`` takes the next agreed request and ``group.send_result(request,
result)`` answers it, now or later. There is no ``is_done``: calls complete at different
times at different members, so polling would split them.

The program runs in lock-step with its member's agreed events, as in ``phalanxd``
(``phalanx_host::perpetual``): an event is handed over only when the program awaits
something the events so far do not satisfy, so what it does is the same at every correct
member, and a checkpoint is taken while it waits — ``service.snapshot()`` with the agreed
events it has not taken yet, in the same bytes as ``phalanxd``'s, so Python and native
members can share a group. A restore cancels the program (its pending ``Group`` call
raises :class:`Interrupted`), replaces its state (``service.restore(state)``) and runs it
again. A program must not await anything but its ``Group`` between events (its member
waits for it).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import struct
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Tuple, TypeVar

from ._host import Address, Host, Hosted
from ._native import Event, Input, Output, PhalanxError

log = logging.getLogger("phalanx.perpetual")
T = TypeVar("T")


class CallAborted(PhalanxError):
    """The group agreed to abort the call."""


class Interrupted(BaseException):
    """The program's state is being replaced (or its member stops): let it propagate out
    of ``run``. A ``BaseException``, so ``except Exception`` does not swallow it."""


@dataclass(frozen=True)
class Incoming:
    """A request of another group, agreed by this one."""

    caller: int
    call: int
    op: bytes


@dataclass(frozen=True)
class Result:
    """An outcome from :meth:`Group.next_result`: ``value`` is the reply, ``None`` if the
    call was aborted."""

    call: int
    value: Optional[bytes]


class Invocation:
    """A call made with :meth:`Group.invoke`; its outcome is taken once."""

    def __init__(self, group: "Group", call: int):
        self._group = group
        self.call = call

    async def get(self, timeout: Optional[float] = None) -> bytes:
        """The reply; raises :class:`CallAborted` if the group agreed to abort. With
        ``timeout`` (seconds), an abort is requested after it — the outcome may still be
        the reply."""
        return await self._group._outcome(self.call, timeout)

    def cancel(self) -> None:
        """Requests an abort; ``get`` says what the group agreed."""
        self._group._ask(Input.Abort(self.call))

    def __repr__(self) -> str:
        return f"Invocation(call={self.call})"


class Group:
    """The program's side of its member: the seed's API."""

    def __init__(self, window: int, ask: Callable[[Any], None]):
        # Agreed, and in checkpoints.
        self._next_call = 1
        self._undecided: Dict[int, int] = {}
        self._requests: Deque[Incoming] = collections.deque()
        self._decided: Deque[Tuple[int, Optional[bytes]]] = collections.deque()
        # Local.
        self._window = max(1, window)
        self._ask = ask
        self._delivered = 0
        self._considered = 0
        self._waiting = False
        self._interrupted = False
        self._wakeups: List[asyncio.Future] = []
        self._settled = asyncio.Event()
        self._policy: Optional[float] = None
        self._target_policy: Dict[int, Optional[float]] = {}
        self._abort_timers: Dict[int, asyncio.TimerHandle] = {}

    # -- the program's calls ------------------------------------------------------------

    def invoke(self, target: int, op: bytes, *, abort_after: Optional[float] = ...) -> Invocation:  # type: ignore[assignment]
        """Calls group ``target`` with ``op``, under ``abort_after`` seconds (default: the
        policy for ``target``, else the group's). Raises ``PhalanxError`` while the call
        window is full (take outcomes first)."""
        oldest = min(self._undecided, default=self._next_call)
        if self._next_call - oldest >= self._window:
            raise PhalanxError(f"the call window ({self._window}) is full: take outcomes first")
        call = self._next_call
        self._next_call += 1
        self._undecided[call] = target
        if abort_after is ...:
            abort_after = self._target_policy.get(target, self._policy)
        if abort_after is not None:
            loop = asyncio.get_running_loop()
            self._abort_timers[call] = loop.call_later(abort_after, self._ask, Input.Abort(call))
        self._ask(Input.Call(target, op))
        return Invocation(self, call)

    async def invoke_and_wait(self, target: int, op: bytes) -> bytes:
        return await self.invoke(target, op).get()

    async def next_result(self) -> Result:
        """The next outcome in agreement order, of any call not taken yet."""
        call, value = await self._wait(lambda: self._decided.popleft() if self._decided else None)
        return Result(call, value)

    def invocation(self, call: int) -> Invocation:
        """A call made before this program's state was restored (see ``undecided``)."""
        return Invocation(self, call)

    @property
    def undecided(self) -> Dict[int, int]:
        """The calls without an outcome yet, and their targets."""
        return dict(self._undecided)

    def set_abort_policy(self, seconds: Optional[float], *, target: Optional[int] = None) -> None:
        """Request an abort of a call that has no outcome ``seconds`` after it was made
        (``None``: never); for calls to ``target``, or by default."""
        if target is None:
            self._policy = seconds
        else:
            self._target_policy[target] = seconds

    async def next_request(self) -> Incoming:
        return await self._wait(lambda: self._requests.popleft() if self._requests else None)

    def send_result(self, request: Incoming, result: bytes) -> None:
        self._ask(Input.Respond(request.caller, request.call, result))

    # -- waiting in lock-step -----------------------------------------------------------

    async def _wait(self, ready: Callable[[], Optional[T]], timeout: Optional[float] = None) -> T:
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while True:
            if self._interrupted:
                raise Interrupted()
            got = ready()
            if got is not None:
                return got
            self._waiting = True
            self._considered = self._delivered
            self._settled.set()
            wakeup = loop.create_future()
            self._wakeups.append(wakeup)
            try:
                if end is None:
                    await wakeup
                else:
                    await asyncio.wait_for(wakeup, max(0.0, end - loop.time()))
            finally:
                self._waiting = False

    async def _outcome(self, call: int, timeout: Optional[float]) -> bytes:
        def take() -> Optional[Tuple[Optional[bytes]]]:
            for i, (c, value) in enumerate(self._decided):
                if c == call:
                    del self._decided[i]
                    return (value,)
            # Never made, or taken before: nothing will come.
            return None if call in self._undecided else (None,)

        try:
            (value,) = await self._wait(take, timeout)
        except asyncio.TimeoutError:
            self._ask(Input.Abort(call))
            (value,) = await self._wait(take)
        if value is None:
            raise CallAborted(f"call {call} was aborted")
        return value

    def _wake(self) -> None:
        for w in self._wakeups:
            if not w.done():
                w.set_result(None)
        self._wakeups.clear()

    # -- the member's side --------------------------------------------------------------

    def _deliver(self, event: Any) -> None:
        if isinstance(event, Event.Request):
            self._requests.append(Incoming(event.caller, event.call, bytes(event.op)))
        elif isinstance(event, (Event.Reply, Event.Aborted)):
            if self._undecided.pop(event.call, None) is not None:
                timer = self._abort_timers.pop(event.call, None)
                if timer is not None:
                    timer.cancel()
                value = bytes(event.result) if isinstance(event, Event.Reply) else None
                self._decided.append((event.call, value))
        self._delivered += 1
        self._settled.clear()
        self._wake()

    def _is_settled(self, program: Optional[asyncio.Task]) -> bool:
        return program is None or program.done() or (self._waiting and self._considered == self._delivered)

    def _encode(self, service: bytes) -> bytes:
        """A checkpoint's executor state, in ``phalanxd``'s bytes."""
        out = bytearray(struct.pack("<QI", self._next_call, len(self._undecided)))
        for call, target in sorted(self._undecided.items()):
            out += struct.pack("<QI", call, target)
        out += struct.pack("<I", len(self._requests))
        for r in self._requests:
            out += struct.pack("<IQI", r.caller, r.call, len(r.op)) + r.op
        out += struct.pack("<I", len(self._decided))
        for call, value in self._decided:
            if value is None:
                out += struct.pack("<QB", call, 0)
            else:
                out += struct.pack("<QBI", call, 1, len(value)) + value
        return bytes(out + service)

    def _decode(self, state: bytes) -> bytes:
        """Takes the agreed part of ``state``; returns the service's. Raises ``ValueError``."""
        at = 0

        def take(fmt: str) -> Tuple[int, ...]:
            nonlocal at
            got = struct.unpack_from(fmt, state, at)
            at += struct.calcsize(fmt)
            return got

        def blob() -> bytes:
            nonlocal at
            (n,) = take("<I")
            if at + n > len(state):
                raise ValueError("truncated")
            at += n
            return state[at - n : at]

        try:
            (next_call,) = take("<Q")
            undecided = dict(take("<QI") for _ in range(take("<I")[0]))
            requests = collections.deque()
            for _ in range(take("<I")[0]):
                caller, call = take("<IQ")
                requests.append(Incoming(caller, call, blob()))
            decided: Deque[Tuple[int, Optional[bytes]]] = collections.deque()
            for _ in range(take("<I")[0]):
                call, kind = take("<QB")
                if kind not in (0, 1):
                    raise ValueError(f"outcome kind {kind}")
                decided.append((call, blob() if kind == 1 else None))
        except struct.error as e:
            raise ValueError(str(e)) from e
        self._next_call, self._undecided, self._requests, self._decided = next_call, undecided, requests, decided
        for timer in self._abort_timers.values():
            timer.cancel()
        self._abort_timers.clear()
        return state[at:]


class Member(Hosted):
    """A member of a Perpetual group, hosted on asyncio, running ``service``:

    - ``async service.run(group)``: the program (a :class:`Group` call raising
      :class:`Interrupted` ends it: let it propagate);
    - ``service.snapshot() -> bytes`` and ``service.restore(state: bytes)``: its state, taken
      while the program waits in a ``Group`` call, and replaced before it runs again.

    ``Member(config, members, service)`` listens on its own address in ``members`` (every
    member of every group: ``{id: (host, port)}``) and dials the others; ``storage`` as
    for :class:`phalanx.Replica`.
    """

    def __init__(
        self,
        config: bytes,
        members: Mapping[int, Address],
        service: Any,
        *,
        storage: Optional[str] = None,
        listen: Optional[Address] = None,
    ):
        self.service = service
        self._events: Deque[Any] = collections.deque()
        self._host = Host(config, members, on_output=self._on_output, storage=storage)
        node = self._host.node
        if node.protocol != "perpetual":
            raise PhalanxError(f"node {node.id} is a {node.protocol} {node.role}, not a Perpetual member")
        self._host._listen = listen or self._host._replicas[node.id]
        self.group = Group(node.call_window, self._ask)
        self._asked: List[Any] = []
        self._program: Optional[asyncio.Task] = None
        self._pump: Optional[asyncio.Task] = None
        self._more = asyncio.Event()

    def _on_output(self, out: Any) -> None:
        if isinstance(out, Output.Event):
            self._events.append(out.event)
            self._more.set()

    def _ask(self, request: Any) -> None:
        """The program's requests go to the member once the event it answers settled
        (in order); an abort asked outside the lock-step goes at the next turn."""
        self._asked.append(request)
        self._more.set()

    async def start(self) -> None:
        # The program starts afresh; a checkpoint the member recovers replaces its state.
        self._run_program()
        await self._settle()
        await super().start()
        self._pump = asyncio.get_running_loop().create_task(self._serve())

    async def stop(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        await self._stop_program()
        await super().stop()

    def _run_program(self) -> None:
        async def run() -> None:
            try:
                await self.service.run(self.group)
                log.info("member %d: the service's program finished", self.id)
            except Interrupted:
                pass
            finally:
                self.group._settled.set()

        self.group._interrupted = False
        self._program = asyncio.get_running_loop().create_task(run())

    async def _stop_program(self) -> None:
        if self._program is not None:
            self.group._interrupted = True
            self.group._wake()
            await asyncio.gather(self._program, return_exceptions=True)
            self._program = None

    async def _settle(self) -> None:
        while not self.group._is_settled(self._program):
            await self.group._settled.wait()
            if not self.group._is_settled(self._program):
                self.group._settled.clear()

    async def _serve(self) -> None:
        """Hands the agreed events over one at a time, and what the program asked back."""
        while True:
            await self._more.wait()
            self._more.clear()
            while self._events or self._asked:
                if self._events:
                    await self._deliver(self._events.popleft())
                asked, self._asked = self._asked, []
                for request in asked:
                    self._host.process(request)

    async def _deliver(self, event: Any) -> None:
        if isinstance(event, Event.Checkpoint):
            state = self.group._encode(bytes(self.service.snapshot()))
            self._asked.append(Input.Snapshot(event.seq, state))
        elif isinstance(event, Event.Restore):
            await self._stop_program()
            try:
                service_state = self.group._decode(bytes(event.state))
                self.service.restore(service_state)
            except Exception:
                log.exception("member %d: the state certified at checkpoint %d was not restored", self.id, event.seq)
            self._asked.clear()
            self._run_program()
            await self._settle()
        else:
            self.group._deliver(event)
            await self._settle()

    def __repr__(self) -> str:
        return f"Member(id={self.id}, service={type(self.service).__name__})"

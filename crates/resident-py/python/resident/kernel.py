"""``@ring_kernel`` and the ``ctx`` a kernel's coroutine receives."""

from __future__ import annotations

import asyncio
import ctypes
import difflib
import sys
import threading
import time
import types
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Optional

import resident._resident as _resident
from .errors import MessageTypeError, UnknownArgumentError

__all__ = ["ring_kernel", "KernelSpec", "KernelContext", "get_kernel", "BACKPRESSURE"]

BACKPRESSURE = ("block", "reject", "drop_oldest", "drop_newest")

# How long one wait of the kernel's coroutine lasts before other tasks of its loop get a turn.
_SLICE = 0.01
# How long one wait lasts when the kernel's coroutine is the only task of its loop (nothing
# else needs a turn; terminate and activate wake the wait at once): an idle kernel costs no CPU.
_IDLE_SLICE = 0.5
# The flag the engine sets on a request sent by ``call`` (its reply goes to a waiting caller).
_FLAG_CALL = _resident.FLAG_CALL
# Received messages a kernel's ctx remembers for their replies.
_PENDING_MAX = 4096
# PyDotCompute's ``@ring_kernel`` arguments, accepted and ignored (a Python handler runs on a
# host thread).
_PYDOTCOMPUTE_IGNORED = ("grid_size", "block_size", "input_type", "output_type")
# What the engine returns when no message came (any object, None included, is a message).
_NOTHING = _resident.NOTHING


@dataclass(frozen=True)
class KernelSpec:
    """A kernel definition: the coroutine function and its queue settings."""

    kernel_id: str
    func: Callable[["KernelContext"], Awaitable[Any]]
    queue_size: int = 4096
    output_queue_size: Optional[int] = None
    backpressure: str = "block"
    block_timeout: float = 1.0
    priority_lanes: int = 4
    thread: Optional[bool] = None
    """None (the default) or False: a kernel launched by ``RingKernelRuntime.launch`` runs as a
    task of the caller's loop, with no thread (launched by the blocking ``Runtime.launch``, it
    gets a thread). True: the coroutine runs on a thread of its own, in an event loop of its
    own, wherever it is launched (what a handler that blocks or computes for long needs)."""

    def __post_init__(self) -> None:
        if not asyncio.iscoroutinefunction(self.func):
            raise TypeError(
                f"kernel '{self.kernel_id}': expected an `async def f(ctx)`, got {self.func!r}"
            )
        if self.backpressure not in BACKPRESSURE:
            raise ValueError(
                f"kernel '{self.kernel_id}': backpressure must be one of {BACKPRESSURE}, "
                f"got {self.backpressure!r}"
            )
        if self.queue_size < 1:
            raise ValueError(f"kernel '{self.kernel_id}': queue_size must be >= 1")
        if not 1 <= self.priority_lanes <= 256:
            raise ValueError(f"kernel '{self.kernel_id}': priority_lanes must be 1-256")


_registry: Dict[str, KernelSpec] = {}


def get_kernel(kernel_id: str) -> Optional[KernelSpec]:
    """The kernel registered under ``kernel_id`` by ``@ring_kernel``, if any."""
    return _registry.get(kernel_id)


def reject_unknown(decorator: str, given: Dict[str, Any], known: Iterable[str]) -> None:
    """Raises ``UnknownArgumentError`` for the first argument in ``given`` (a decorator's
    unknown keyword arguments), suggesting the closest of ``known``."""
    for name in given:
        near = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
        hint = f"; did you mean '{near[0]}'?" if near else f"; it takes {', '.join(sorted(known))}"
        raise UnknownArgumentError(f"{decorator}: unknown argument '{name}'{hint}")


def ring_kernel(
    func: Optional[Callable[..., Any]] = None,
    *,
    kernel_id: Optional[str] = None,
    queue_size: int = 4096,
    input_queue_size: Optional[int] = None,
    output_queue_size: Optional[int] = None,
    backpressure: str = "block",
    block_timeout: float = 1.0,
    priority_lanes: int = 4,
    auto_register: bool = True,
    grid_size: Any = None,
    block_size: Any = None,
    input_type: Any = None,
    output_type: Any = None,
    thread: Optional[bool] = None,
    **unknown: Any,
) -> Any:
    """Declares ``async def f(ctx)`` as a ring kernel (a persistent actor).

    ``queue_size`` messages per priority lane (rounded up to a power of two by the engine);
    ``backpressure`` is what a send to a full lane does: ``"block"`` (wait up to
    ``block_timeout`` seconds, then ``SendTimeoutError``), ``"reject"`` (``QueueFullError``),
    ``"drop_oldest"``/``"drop_newest"`` (discard one, counted in ``messages_dropped``).
    ``priority_lanes`` lanes split the priorities 0-255 (higher drains first, FIFO within a
    lane). PyDotCompute's ``grid_size``, ``block_size``, ``input_type`` and ``output_type``
    are accepted and ignored: a Python handler runs on a host thread. Any other keyword
    argument raises ``UnknownArgumentError`` naming the closest known one.

    Where the coroutine runs: by default a kernel launched by ``RingKernelRuntime.launch``
    (from a coroutine) runs as a task of the caller's event loop, as PyDotCompute runs it, with
    no thread of its own (a waiter on that loop is woken by completing its future; an idle
    kernel costs nothing); launched by the blocking ``Runtime.launch`` it gets a thread. A
    handler that blocks or computes for long asks for ``thread=True`` (a thread of its own with
    an event loop of its own, wherever it is launched): on the caller's loop it would hold
    every other task of the loop meanwhile.
    """
    reject_unknown("@ring_kernel", unknown, _RING_KERNEL_ARGS)

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        spec = KernelSpec(
            kernel_id=kernel_id or f.__name__,
            func=f,
            queue_size=input_queue_size or queue_size,
            output_queue_size=output_queue_size,
            backpressure=backpressure,
            block_timeout=block_timeout,
            priority_lanes=priority_lanes,
            thread=thread,
        )
        f._ring_kernel_spec = spec  # type: ignore[attr-defined]
        if auto_register:
            _registry[spec.kernel_id] = spec
        return f

    if func is not None:
        return wrap(func)
    return wrap


_RING_KERNEL_ARGS = (
    "kernel_id",
    "queue_size",
    "input_queue_size",
    "output_queue_size",
    "backpressure",
    "block_timeout",
    "priority_lanes",
    "auto_register",
    "thread",
) + _PYDOTCOMPUTE_IGNORED


class KernelContext:
    """What a kernel's coroutine sees: receive, send, and the lifecycle flags.

    On the caller's event loop (the default for a kernel launched by
    ``RingKernelRuntime.launch``) the
    coroutine is a task of that loop: a wait awaits a future that a send, activate, deactivate or terminate
    completes (directly from the same loop's thread, through the loop's wake-up socket from
    another thread), and an idle kernel costs nothing (no thread, no timer). A full output
    queue is awaited by looking again (every 50 us, doubling to 10 ms).

    On a thread (``thread=True``, or launched by the blocking ``Runtime``) the
    coroutine runs in an event loop of its own; waits release the GIL and give the loop's
    other tasks a turn every 10 ms (when the coroutine is the loop's only task, a wait lasts
    up to 0.5 s: activate, deactivate, terminate and new messages end it at once, and an idle
    kernel uses no CPU).

    Replies: ``send(reply)`` answers, in this order of choice, the message ``reply_to``
    names; the message whose ``message_id`` is ``reply.correlation_id``; the oldest ``call``
    this kernel received and has not answered (so a handler that collects several requests
    and answers each in turn answers each caller, whatever the objects are); else the last
    message received. A handler that leaves some calls unanswered and answers later ones
    must name the request (``reply_to=msg``, or a ``correlation_id``).
    """

    __slots__ = (
        "_c", "kernel_id", "_envs", "_by_mid", "_by_obj", "_calls", "_last", "_current", "_w",
        "_room", "_aside",
    )

    def __init__(self, raw: Any, wake: Any = None) -> None:
        self._c = raw
        # The caller's loop's wake-up (``runtime._LoopWake``) for a kernel on that loop.
        self._w = wake
        # On the caller's loop: outputs that fit the output queue without looking again (the
        # kernel is its only producer; receivers only make room).
        self._room = 0
        self.kernel_id: str = raw.kernel_id
        # engine message id -> (envelope, message_id or None, id(obj)), oldest first
        self._envs: Dict[int, Any] = {}
        self._by_mid: Dict[Any, int] = {}
        self._by_obj: Dict[int, int] = {}
        # unanswered calls (engine message ids), oldest first
        self._calls: Dict[int, None] = {}
        self._last: Optional[int] = None
        # A message received while the books above were empty, not written into them yet:
        # (envelope, message_id or None, object). The usual handler answers each message
        # before it takes the next; its reply then takes this entry back without a dict
        # operation (or a hash of the id: a UUID's hash is a Python call). Anything else
        # writes it into the books first (``_book``), where it would have been.
        self._aside: Any = None
        # The last message received (handed back as the report's ``failed_message`` if the
        # handler raises).
        self._current: Any = _NOTHING

    # Read through C-level getters (no Python frame): handlers test these every message.
    should_terminate = property(
        attrgetter("_c.should_terminate"),
        doc="True once the kernel is asked to stop: leave the loop.",
    )
    is_active = property(
        attrgetter("_c.is_active"),
        doc="True while the kernel is active (false before ``activate`` and after "
        "``deactivate``).",
    )

    async def wait_active(self, timeout: Optional[float] = None) -> bool:
        """Waits until the kernel is active or terminating; returns ``is_active``. Parks the
        kernel's thread meanwhile (no CPU)."""
        c = self._c
        if self._w is not None:
            deadline = self._w_deadline(timeout)
            while True:
                if c.is_active or c.should_terminate:
                    return c.is_active
                if self._w_past(deadline):
                    return False
                await self._park(deadline)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            s = _slice()
            left = s if deadline is None else min(s, deadline - time.monotonic())
            if c.wait_active(max(left, 0.0)) or c.should_terminate:
                return c.is_active
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0)

    async def receive(self, timeout: Optional[float] = None) -> Any:
        """The next message (highest priority first). Raises ``asyncio.TimeoutError`` when
        none comes within ``timeout`` seconds (None: wait without limit) or while the kernel
        is inactive, and ``asyncio.CancelledError`` once it is terminating (the runtime ends
        the coroutine cleanly then)."""
        c = self._c
        r = c.receive(0.0)
        if r is None:
            w = self._w
            if w is None:
                r = await self._wait(timeout)
            else:
                # On the caller's loop: ``_wait``'s wait (``_on_loop``), written out (a
                # message's round trip goes through it; each layer of coroutines costs).
                if timeout is not None and not timeout >= 0:
                    raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
                loop = w.loop
                futs = w.futs
                deadline = None if timeout is None else loop.time() + timeout
                while True:
                    if c.should_terminate:
                        raise asyncio.CancelledError()
                    if deadline is not None and loop.time() >= deadline:
                        raise asyncio.TimeoutError()
                    f = loop.create_future()
                    futs.add(f)
                    if deadline is not None:
                        w.at(deadline, f)
                    try:
                        await f
                    finally:
                        futs.discard(f)
                    r = c.receive(0.0)
                    if r is not None:
                        break
        obj, env = r
        self._current = obj
        if self._aside is None:
            if not self._envs:
                # Nothing else unanswered: kept aside (see ``_aside``).
                self._aside = (env, getattr(obj, "message_id", None), obj)
                self._last = env[0]
                return obj
        else:
            self._book()
        self._write(obj, env, getattr(obj, "message_id", None))
        return obj

    def _book(self) -> None:
        """Writes the message kept aside (if any) into the books."""
        a = self._aside
        if a is not None:
            self._aside = None
            env, mid, obj = a
            self._write(obj, env, mid)

    def _note(self, obj: Any, env: Any) -> None:
        """Remembers a received message's envelope for its reply."""
        self._book()
        self._write(obj, env, getattr(obj, "message_id", None))

    def _write(self, obj: Any, env: Any, mid: Any) -> None:
        eid = env[0]
        oid = id(obj)
        self._envs[eid] = (env, mid, oid)
        if mid is not None:
            try:
                self._by_mid[mid] = eid
            except TypeError:  # an unhashable id: found by identity or order instead
                self._envs[eid] = (env, None, oid)
        self._by_obj[oid] = eid
        if env[2] & _FLAG_CALL:
            self._calls[eid] = None
        self._last = eid
        if len(self._envs) > _PENDING_MAX:
            self._forget(next(iter(self._envs)))

    def _forget(self, eid: int, mid_gone: bool = False) -> Any:
        """Takes engine id ``eid``'s entry out of the books; returns its envelope (None when
        it was answered or forgotten already). ``mid_gone``: its ``_by_mid`` entry was taken
        out already."""
        entry = self._envs.pop(eid, None)
        if entry is None:
            return None
        env, mid, oid = entry
        self._calls.pop(eid, None)
        if not mid_gone and mid is not None and self._by_mid.get(mid) == eid:
            del self._by_mid[mid]
        if self._by_obj.get(oid) == eid:
            del self._by_obj[oid]
        return env

    def _find(self, request: Any) -> Optional[int]:
        self._book()
        mid = getattr(request, "message_id", None)
        if mid is not None:
            try:
                eid = self._by_mid.get(mid)
            except TypeError:
                eid = None
            if eid is not None:
                return eid
        eid = self._by_obj.get(id(request))
        return eid if eid is not None and eid in self._envs else None

    # ---- on the caller's loop ------------------------------------------------------------

    def _w_deadline(self, timeout: Optional[float]) -> Optional[float]:
        return None if timeout is None else self._w.loop.time() + timeout

    def _w_past(self, deadline: Optional[float]) -> bool:
        return deadline is not None and self._w.loop.time() >= deadline

    async def _park(self, deadline: Optional[float]) -> None:
        """Awaits the kernel's bell (an input sent, activate, deactivate, terminate) or the
        loop's clock passing ``deadline``. The loop's wake-up is armed for the kernel's whole
        life (see ``Runtime._launch_on_loop``): a ring from another thread after the caller's
        last look writes the socket, and the loop settles this future when it reads it."""
        w = self._w
        f = w.loop.create_future()
        w.futs.add(f)
        if deadline is not None:
            w.at(deadline, f)  # the loop's one timer for its waits' deadlines
        try:
            await f
        finally:
            w.futs.discard(f)

    async def _on_loop(self, look: Callable[[], Any], timeout: Optional[float]) -> Any:
        """``look()`` (which never waits; the engine gives nothing while the kernel is
        inactive or terminating) after each wake-up, until it returns something other than
        None; None once ``timeout`` passed. The caller looked just before; nothing can have
        come since (this loop's thread is here)."""
        c = self._c
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        deadline = self._w_deadline(timeout)
        while True:
            if c.should_terminate:
                raise asyncio.CancelledError()
            if self._w_past(deadline):
                return None
            await self._park(deadline)
            r = look()
            if r is not None:
                return r

    async def _out_room(self) -> int:
        """Room in the output queue (at least 1), awaited by looking again while it is full
        (its receivers take outputs without ringing this kernel). Terminating: 1 (the send
        goes to the engine, which refuses or drops it as for a kernel on a thread)."""
        c = self._c
        pause = 50e-6
        while True:
            r = c.output_room
            if r > 0 or c.should_terminate:
                return max(r, 1)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.01)

    async def _wait(self, timeout: Optional[float]) -> Any:
        c = self._c
        if self._w is not None:
            r = await self._on_loop(lambda: c.receive(0.0), timeout)
            if r is None:
                raise asyncio.TimeoutError()
            return r
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if c.should_terminate:
                raise asyncio.CancelledError()
            left = _slice()
            if deadline is not None:
                left = min(left, deadline - time.monotonic())
                if left <= 0:
                    raise asyncio.TimeoutError()
            if c.is_active:
                r = c.receive(left)
                if r is not None:
                    return r
            else:
                c.wait_active(left)
            await asyncio.sleep(0)

    async def send(self, msg: Any, *, reply_to: Any = _NOTHING) -> None:
        """Sends ``msg`` on the kernel's output queue as the reply to a received message
        (which one: see the class's text; ``reply_to`` names it). A ``call`` waiting for that
        message gets ``msg``; with ``reply_to``, ``msg.correlation_id`` (when it has the field,
        unset) becomes the request's ``message_id``. ``reply_to`` that is not a message this
        kernel received and has not answered yet raises ``ValueError``."""
        if self._w is not None:
            if self._room <= 0:
                self._room = self._c.output_room
                if self._room <= 0:
                    self._room = await self._out_room()
            self._room -= 1
        a = self._aside
        if a is not None:
            if reply_to is _NOTHING:
                # The books are empty but for the message kept aside: whatever the reply's
                # correlation_id, its request is that message (``_envs`` would find it by
                # id, or the oldest call or the last message received is it). The id is
                # only compared (``is``) when it may be another message's that was already
                # answered: then (an id equal but not the same object) the books decide.
                cid = getattr(msg, "correlation_id", None)
                if cid is None or cid is a[1]:
                    self._aside = None
                    self._c.send(msg, a[0])
                    return
            self._book()
        if reply_to is not _NOTHING:
            eid = self._find(reply_to)
            if eid is None:
                raise ValueError(
                    f"kernel '{self.kernel_id}': reply_to is not a message this kernel "
                    f"received and has not answered yet"
                )
            _correlate(msg, reply_to)
        else:
            eid = None
            cid = getattr(msg, "correlation_id", None)
            if cid is not None:
                try:
                    # Taken out at once: one hash of the id (a UUID's hash is a Python
                    # call), not one here and two in ``_forget``.
                    eid = self._by_mid.pop(cid, None)
                except TypeError:
                    eid = None
                if eid is not None:
                    # ``_forget(eid, True)``, written out (the usual reply of a handler
                    # that answers a batch of messages one by one).
                    entry = self._envs.pop(eid, None)
                    env = None
                    if entry is not None:
                        env, _, oid = entry
                        if self._calls:
                            self._calls.pop(eid, None)
                        if self._by_obj.get(oid) == eid:
                            del self._by_obj[oid]
                    self._c.send(msg, env)
                    return
            if eid is None and cid is None and self._calls:
                eid = next(iter(self._calls))
            if eid is None:
                eid = self._last
        env = None if eid is None else self._forget(eid)
        self._c.send(msg, env)


    async def receive_batch(self, max: int, timeout: Optional[float] = None) -> List[Any]:
        """Up to ``max`` messages in one engine call (highest priority first, FIFO within a
        lane): those queued now, or else the first to come within ``timeout`` seconds (None:
        wait without limit) and whatever else came with them. Returns ``[]`` when none came
        within ``timeout`` or while the kernel is inactive (an empty batch is an answer, not
        a ``TimeoutError``), and raises ``asyncio.CancelledError`` once the kernel is
        terminating and nothing came (the runtime ends the coroutine cleanly then).

        Each message is remembered for its reply as ``receive`` remembers one (see
        ``send_batch`` and ``send``). Cancelled while it waits, it has taken nothing: a
        message is taken only in the same step that returns it."""
        if max.__class__ is not int or max < 1:
            raise ValueError(f"receive_batch: max must be an int >= 1, got {max!r}")
        c = self._c
        self._book()
        r = c.receive_many(max, 0.0, self._envs, self._by_mid, self._by_obj, self._calls)
        if r is None:
            r = await self._wait_many(max, timeout)
            if r is None:
                return []
        objs, self._last = r
        self._current = objs[-1]
        while len(self._envs) > _PENDING_MAX:
            self._forget(next(iter(self._envs)))
        return objs

    async def _wait_many(self, max: int, timeout: Optional[float]) -> Any:
        c = self._c
        if self._w is not None:

            def look() -> Any:
                self._book()  # another task of this ctx may have received meanwhile
                return c.receive_many(max, 0.0, self._envs, self._by_mid, self._by_obj, self._calls)

            return await self._on_loop(look, timeout)
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if c.should_terminate:
                raise asyncio.CancelledError()
            left = _slice()
            if deadline is not None:
                left = min(left, deadline - time.monotonic())
                if left <= 0:
                    return None
            if c.is_active:
                self._book()
                r = c.receive_many(max, left, self._envs, self._by_mid, self._by_obj, self._calls)
                if r is not None:
                    return r
            else:
                c.wait_active(left)
            await asyncio.sleep(0)

    async def send_batch(self, msgs: Iterable[Any], *, reply_to: Optional[Iterable[Any]] = None) -> None:
        """Sends every message of ``msgs`` (a list, or any iterable of objects) on the
        kernel's output queue, in order, in one engine call and one wake-up of the receivers
        (a full output queue makes it wait for room, GIL released). Each is the reply its own
        ``send(msg)`` would be (its ``correlation_id`` names its request, else the oldest
        unanswered ``call``, else the last message received); with ``reply_to`` (one
        received message per output, e.g. the batch ``receive_batch`` returned) output ``i``
        answers ``reply_to[i]`` (and gets its ``message_id`` as ``correlation_id`` when it has
        that field unset, as ``send`` does). An empty batch does nothing. Not a batch of objects
        (an array of records, a string, a mapping): ``MessageTypeError``."""
        what = f"kernel '{self.kernel_id}': ctx.send_batch"
        self._book()
        if msgs.__class__ is not list:
            msgs = as_batch(msgs, what)
        if not msgs:
            return
        eids = None
        if reply_to is not None:
            reqs = as_batch(reply_to, what + " reply_to")
            if len(reqs) != len(msgs):
                raise ValueError(
                    f"{what}: reply_to names {len(reqs)} messages for {len(msgs)} outputs"
                )
            eids = []
            for r in reqs:
                eid = self._find(r)
                if eid is None:
                    raise ValueError(
                        f"{what}: reply_to holds a message this kernel did not receive or "
                        f"has answered already"
                    )
                eids.append(eid)
            if len(set(eids)) != len(eids):
                raise ValueError(f"{what}: reply_to names one message twice")
            for m, r in zip(msgs, reqs):
                _correlate(m, r)
        if self._w is not None:
            # On the caller's loop: what fits the output queue at a time, awaiting room.
            i = 0
            while i < len(msgs):
                j = min(len(msgs), i + await self._out_room())
                self._book()  # another task of this ctx may have received meanwhile
                self._c.send_many(
                    msgs[i:j],
                    None if eids is None else eids[i:j],
                    self._envs,
                    self._by_mid,
                    self._by_obj,
                    self._calls,
                    self._last,
                )
                i = j
            self._room = 0
            return
        self._c.send_many(
            msgs, eids, self._envs, self._by_mid, self._by_obj, self._calls, self._last
        )


def _correlate(reply: Any, request: Any) -> None:
    """Sets a reply's ``correlation_id`` to its request's ``message_id`` when the reply has
    the field unset (None); a reply that names one already, or has no such field (any
    object), or cannot be changed (a frozen dataclass), is left as it is."""
    if getattr(reply, "correlation_id", _NOTHING) is not None:
        return
    mid = getattr(request, "message_id", None)
    if mid is not None:
        try:
            reply.correlation_id = mid
        except (AttributeError, TypeError):
            pass


def as_batch(msgs: Any, what: str) -> List[Any]:
    """``msgs`` as a list of message objects, or ``MessageTypeError`` for what is not a batch
    of objects (an array of records, a string, bytes, a mapping, a single object)."""
    if msgs.__class__ is list:
        return msgs
    if isinstance(msgs, tuple):
        return list(msgs)
    if hasattr(msgs, "__array_interface__") or hasattr(msgs, "__dlpack__"):
        raise MessageTypeError(
            f"{what} takes a list of message objects, got an array "
            f"({type(msgs).__name__}): arrays of records go to a @batch_kernel"
        )
    if isinstance(msgs, (str, bytes, bytearray, dict)) or not hasattr(msgs, "__iter__"):
        raise MessageTypeError(
            f"{what} takes a list of message objects, got {type(msgs).__name__}"
        )
    return list(msgs)


def _slice() -> float:
    """How long the handler's next wait may last: long when its coroutine is the only task
    of its loop, else short so that the others get a turn."""
    try:
        alone = len(asyncio.all_tasks()) <= 1
    except RuntimeError:
        alone = False
    return _IDLE_SLICE if alone else _SLICE


async def _guard(func: Callable[[KernelContext], Awaitable[Any]], ctx: KernelContext) -> None:
    try:
        await func(ctx)
    except asyncio.CancelledError:
        if not ctx.should_terminate:
            raise
    except BaseException:
        # The report hands back the message the handler failed on.
        if ctx._current is not _NOTHING:
            ctx._c.hand_back(ctx._current)
        raise


async def _run_on_loop(func: Callable[[KernelContext], Awaitable[Any]], ctx: KernelContext) -> None:
    """A kernel's coroutine as a task of its caller's loop: ends the kernel when it ends (an
    exception fails it with its text and traceback, as on a thread)."""
    raw = ctx._c
    try:
        await _guard(func, ctx)
    except asyncio.CancelledError:
        raw.finish(
            RuntimeError(
                f"kernel '{raw.kernel_id}': its task was cancelled before the kernel was "
                f"terminated (its event loop ended, or task.cancel())"
            )
        )
        raise
    except BaseException as e:
        raw.finish(e)
        if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit: the loop's to see
            raise
    else:
        raw.finish(None)


class KernelAbandoned(BaseException):
    """Raised inside a handler that ``terminate`` (or ``shutdown``) gave up waiting for, so
    that its thread leaves Python before the interpreter exits. A ``BaseException``: an
    ``except Exception`` in the handler does not swallow it."""


# Handlers running now: their key (runtime token, kernel id) -> the thread's ident.
_handler_threads: Dict[Any, int] = {}
_handler_lock = threading.Lock()
# Handlers told to stop already (each is told once: a second exception would interrupt the
# first one's clean-up).
_abandoned: "set[Any]" = set()


def _run_kernel(key: Any, func: Callable[[KernelContext], Awaitable[Any]], raw: Any) -> None:
    """Runs on the kernel's thread (called by the engine's loop body)."""
    with _handler_lock:
        _handler_threads[key] = threading.get_ident()
    try:
        ctx = KernelContext(raw)
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(_guard(func, ctx))
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()
    finally:
        with _handler_lock:
            if _handler_threads.get(key) == threading.get_ident():
                del _handler_threads[key]
            _abandoned.discard((key, threading.get_ident()))


def _abandon(keys: Iterable[Any], grace: float = 0.1) -> None:
    """Raises ``KernelAbandoned`` in the handlers of ``keys`` still running after ``grace``
    seconds (their kernel was given up on; one that failed may still be leaving), at their
    next Python instruction."""
    keys = list(keys)
    deadline = time.monotonic() + grace
    while True:
        with _handler_lock:
            keys = [k for k in keys if k in _handler_threads]
        if not keys or time.monotonic() >= deadline:
            break
        time.sleep(0.005)
    with _handler_lock:
        idents = []
        for k in keys:
            ident = _handler_threads.get(k)
            if ident is not None and (k, ident) not in _abandoned:
                _abandoned.add((k, ident))
                idents.append(ident)
    for ident in idents:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(ident), ctypes.py_object(KernelAbandoned)
        )


class _KernelModule(types.ModuleType):
    """This module is also PyDotCompute's top-level ``kernel`` decorator (``from resident
    import kernel``; ``@kernel(block=(256,))``): calling it calls ``resident.numba_kernels.kernel``
    (a Numba-compiled function), while its names (``KernelContext``, ``KernelAbandoned``, ...)
    stay where they are."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .numba_kernels import kernel

        return kernel(*args, **kwargs)


sys.modules[__name__].__class__ = _KernelModule

"""``@ring_kernel`` and the ``ctx`` a kernel's coroutine receives."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Awaitable, Callable, Dict, Optional

from . import _resident

__all__ = ["ring_kernel", "KernelSpec", "KernelContext", "get_kernel", "BACKPRESSURE"]

BACKPRESSURE = ("block", "reject", "drop_oldest", "drop_newest")

# How long one wait of the kernel's coroutine lasts before other tasks of its loop get a turn.
_SLICE = 0.01
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
    **_ignored: Any,
) -> Any:
    """Declares ``async def f(ctx)`` as a ring kernel (a persistent actor).

    ``queue_size`` messages per priority lane (rounded up to a power of two by the engine);
    ``backpressure`` is what a send to a full lane does: ``"block"`` (wait up to
    ``block_timeout`` seconds, then ``SendTimeoutError``), ``"reject"`` (``QueueFullError``),
    ``"drop_oldest"``/``"drop_newest"`` (discard one, counted in ``messages_dropped``).
    ``priority_lanes`` lanes split the priorities 0-255 (higher drains first, FIFO within a
    lane). Other keyword arguments of PyDotCompute (``grid_size``, ``block_size``,
    ``input_type``, ``output_type``) are accepted and ignored: a Python handler runs on a host
    thread.
    """

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        spec = KernelSpec(
            kernel_id=kernel_id or f.__name__,
            func=f,
            queue_size=input_queue_size or queue_size,
            output_queue_size=output_queue_size,
            backpressure=backpressure,
            block_timeout=block_timeout,
            priority_lanes=priority_lanes,
        )
        f._ring_kernel_spec = spec  # type: ignore[attr-defined]
        if auto_register:
            _registry[spec.kernel_id] = spec
        return f

    if func is not None:
        return wrap(func)
    return wrap


class KernelContext:
    """What a kernel's coroutine sees: receive, send, and the lifecycle flags.

    The coroutine runs on the kernel's own thread, in an event loop of its own; waits release
    the GIL and give the loop's other tasks a turn every 10 ms.
    """

    __slots__ = ("_c", "kernel_id")

    def __init__(self, raw: Any) -> None:
        self._c = raw
        self.kernel_id: str = raw.kernel_id

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
        """Waits until the kernel is active or terminating; returns ``is_active``."""
        c = self._c
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _SLICE if deadline is None else min(_SLICE, deadline - time.monotonic())
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
        # One call into the engine when a message is ready (its envelope is kept there for
        # the reply), a wait in slices otherwise.
        r = self._c.recv(0.0)
        if r is _NOTHING:
            r = await self._wait(timeout)
        return r

    async def _wait(self, timeout: Optional[float]) -> Any:
        c = self._c
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if c.should_terminate:
                raise asyncio.CancelledError()
            left = _SLICE
            if deadline is not None:
                left = min(left, deadline - time.monotonic())
                if left <= 0:
                    raise asyncio.TimeoutError()
            if c.is_active:
                r = c.recv(left)
                if r is not _NOTHING:
                    return r
            else:
                c.wait_active(left)
            await asyncio.sleep(0)

    async def send(self, msg: Any) -> None:
        """Sends ``msg`` on the kernel's output queue. If ``msg.correlation_id`` is the
        ``message_id`` of a message this kernel received, ``msg`` is that message's reply
        (a ``call`` waiting for it gets it); otherwise it answers the last message received."""
        self._c.reply(msg)


async def _guard(func: Callable[[KernelContext], Awaitable[Any]], ctx: KernelContext) -> None:
    try:
        await func(ctx)
    except asyncio.CancelledError:
        if not ctx.should_terminate:
            raise


def _run_kernel(func: Callable[[KernelContext], Awaitable[Any]], raw: Any) -> None:
    """Runs on the kernel's thread (called by the engine's loop body)."""
    ctx = KernelContext(raw)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_guard(func, ctx))
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

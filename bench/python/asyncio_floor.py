"""The floor under the seeds' programs: the part of PyDotCompute's API they use (``message``,
``ring_kernel``, ``RingKernelRuntime`` with ``launch`` / ``activate`` / ``send`` / ``receive``,
the kernel's ``ctx``) over two bounded queues per kernel, the kernel a task of the caller's
loop.

A queue is a ``deque``, with a future of the loop only for a side that must wait: the
transport costs next to nothing, so what is left is the program's own work (its message
objects, its coroutines, the loop's scheduling). It has none of what a runtime is for
(priorities, backpressure policies, deadlines, telemetry, terminate accounting,
request/response matching, engines): it is what the seeds' programs cost when the transport
costs as little as asyncio allows. Its messages are resident's own
(``resident.message``), so a program's message objects cost the same on both and the
difference is the runtime. ``issue40_bench.py`` runs it beside resident and PyDotCompute: no
runtime can be more than (floor / PyDotCompute) times faster than PyDotCompute on a program.

A wait takes the queue's item at once when there is one; only an empty queue makes the getter
await a future (with one timer of the loop for its timeout, each time it waits).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Callable, Dict, Optional, Tuple

from resident import message  # noqa: F401  (the programs' ``pkg.message``)

_KERNELS: Dict[str, Tuple[Callable[..., Any], int]] = {}


def ring_kernel(kernel_id: str, queue_size: int = 4096, **_: Any) -> Callable[..., Any]:
    def register(f: Callable[..., Any]) -> Callable[..., Any]:
        _KERNELS[kernel_id] = (f, queue_size)
        return f

    return register


class _Queue:
    """A bounded FIFO whose waits cost nothing when they need not wait: a ``deque``, and a
    future of the loop only for a side that must wait (empty to a getter, full to a putter)."""

    def __init__(self, size: int) -> None:
        self.items: "collections.deque[Any]" = collections.deque()
        self.size = size
        self.getter: Optional["asyncio.Future[None]"] = None
        self.putter: Optional["asyncio.Future[None]"] = None

    async def put(self, item: Any) -> None:
        while len(self.items) >= self.size:
            self.putter = asyncio.get_running_loop().create_future()
            await self.putter
        self.items.append(item)
        g = self.getter
        if g is not None:
            self.getter = None
            if not g.done():
                g.set_result(None)

    async def get(self, timeout: Optional[float]) -> Any:
        while not self.items:
            loop = asyncio.get_running_loop()
            f = self.getter = loop.create_future()
            if timeout is None:
                await f
                continue
            h = loop.call_later(timeout, _expire, f)
            try:
                woke = await f
            finally:
                h.cancel()
            if woke is _EXPIRED and not self.items:
                raise asyncio.TimeoutError()
        item = self.items.popleft()
        p = self.putter
        if p is not None:
            self.putter = None
            if not p.done():
                p.set_result(None)
        return item


_EXPIRED = object()


def _expire(f: "asyncio.Future[Any]") -> None:
    if not f.done():
        f.set_result(_EXPIRED)


class _Ctx:
    def __init__(self, queue_size: int) -> None:
        self.input = _Queue(queue_size)
        self.output = _Queue(queue_size)
        self.should_terminate = False
        self.is_active = False
        self._active = asyncio.Event()

    async def wait_active(self) -> None:
        await self._active.wait()

    async def receive(self, timeout: Optional[float] = None) -> Any:
        return await self.input.get(timeout)

    async def send(self, msg: Any) -> None:
        await self.output.put(msg)


class RingKernelRuntime:
    def __init__(self, **_: Any) -> None:
        self._k: Dict[str, Tuple[_Ctx, "asyncio.Task[Any]"]] = {}

    async def __aenter__(self) -> "RingKernelRuntime":
        return self

    async def __aexit__(self, *_: Any) -> None:
        for ctx, task in self._k.values():
            ctx.should_terminate = True
            task.cancel()
        await asyncio.gather(*(t for _, t in self._k.values()), return_exceptions=True)

    async def launch(self, kernel_id: str) -> None:
        f, queue_size = _KERNELS[kernel_id]
        ctx = _Ctx(queue_size)
        self._k[kernel_id] = (ctx, asyncio.get_running_loop().create_task(f(ctx)))

    async def activate(self, kernel_id: str) -> None:
        ctx = self._k[kernel_id][0]
        ctx.is_active = True
        ctx._active.set()

    async def send(self, kernel_id: str, msg: Any) -> None:
        await self._k[kernel_id][0].input.put(msg)

    async def receive(self, kernel_id: str, timeout: Optional[float] = None) -> Any:
        return await self._k[kernel_id][0].output.get(timeout)

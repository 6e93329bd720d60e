"""The asyncio runtime, ``RingKernelRuntime`` (the seeds' and PyDotCompute's), and the kernel
object its ``launch`` returns (``RingKernel``), over the blocking ``Runtime`` of
``resident.runtime``: the same methods as coroutines that never block their event loop (see
``resident.runtime``'s docs for how they wait).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import sys
import time

import numpy as np
from typing import Any, AsyncIterator, Callable, Dict, List, Optional

import resident._resident as _resident
from .errors import (
    CallTimeoutError,
    KernelNotFoundError,
    ReceiveTimeoutError,
    ResidentError,
    SendTimeoutError,
)
from . import batch as _batch
from .kernel import KernelSpec
from .runtime import (
    KernelReport,
    KernelState,
    Runtime,
    Telemetry,
    _NOTHING,
    _check_max,
    _compiles,
    _in_thread,
    _loop_wake,
    _no_out,
    _park,
    _priority,
    _spec,
    _wrong_kernel,
)

__all__ = ["RingKernelRuntime", "RingKernel", "get_loop_info"]


class RingKernelRuntime:
    """The asyncio runtime (the seeds' ``RingKernelRuntime``)::

        async with RingKernelRuntime(enable_telemetry=True, backend="auto") as runtime:
            await runtime.launch("worker")
            await runtime.activate("worker")
            reply = await runtime.call("worker", Request(x=1.0), timeout=1.0)

    ``runtime.sync`` is the blocking ``Runtime`` underneath, for threads.

    No coroutine here blocks the event loop or uses an executor (see the module's text):
    waits for outputs, replies and room are wake-ups the kernels deliver to the loop, and
    every one of them may be cancelled (``asyncio.wait_for``, ``task.cancel()``) without
    losing a message: a cancelled ``receive``/``receive_batch`` took nothing, a cancelled
    ``call`` withdrew its request (a reply that comes anyway is counted as dropped).
    """

    #: Unused (kept so that code setting it still runs): awaited waits no longer spin on the
    #: loop's thread, they await a wake-up.
    spin_wait: float = 0.0

    #: Before a wait parks on the loop's wake-up, it waits up to this long (seconds, at most
    #: 1 ms) for the kernel's bell with the GIL released, while at most ``linger_tasks`` tasks
    #: exist on the loop: a reply that comes within it is taken without a round through the
    #: event loop (a request/reply round trip of tens of microseconds instead of hundreds).
    #: The loop is held at most this long per wait. 0 turns it off.
    linger: float = 100e-6
    linger_tasks: int = 4

    #: Longest a waiting coroutine goes without looking again when no wake-up came (it sees
    #: a kernel's failure, which the engine records after the kernel's last wake-up, by then).
    look_interval: float = 0.25

    def __init__(
        self,
        enable_telemetry: bool = True,
        backend: str = "auto",
        *,
        shutdown_timeout: float = 5.0,
        terminate_timeout: float = 10.0,
        use_uvloop: bool = False,
        use_eager_tasks: bool = False,
    ) -> None:
        # ``use_uvloop`` and ``use_eager_tasks`` are PyDotCompute's: accepted and ignored (the
        # runtime works on whatever loop the caller runs, and installs no loop policy or
        # task factory; ``get_loop_info`` says what the running loop is).
        self.sync = Runtime(
            backend,
            enable_telemetry,
            shutdown_timeout=shutdown_timeout,
            terminate_timeout=terminate_timeout,
        )
        self._rt = self.sync._rt

    @property
    def backend(self) -> str:
        return self.sync.backend

    async def __aenter__(self) -> "RingKernelRuntime":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()

    async def start(self) -> None:
        """Nothing to start (the engine runs from construction); kept for PyDotCompute."""

    @property
    def is_active(self) -> bool:
        """True from construction until ``shutdown``."""
        return self.sync.is_active

    async def launch(
        self, kernel_id: str, kernel_func: Optional[Callable[..., Any]] = None, **overrides: Any
    ) -> "RingKernel":
        """Like ``Runtime.launch``; returns the launched kernel (a ``RingKernel``: its id and
        this runtime's operations on it). The launch of a device kernel, or of a keyed kernel
        with a device handler (which compiles it: g++ for CudaSim, NVRTC for CUDA) runs on a
        thread of its own; the loop goes on. A Python ring kernel runs as a task of this loop,
        with no thread, unless it asks for one (``thread=True``: a handler that blocks or
        computes for long)."""
        s = _spec(kernel_id, kernel_func, overrides)
        if _compiles(s):
            await _in_thread(self.sync.launch, kernel_id, kernel_func, **overrides)
        elif isinstance(s, KernelSpec) and s.thread is not True:
            self.sync._launch_on_loop(s)
        else:
            self.sync.launch(kernel_id, kernel_func, **overrides)
        return RingKernel(self, kernel_id)

    @contextlib.asynccontextmanager
    async def kernel_scope(
        self, kernel_id: str, kernel_func: Optional[Callable[..., Any]] = None, **overrides: Any
    ) -> AsyncIterator["RingKernel"]:
        """``async with runtime.kernel_scope(id) as k:`` launches and activates the kernel,
        and terminates it when the block ends (also when it raises)."""
        k = await self.launch(kernel_id, kernel_func, **overrides)
        try:
            await self.activate(kernel_id)
            yield k
        finally:
            try:
                done = self.sync.state(kernel_id) == "terminated"  # by the block itself
            except KernelNotFoundError:
                done = True
            if not done:
                await self.terminate(kernel_id)

    def get_loop_info(self) -> Dict[str, Any]:
        """As the module's ``get_loop_info()`` (the runtime changes none of these)."""
        return get_loop_info()

    async def activate(self, kernel_id: str) -> None:
        self.sync.activate(kernel_id)

    async def reactivate(self, kernel_id: str) -> None:
        self.sync.activate(kernel_id)

    async def deactivate(self, kernel_id: str) -> None:
        await _in_thread(self.sync.deactivate, kernel_id)

    async def terminate(self, kernel_id: str, timeout: Optional[float] = None) -> KernelReport:
        return await _in_thread(self.sync.terminate, kernel_id, timeout)

    def get_kernel_state(self, kernel_id: str) -> KernelState:
        """As ``Runtime.get_kernel_state`` (a ``KernelState``, equal to ``state``'s string)."""
        return self.sync.get_kernel_state(kernel_id)

    def state(self, kernel_id: str) -> str:
        return self.sync.state(kernel_id)

    @property
    def kernel_ids(self) -> List[str]:
        return self.sync.kernel_ids

    async def _until(
        self,
        kernel_id: str,
        look: Callable[[], Any],
        deadline: Optional[float],
        fast_looks: bool = False,
        looked: bool = False,
    ) -> Any:
        """Calls ``look()`` (which never waits) until it returns something other than
        ``_NOTHING``, awaiting the kernel's wake-up between looks; ``_NOTHING`` once the
        loop's clock passed ``deadline``. ``fast_looks``: the kernel's outputs come from a
        device, which delivers no wake-up: look again after 0.5 ms, doubling to 8 ms.
        ``looked``: the caller looked just before (a kernel on this loop cannot have run
        since)."""
        here = self.sync._on_loop.get(kernel_id)
        if here is not None and not fast_looks:
            loop = asyncio.get_running_loop()
            if here[0] is loop:
                return await self._until_here(loop, look, deadline, looked)
        r = look()
        if r is not _NOTHING:
            return r
        loop = asyncio.get_running_loop()
        if (
            self.linger > 0
            and kernel_id not in self.sync._on_loop  # it runs on this thread: it would wait
            and len(asyncio.all_tasks(loop)) <= self.linger_tasks
        ):
            # Bounded (1 ms at most in all) and idle (the GIL is released): the kernel's
            # answer usually comes within it, and then costs no round through the loop. The
            # bell also rings for other news (an input taken): look after each ring.
            end = time.perf_counter() + min(self.linger, 1e-3)
            while True:
                left = end - time.perf_counter()
                if left <= 0:
                    break
                self._rt.linger(kernel_id, left)
                r = look()
                if r is not _NOTHING:
                    return r
        w = _loop_wake(loop)
        self._rt.subscribe(kernel_id, w.waker)
        w.waker.arm()
        gap = 0.5e-3 if fast_looks else self.look_interval
        try:
            while True:
                # Armed before this look: a wake-up for anything it misses is on its way.
                r = look()
                if r is not _NOTHING:
                    return r
                now = loop.time()
                if deadline is not None and now >= deadline:
                    return _NOTHING
                until = now + gap if deadline is None else min(deadline, now + gap)
                if fast_looks:
                    gap = min(gap * 2, 8e-3)
                await _park(loop, w, until)
        finally:
            w.waker.disarm()

    async def _until_here(
        self,
        loop: asyncio.AbstractEventLoop,
        look: Callable[[], Any],
        deadline: Optional[float],
        looked: bool,
    ) -> Any:
        """``_until`` for a kernel that runs on this very loop: it cannot run while this
        coroutine looks, its bell is this loop's (subscribed and armed for the kernel's life,
        see ``Runtime._launch_on_loop``) and a ring made on this thread completes the waiting
        future directly: one look after each wake-up does, with no linger, subscribe or arm."""
        if not looked:
            r = look()
            if r is not _NOTHING:
                return r
        w = _loop_wake(loop)
        gap = self.look_interval
        while True:
            now = loop.time()
            if deadline is not None and now >= deadline:
                return _NOTHING
            until = now + gap if deadline is None else min(deadline, now + gap)
            await _park(loop, w, until)
            r = look()
            if r is not _NOTHING:
                return r

    def _deadline(self, timeout: Optional[float]) -> Optional[float]:
        if timeout is None:
            return None
        if not timeout >= 0:
            raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        return asyncio.get_running_loop().time() + timeout

    async def _until_room(
        self, kernel_id: str, look: Callable[[], Any], deadline: Optional[float]
    ) -> Any:
        """``_until`` for room in the kernel's input queue: while it waits the kernel rings
        its bell when it takes inputs (it does not otherwise, so waiters for outputs are not
        woken by every input taken)."""
        rt = self._rt
        rt.want_room(kernel_id, True)
        try:
            return await self._until(kernel_id, look, deadline)
        finally:
            try:
                rt.want_room(kernel_id, False)
            except ResidentError:  # the kernel was freed meanwhile
                pass

    async def _room(self, kernel_id: str, msg: Any, deadline: Optional[float]) -> None:
        """Waits until a send to the kernel would not wait (its policy is ``block`` and its
        queue is full), up to ``deadline`` and the kernel's block timeout; then
        ``SendTimeoutError`` with ``msg`` handed back. Room means room in every lane: the
        queue holds fewer than ``queue_size`` messages."""
        rt = self._rt
        if not rt.would_block(kernel_id):
            return
        bt = self.sync._block.get(kernel_id, 1.0)
        limit = asyncio.get_running_loop().time() + bt
        d = limit if deadline is None else min(limit, deadline)
        r = await self._until_room(
            kernel_id, lambda: _NOTHING if rt.would_block(kernel_id) else True, d
        )
        if r is _NOTHING:
            raise SendTimeoutError(
                f"kernel '{kernel_id}': input queue full, send timed out, message returned",
                kernel_id,
                "send",
                msg,
            )

    async def send(
        self,
        kernel_id: str,
        msg: Any,
        *,
        priority: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> int:
        """Like ``Runtime.send``. Under ``backpressure="block"`` a send to a full queue awaits
        room (the loop goes on), at most the kernel's block timeout (and ``timeout`` seconds
        when given), then raises ``SendTimeoutError`` with ``msg`` handed back."""
        if priority is None:
            priority = getattr(msg, "priority", 128)
        if priority.__class__ is not int or not 0 <= priority <= 255:
            priority = _priority(msg, priority)  # checks it (raises when invalid)
        rt = self._rt
        try:
            # Sends unless the send would wait for room (one engine call for both).
            r = rt.send(kernel_id, msg, priority, False)
        except KernelNotFoundError:
            _wrong_kernel(self.sync, kernel_id, "send", msg)
            raise
        if r is not None:
            return r
        await self._room(kernel_id, msg, self._deadline(timeout))
        try:
            return rt.send(kernel_id, msg, priority)
        except KernelNotFoundError:
            _wrong_kernel(self.sync, kernel_id, "send", msg)
            raise

    async def receive(self, kernel_id: str, timeout: Optional[float] = None) -> Any:
        """The next output; ``ReceiveTimeoutError`` (an ``asyncio.TimeoutError``) after
        ``timeout`` seconds (None: without limit). Cancelled, it has taken nothing."""
        rt = self._rt
        try:
            r = rt.take(kernel_id, 0.0)
        except KernelNotFoundError:
            _wrong_kernel(self.sync, kernel_id, "receive", None)
            raise
        if r is not _NOTHING:
            return r
        here = self.sync._on_loop.get(kernel_id)
        if here is not None:
            loop = here[0]
            if asyncio.get_running_loop() is loop:
                # A kernel on this very loop: ``_until_here``, written out (a message's
                # round trip goes through this wait; each layer of coroutines costs).
                deadline = self._deadline(timeout)
                w = here[2]
                futs = w.futs
                gap = self.look_interval
                while True:
                    now = loop.time()
                    if deadline is not None and now >= deadline:
                        break
                    f = loop.create_future()
                    futs.add(f)
                    w.at(now + gap if deadline is None else min(deadline, now + gap), f)
                    try:
                        await f
                    finally:
                        futs.discard(f)
                    r = rt.take(kernel_id, 0.0)
                    if r is not _NOTHING:
                        return r
                raise ReceiveTimeoutError(
                    f"kernel '{kernel_id}': no output within {timeout} s", kernel_id, "receive"
                )
        r = await self._until(
            kernel_id, lambda: rt.take(kernel_id, 0.0), self._deadline(timeout), looked=True
        )
        if r is _NOTHING:
            raise ReceiveTimeoutError(
                f"kernel '{kernel_id}': no output within {timeout} s", kernel_id, "receive"
            )
        return r

    async def call(
        self,
        kernel_id: str,
        msg: Any,
        timeout: Optional[float] = None,
        *,
        priority: Optional[int] = None,
    ) -> Any:
        """Sends ``msg`` and awaits the reply matched by correlation id (any object, None
        included); safe from many tasks at once. ``CallTimeoutError`` (an
        ``asyncio.TimeoutError``) after ``timeout`` seconds, counted from this call, room in
        a full queue included. The request carries that deadline: not taken by then, it is
        not handled but counted (``messages_expired``). A call that times out or is
        cancelled withdraws its request (its object is released at once)."""
        p = _priority(msg, priority)
        deadline = self._deadline(timeout)
        rt = self._rt
        if rt.would_block(kernel_id):
            await self._room(kernel_id, msg, deadline)
        left = None
        if deadline is not None:
            left = max(deadline - asyncio.get_running_loop().time(), 0.0)
        try:
            pc = rt.call_start(kernel_id, msg, p, left)
        except KernelNotFoundError:
            _wrong_kernel(self.sync, kernel_id, "call", msg)
            raise
        try:
            r = await self._until(kernel_id, pc.poll, deadline, looked=True)
        except BaseException:
            pc.cancel()
            raise
        if r is _NOTHING:
            pc.cancel()
            raise CallTimeoutError(
                f"kernel '{kernel_id}': call timed out after {timeout} s", kernel_id, "call"
            )
        return r

    async def send_and_receive(
        self, kernel_id: str, msg: Any, *, timeout: Optional[float] = None
    ) -> Any:
        """PyDotCompute's name for ``call``."""
        return await self.call(kernel_id, msg, timeout)

    async def send_batch(
        self, kernel_id: str, records: Any, *, priority: Optional[int] = None
    ) -> int:
        """Like ``Runtime.send_batch`` (message objects to a message kernel, records to a
        batch kernel), in one engine call when the batch fits. Under
        ``backpressure="block"`` it sends what fits and awaits room for the rest (the loop
        goes on), at most the kernel's block timeout from this call; it returns how many were
        taken (fewer than all: the rest were not sent). None taken: ``SendTimeoutError``
        (for message objects, with the unsent messages as a list in its ``message``)."""
        sync = self.sync
        spec = sync._batch.get(kernel_id)
        if spec is None:
            return await self._send_messages(kernel_id, records, priority)
        if priority is not None:
            raise ValueError(f"kernel '{kernel_id}': a batch kernel's records take no priority")
        arr = _batch.checked_records(records, spec.in_dtype, kernel_id)
        if spec.backpressure != "block" or len(arr) == 0:
            return sync._send_records(kernel_id, spec, arr)
        rt = self._rt
        deadline = asyncio.get_running_loop().time() + spec.block_timeout

        def room() -> Any:
            # Two counters read (the telemetry, read here before, cost about 30 us).
            r = rt.input_room(kernel_id)
            return r if r > 0 else _NOTHING

        sent = 0
        while sent < len(arr):
            r = room()
            if r is _NOTHING:
                r = await self._until_room(kernel_id, room, deadline)
            if r is _NOTHING:
                break
            sent += sync._send_records(kernel_id, spec, arr[sent : sent + r])
        if sent == 0:
            raise SendTimeoutError(
                f"kernel '{kernel_id}': input queue full, send_batch timed out after "
                f"{spec.block_timeout} s",
                kernel_id,
                "send_batch",
            )
        return sent

    async def _send_messages(self, kernel_id: str, records: Any, priority: Optional[int]) -> int:
        sync = self.sync
        msgs, priority = sync._messages(kernel_id, records, priority)
        if not msgs:
            return 0
        rt = self._rt
        n, err = rt.send_many(kernel_id, msgs, priority, False)
        if n == len(msgs):
            return n
        if err is not None:
            if n == 0:
                raise err
            return n
        # A full queue under ``block``: await room for the rest, up to the block timeout.
        bt = sync._block.get(kernel_id, 1.0)
        deadline = asyncio.get_running_loop().time() + bt

        def room() -> Any:
            return True if rt.input_room(kernel_id) > 0 else _NOTHING

        sent = n
        while sent < len(msgs):
            if await self._until_room(kernel_id, room, deadline) is _NOTHING:
                break
            n, err = rt.send_many(kernel_id, msgs[sent:], priority, False)
            sent += n
            if err is not None:
                if sent == 0:
                    raise err
                break
        if sent == 0:
            raise SendTimeoutError(
                f"kernel '{kernel_id}': input queue full, send_batch timed out after {bt} s, "
                f"messages returned",
                kernel_id,
                "send_batch",
                msgs,
            )
        return sent

    def snapshot_keys(self, kernel_id: str, start: int = 0, stop: Optional[int] = None) -> np.ndarray:
        """As ``Runtime.snapshot_keys``, on the caller's thread (a device kernel's copy waits
        for the end of its batch: ``await snapshot_keys_async(...)`` does not hold the
        loop)."""
        return self.sync.snapshot_keys(kernel_id, start, stop)

    def snapshot_key(self, kernel_id: str, key: int) -> Any:
        """As ``Runtime.snapshot_key``."""
        return self.sync.snapshot_key(kernel_id, key)

    async def snapshot_keys_async(
        self, kernel_id: str, start: int = 0, stop: Optional[int] = None
    ) -> np.ndarray:
        """``snapshot_keys`` as a coroutine: the copy (for which the engine parks a device
        kernel between two batches) runs on a thread of its own; the loop goes on."""
        return await _in_thread(self.sync.snapshot_keys, kernel_id, start, stop)

    async def receive_batch(
        self, kernel_id: str, max: int, timeout: Optional[float] = 0.0, *, out: Any = None
    ) -> Any:
        """Like ``Runtime.receive_batch``: a list of objects from a message kernel (one
        engine call and one coroutine round per batch), an array from a batch kernel
        (``out`` included); ``timeout`` counts from this call. Cancelled, it has taken
        nothing."""
        sync = self.sync
        rt = self._rt
        if kernel_id not in sync._batch:
            max = _check_max(max)
            _no_out(kernel_id, out)
            r = rt.take_many(kernel_id, max, 0.0)
            if r or max == 0:
                return r

            def take() -> Any:
                return rt.take_many(kernel_id, max, 0.0) or _NOTHING

            r = await self._until(kernel_id, take, self._deadline(timeout))
            return [] if r is _NOTHING else r
        max = _check_max(max)
        spec = sync._batch_spec(kernel_id)
        dst = None if out is None else _batch.output_view(out, spec.out_dtype, kernel_id)
        n = max if dst is None else min(max, len(dst))

        def look() -> Any:
            raw = rt.receive_batch(kernel_id, n, 0.0)
            return raw if len(raw) else _NOTHING

        deadline = self._deadline(timeout)
        on_device = rt.placement(kernel_id) != "host"
        raw = await self._until(kernel_id, look, deadline, fast_looks=on_device)
        if dst is not None:
            return 0 if raw is _NOTHING else _batch.into_records(raw, spec.record, spec.out_dtype, dst)
        if raw is _NOTHING:
            return np.zeros(0, spec.out_dtype)
        return _batch.from_records(raw, spec.record, spec.out_dtype)

    def get_telemetry(self, kernel_id: str) -> Optional[Telemetry]:
        """As ``Runtime.get_telemetry`` (final figures after ``terminate``; None with
        ``enable_telemetry=False``)."""
        return self.sync.get_telemetry(kernel_id)

    def get_all_telemetry(self) -> Dict[str, Telemetry]:
        return self.sync.get_all_telemetry()

    def get_summary(self) -> Dict[str, Any]:
        """As ``Runtime.get_summary``."""
        return self.sync.get_summary()

    async def shutdown(self) -> List[KernelReport]:
        return await _in_thread(self.sync.shutdown)


def get_loop_info() -> Dict[str, Any]:
    """What the running event loop is: ``loop_class`` (``"no_running_loop"`` outside
    one), ``uvloop_available``, ``uvloop_installed`` (the running loop is uvloop's),
    ``eager_tasks_available`` (Python 3.12+), ``eager_tasks_installed`` (the running
    loop's task factory is ``asyncio.eager_task_factory``), ``platform``,
    ``python_version``."""
    try:
        loop: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    uv = importlib.util.find_spec("uvloop") is not None
    eager = getattr(asyncio, "eager_task_factory", None)
    return {
        "loop_class": type(loop).__name__ if loop is not None else "no_running_loop",
        "uvloop_available": uv,
        "uvloop_installed": loop is not None and type(loop).__module__.startswith("uvloop"),
        "eager_tasks_available": eager is not None,
        "eager_tasks_installed": (
            loop is not None and eager is not None and loop.get_task_factory() is eager
        ),
        "platform": sys.platform,
        "python_version": "%d.%d.%d" % sys.version_info[:3],
    }


class RingKernel:
    """A launched kernel, as ``RingKernelRuntime.launch`` returns it: its id and the
    runtime's operations on it (each is the runtime's, with this kernel's id)."""

    __slots__ = ("runtime", "kernel_id")

    def __init__(self, runtime: RingKernelRuntime, kernel_id: str) -> None:
        self.runtime = runtime
        self.kernel_id = kernel_id

    @property
    def state(self) -> KernelState:
        return self.runtime.get_kernel_state(self.kernel_id)

    @property
    def is_active(self) -> bool:
        return self.state is KernelState.ACTIVE

    @property
    def telemetry(self) -> Optional[Telemetry]:
        return self.runtime.get_telemetry(self.kernel_id)

    async def activate(self) -> None:
        await self.runtime.activate(self.kernel_id)

    async def deactivate(self) -> None:
        await self.runtime.deactivate(self.kernel_id)

    async def reactivate(self) -> None:
        await self.runtime.reactivate(self.kernel_id)

    async def terminate(self, timeout: Optional[float] = None) -> KernelReport:
        return await self.runtime.terminate(self.kernel_id, timeout)

    async def send(self, msg: Any, **kw: Any) -> int:
        return await self.runtime.send(self.kernel_id, msg, **kw)

    async def receive(self, timeout: Optional[float] = None) -> Any:
        return await self.runtime.receive(self.kernel_id, timeout)

    async def call(self, msg: Any, timeout: Optional[float] = None, **kw: Any) -> Any:
        return await self.runtime.call(self.kernel_id, msg, timeout, **kw)

    def __repr__(self) -> str:
        try:
            st = self.state.value
        except ResidentError:
            st = "unknown"
        return f"RingKernel({self.kernel_id!r}, state={st})"

"""The runtime: launch kernels, send, receive, call, telemetry, shutdown.

``Runtime`` is the blocking API (for threads); ``RingKernelRuntime`` the asyncio one, with the
same methods as coroutines. Both drive the Rust engine: every wait releases the GIL, runs in
slices of at most 20 ms with a signal check in between (Ctrl-C interrupts it), and an awaited
method never holds its event loop for more than ``RingKernelRuntime.spin_wait`` seconds
(100 us): longer waits move to a worker thread.
"""

from __future__ import annotations

import asyncio
import atexit
import time
import weakref

import numpy as np
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from . import _resident
from .errors import CallTimeoutError, InvalidConfigError, KernelNotFoundError, ReceiveTimeoutError
from . import batch as _batch
from . import device as _device
from .kernel import KernelSpec, _run_kernel, get_kernel

__all__ = ["Runtime", "RingKernelRuntime", "Telemetry", "KernelReport"]

# What the engine returns when no output came (any object, None included, is a message).
_NOTHING = _resident.NOTHING


@dataclass(frozen=True)
class Telemetry:
    """One kernel's figures, read from the engine (nothing here is estimated in Python)."""

    kernel_id: str
    state: str
    messages_received: int
    messages_processed: int
    messages_dropped: int
    messages_refused: int
    messages_expired: int
    """Messages not handled because their deadline passed before the kernel took them (a
    ``call`` with a ``timeout`` carries that deadline; plain sends from Python carry none)."""
    errors: int
    queue_depth: int
    output_depth: int
    batches: int
    throughput: float
    """Processed messages per second over about the last second."""
    latency_count: int
    latency_mean_ns: int
    latency_p50_ns: int
    latency_p95_ns: int
    latency_p99_ns: int
    latency_p999_ns: int
    latency_max_ns: int
    uptime_seconds: float
    objects_held: int
    """Python objects the kernel's queues hold now (queued inputs and outputs)."""

    @property
    def error_count(self) -> int:  # PyDotCompute's name
        return self.errors

    @property
    def avg_latency_ns(self) -> float:  # PyDotCompute's name
        return float(self.latency_mean_ns)


@dataclass
class KernelReport:
    """What terminating a kernel found. Every message a send accepted ends as processed,
    dropped by the policy (counted), or handed back here."""

    kernel_id: str
    processed: int
    dropped: int
    undelivered: List[Any] = field(default_factory=list)
    """Inputs accepted but never handled, highest priority first."""
    unreceived: List[Any] = field(default_factory=list)
    """Outputs produced but never received."""
    failure: Optional[str] = None
    failed_message: Optional[Any] = None
    """The message whose handling failed, if the kernel failed on one."""
    released: int = 0
    """Objects the engine had discarded without handing them back (outputs dropped by a drop
    policy, replies after their caller gave up), released at termination."""

    @classmethod
    def _from(cls, d: Dict[str, Any]) -> "KernelReport":
        fm = d["failed_message"]
        return cls(
            kernel_id=d["kernel_id"],
            processed=d["processed"],
            dropped=d["dropped"],
            undelivered=[o for o, _ in d["undelivered"]],
            unreceived=[o for o, _ in d["unreceived"]],
            failure=d["failure"],
            failed_message=None if fm is None else fm[0],
            released=d["released"],
        )

    @property
    def returned(self) -> int:
        return len(self.undelivered) + len(self.unreceived) + (self.failed_message is not None)


def _priority(msg: Any, priority: Optional[int]) -> int:
    p = getattr(msg, "priority", 128) if priority is None else priority
    if not isinstance(p, int) or not 0 <= p <= 255:
        raise ValueError(f"priority must be an int in 0-255, got {p!r}")
    return p


def _spec(kernel_id: str, func: Optional[Callable[..., Any]], overrides: Dict[str, Any]) -> Any:
    if func is not None:
        spec = getattr(func, "_ring_kernel_spec", None)
        if spec is None:
            spec = KernelSpec(kernel_id=kernel_id, func=func)
    else:
        spec = get_kernel(kernel_id)
        if spec is None:
            raise KernelNotFoundError(
                f"no kernel '{kernel_id}' is registered (decorate it with @ring_kernel or "
                f"pass the function)",
                kernel_id,
            )
    if spec.kernel_id != kernel_id or overrides:
        d = dict(spec.__dict__)
        d["kernel_id"] = kernel_id
        d.update(overrides)
        spec = type(spec)(**d)
    return spec


class Runtime:
    """The blocking runtime: one engine runtime and its Python kernels.

    ``backend`` is ``"auto"``, ``"cpu"``, ``"cuda"``, ``"wgpu"`` or ``"cudasim"``; a Python
    handler runs on a host thread whatever the backend. ``shutdown_timeout`` bounds how long
    ``shutdown`` lets active kernels drain, ``terminate_timeout`` how long ``terminate`` waits
    for a handler.
    """

    def __init__(
        self,
        backend: str = "auto",
        enable_telemetry: bool = True,
        *,
        shutdown_timeout: float = 5.0,
        terminate_timeout: float = 10.0,
    ) -> None:
        self._rt = _resident.Runtime(backend, enable_telemetry, shutdown_timeout, terminate_timeout)
        self._reports: Optional[List[KernelReport]] = None
        _live.add(self)
        self._batch: Dict[str, "_batch.BatchKernelSpec"] = {}
        self._host_state: Dict[str, Any] = {}
        self._host_buffers: Dict[str, Dict[str, np.ndarray]] = {}

    @property
    def backend(self) -> str:
        """The backend the runtime resolved to."""
        return self._rt.backend

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def launch(
        self,
        kernel_id: str,
        kernel_func: Optional[Callable[..., Any]] = None,
        **overrides: Any,
    ) -> None:
        """Launches the kernel registered as ``kernel_id`` (or ``kernel_func``): its queues
        and thread exist, messages queue up until ``activate``. ``overrides`` replace the
        decorator's settings (``queue_size``, ``backpressure``, ...)."""
        s = _spec(kernel_id, kernel_func, overrides)
        if isinstance(s, _batch.BatchKernelSpec):
            state, device, func, buffers, args = s.state, None, s.func, {}, []
            if isinstance(s, _device.DeviceKernelSpec):
                # Each launch starts from the initial state and buffer values, on the device
                # as on the CPU.
                state, device = s.initial_state(), s.device_spec()
                buffers, args = s.initial_buffers(), s.buffer_args()
                func = s.cpu_func(buffers)
            self._rt.launch_batch(
                s.kernel_id,
                s.record,
                _batch.runner(s),
                func,
                state,
                s.queue_size,
                s.backpressure,
                s.block_timeout,
                s.priority_lanes,
                s.max_batch,
                device,
                args,
            )
            self._batch[s.kernel_id] = s
            self._host_state[s.kernel_id] = state
            self._host_buffers[s.kernel_id] = buffers
            return
        self._rt.launch(
            s.kernel_id,
            _run_kernel,
            s.func,
            s.queue_size,
            s.backpressure,
            s.block_timeout,
            s.priority_lanes,
            s.output_queue_size,
        )

    def activate(self, kernel_id: str) -> None:
        """``launched | inactive -> active``."""
        self._rt.activate(kernel_id)

    def deactivate(self, kernel_id: str) -> None:
        """``active -> inactive``: intake stops, messages queue up until ``activate``."""
        self._rt.deactivate(kernel_id)

    def reactivate(self, kernel_id: str) -> None:
        self._rt.activate(kernel_id)

    def terminate(self, kernel_id: str, timeout: Optional[float] = None) -> KernelReport:
        """Stops the kernel and returns its report (undelivered messages handed back)."""
        return self._report(self._rt.terminate(kernel_id, timeout))

    def _report(self, d: Dict[str, Any]) -> KernelReport:
        spec = self._batch.get(d["kernel_id"])
        if spec is None:
            return KernelReport._from(d)
        return KernelReport(
            kernel_id=d["kernel_id"],
            processed=d["processed"],
            dropped=d["dropped"],
            undelivered=list(_batch.from_records(d["undelivered"], spec.record, spec.in_dtype)),
            unreceived=list(_batch.from_records(d["unreceived"], spec.record, spec.out_dtype)),
            failure=d["failure"],
        )

    def send_batch(self, kernel_id: str, records: Any) -> int:
        """Sends the records of a numpy array (converted to the kernel's ``in_dtype``) to a
        batch kernel in one call; returns how many were taken. Fewer than ``len(records)``:
        the rest were refused by the policy (``reject`` full, ``block`` timed out) and were
        not sent; none taken raises (``QueueFullError``, ``SendTimeoutError``, ...)."""
        spec = self._batch_spec(kernel_id)
        arr = np.asarray(records, dtype=spec.in_dtype).reshape(-1)
        return self._rt.send_batch(kernel_id, _batch.to_records(arr, spec.record))

    def receive_batch(self, kernel_id: str, max: int, timeout: float = 0.0) -> np.ndarray:
        """Up to ``max`` outputs of a batch kernel as one array of its ``out_dtype``, waiting
        up to ``timeout`` seconds for the first (an empty array when none came)."""
        spec = self._batch_spec(kernel_id)
        raw = self._rt.receive_batch(kernel_id, max, timeout)
        return _batch.from_records(raw, spec.record, spec.out_dtype)

    def placement(self, kernel_id: str) -> str:
        """Where a batch or device kernel's handler runs: ``"host"`` (its vectorized Python
        function) or the device (``"cuda"``, ``"cudasim"``, ``"wgpu"``)."""
        self._batch_spec(kernel_id)
        return self._rt.placement(kernel_id)

    def host_state(self, kernel_id: str) -> Any:
        """The state object a batch or device kernel's Python function gets (for a device
        kernel, the 1-record array it updates in place when it runs on the host)."""
        self._batch_spec(kernel_id)
        return self._host_state.get(kernel_id)

    def snapshot_state(self, kernel_id: str) -> np.ndarray:
        """A copy of a device kernel's state, one record of its ``state_dtype``: read back from
        the device when the handler runs there (on wgpu: its value after every batch
        submitted so far; on CUDA and CudaSim: its value between two batches, the kernel
        parked for the copy; wait for the outputs you care about first), else a copy of the
        CPU form's state."""
        spec = self._batch_spec(kernel_id)
        if not isinstance(spec, _device.DeviceKernelSpec) or spec.state_dtype is None:
            raise TypeError(f"kernel '{kernel_id}' is not a device kernel with a state")
        if self._rt.placement(kernel_id) == "host":
            return np.array(self._host_state[kernel_id], copy=True)
        raw = self._rt.snapshot_state(kernel_id, spec.state_size)
        isz = spec.state_dtype.itemsize
        return np.ascontiguousarray(raw[:isz]).view(spec.state_dtype).reshape(1).copy()

    def _buffer_spec(self, kernel_id: str, name: str) -> np.ndarray:
        spec = self._batch_spec(kernel_id)
        init = getattr(spec, "buffers", {}).get(name)
        if init is None:
            raise InvalidConfigError(
                f"kernel '{kernel_id}' has no bound buffer named '{name}'", kernel_id
            )
        return init

    def read_buffer(self, kernel_id: str, name: str, timeout: float = 10.0) -> np.ndarray:
        """A copy of the bound buffer ``name`` of a device kernel: on a device, its values
        between two batches (the engine synchronizes with the kernel, waiting up to
        ``timeout`` seconds); on the host, the CPU form's array."""
        init = self._buffer_spec(kernel_id, name)
        if self._rt.placement(kernel_id) == "host":
            return self._host_buffers[kernel_id][name].copy()
        raw = self._rt.read_buffer(kernel_id, name, _device._code(init.dtype), timeout)
        return raw.view(init.dtype).copy()

    def write_buffer(self, kernel_id: str, name: str, values: Any, timeout: float = 10.0) -> None:
        """Replaces the bound buffer ``name``'s values (same length); the kernel's next batch
        sees all of them."""
        init = self._buffer_spec(kernel_id, name)
        arr = np.ascontiguousarray(values, dtype=init.dtype).reshape(-1)
        if arr.shape != init.shape:
            raise ValueError(f"buffer '{name}' holds {init.shape[0]} values, got {arr.shape[0]}")
        if self._rt.placement(kernel_id) == "host":
            self._host_buffers[kernel_id][name][:] = arr
            return
        self._rt.write_buffer(kernel_id, name, _device._code(init.dtype), arr.view(np.uint8), timeout)

    def _batch_spec(self, kernel_id: str) -> "_batch.BatchKernelSpec":
        spec = self._batch.get(kernel_id)
        if spec is None:
            self._rt.state(kernel_id)  # KernelNotFoundError when there is no such kernel
            raise TypeError(f"kernel '{kernel_id}' is not a batch kernel")
        return spec

    def state(self, kernel_id: str) -> str:
        """``launched``, ``active``, ``inactive``, ``terminating``, ``terminated`` or
        ``failed``."""
        return self._rt.state(kernel_id)

    get_kernel_state = state

    def failure(self, kernel_id: str) -> Optional[str]:
        """Why the kernel failed, if it did."""
        return self._rt.failure(kernel_id)

    @property
    def kernel_ids(self) -> List[str]:
        return self._rt.kernel_ids()

    def send(self, kernel_id: str, msg: Any, *, priority: Optional[int] = None) -> int:
        """Queues ``msg`` (any Python object) at ``priority`` (default: ``msg.priority``,
        else 128). Returns the engine's message id. Refusals raise with ``msg`` handed back
        in the exception's ``message``."""
        return self._rt.send(kernel_id, msg, _priority(msg, priority))

    def receive(self, kernel_id: str, timeout: Optional[float] = None) -> Any:
        """The next output, waiting up to ``timeout`` seconds (None: without limit)."""
        return self._rt.receive(kernel_id, timeout)[0]

    def try_receive(self, kernel_id: str) -> Optional[Any]:
        r = self._rt.try_receive(kernel_id, 0.0)
        return None if r is None else r[0]

    def call(
        self,
        kernel_id: str,
        msg: Any,
        timeout: Optional[float] = None,
        *,
        priority: Optional[int] = None,
    ) -> Any:
        """Sends ``msg`` and waits for the reply matched by correlation id (safe from many
        threads at once). ``CallTimeoutError`` after ``timeout`` seconds. The request carries
        that deadline: if the kernel has not taken it by then it is not handled but counted
        (``messages_expired`` in the telemetry), so timed-out calls do not keep the kernel
        busy."""
        pc = self._rt.call_start(kernel_id, msg, _priority(msg, priority), timeout)
        t = 1e9 if timeout is None else timeout
        r = pc.wait(t)
        if r is None:
            pc.cancel()
            raise CallTimeoutError(
                f"kernel '{kernel_id}': call timed out after {t} s", kernel_id, "call"
            )
        return r

    def get_telemetry(self, kernel_id: str) -> Telemetry:
        return Telemetry(**self._rt.telemetry(kernel_id))

    def shutdown(self) -> List[KernelReport]:
        """Lets active kernels drain (up to ``shutdown_timeout``), terminates every kernel
        and returns their reports. A second call returns the same reports."""
        if self._reports is None:
            self._reports = [self._report(d) for d in self._rt.shutdown()]
        return self._reports


class RingKernelRuntime:
    """The asyncio runtime (the seeds' ``RingKernelRuntime``)::

        async with RingKernelRuntime(enable_telemetry=True, backend="auto") as runtime:
            await runtime.launch("worker")
            await runtime.activate("worker")
            reply = await runtime.call("worker", Request(x=1.0), timeout=1.0)

    ``runtime.sync`` is the blocking ``Runtime`` underneath, for threads.
    """

    #: Longest wait (seconds, GIL released) an awaited receive or call makes on the event
    #: loop's own thread before it moves the wait to a worker thread.
    spin_wait: float = 100e-6

    def __init__(
        self,
        enable_telemetry: bool = True,
        backend: str = "auto",
        *,
        shutdown_timeout: float = 5.0,
        terminate_timeout: float = 10.0,
    ) -> None:
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

    async def launch(
        self, kernel_id: str, kernel_func: Optional[Callable[..., Any]] = None, **overrides: Any
    ) -> None:
        self.sync.launch(kernel_id, kernel_func, **overrides)

    async def activate(self, kernel_id: str) -> None:
        self.sync.activate(kernel_id)

    async def reactivate(self, kernel_id: str) -> None:
        self.sync.activate(kernel_id)

    async def deactivate(self, kernel_id: str) -> None:
        await _off_loop(self.sync.deactivate, kernel_id)

    async def terminate(self, kernel_id: str, timeout: Optional[float] = None) -> KernelReport:
        return await _off_loop(self.sync.terminate, kernel_id, timeout)

    def get_kernel_state(self, kernel_id: str) -> str:
        return self.sync.state(kernel_id)

    state = get_kernel_state

    @property
    def kernel_ids(self) -> List[str]:
        return self.sync.kernel_ids

    async def send(self, kernel_id: str, msg: Any, *, priority: Optional[int] = None) -> int:
        """Like ``Runtime.send``. Under ``backpressure="block"`` a send to a full lane waits
        for room (GIL released) on the loop's thread, at most the kernel's block timeout."""
        if priority is None:
            priority = getattr(msg, "priority", 128)
        if priority.__class__ is not int or not 0 <= priority <= 255:
            priority = _priority(msg, priority)  # checks it (raises when invalid)
        return self._rt.send(kernel_id, msg, priority)

    async def receive(self, kernel_id: str, timeout: Optional[float] = None) -> Any:
        """The next output; ``ReceiveTimeoutError`` (an ``asyncio.TimeoutError``) after
        ``timeout`` seconds."""
        rt = self._rt
        r = rt.take(kernel_id, self.spin_wait)
        if r is not _NOTHING:
            return r
        left = None if timeout is None else max(timeout - self.spin_wait, 0.0)
        return (await _off_loop(rt.receive, kernel_id, left))[0]

    async def call(
        self,
        kernel_id: str,
        msg: Any,
        timeout: Optional[float] = None,
        *,
        priority: Optional[int] = None,
    ) -> Any:
        """Sends ``msg`` and awaits the reply matched by correlation id; safe from many tasks
        at once. ``CallTimeoutError`` (an ``asyncio.TimeoutError``) after ``timeout``. The
        request carries that deadline: not taken by then, it is not handled but counted
        (``messages_expired``)."""
        pc = self._rt.call_start(kernel_id, msg, _priority(msg, priority), timeout)
        r = pc.wait(self.spin_wait)
        if r is not None:
            return r
        t = 1e9 if timeout is None else timeout
        r = await _off_loop(_poll_call, pc, max(t - self.spin_wait, 0.0))
        if r is None:
            pc.cancel()
            raise CallTimeoutError(
                f"kernel '{kernel_id}': call timed out after {t} s", kernel_id, "call"
            )
        return r

    async def send_and_receive(
        self, kernel_id: str, msg: Any, *, timeout: Optional[float] = None
    ) -> Any:
        """PyDotCompute's name for ``call``."""
        return await self.call(kernel_id, msg, timeout)

    async def send_batch(self, kernel_id: str, records: Any) -> int:
        return self.sync.send_batch(kernel_id, records)

    async def receive_batch(self, kernel_id: str, max: int, timeout: float = 0.0) -> np.ndarray:
        got = self.sync.receive_batch(kernel_id, max, min(timeout, self.spin_wait))
        if len(got) or timeout <= self.spin_wait:
            return got
        return await _off_loop(self.sync.receive_batch, kernel_id, max, timeout - self.spin_wait)

    def get_telemetry(self, kernel_id: str) -> Telemetry:
        return self.sync.get_telemetry(kernel_id)

    def get_all_telemetry(self) -> Dict[str, Telemetry]:
        return {k: self.sync.get_telemetry(k) for k in self.sync.kernel_ids}

    async def shutdown(self) -> List[KernelReport]:
        return await _off_loop(self.sync.shutdown)


_live: "weakref.WeakSet[Runtime]" = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    """Shuts down the runtimes still open at interpreter exit, while their kernels' threads
    can still run Python (they must see the request to end)."""
    for rt in list(_live):
        try:
            rt.shutdown()
        except Exception:  # pragma: no cover - best effort at exit
            pass


def _poll_call(pc: Any, timeout: float) -> Optional[Any]:
    """Waits for a call's reply from a worker thread (the reply wakes only the thread that
    started the call, so this one looks with a backoff from 20 us to 1 ms)."""
    deadline = time.monotonic() + timeout
    pause = 20e-6
    while True:
        r = pc.poll()
        if r is not None:
            return r
        now = time.monotonic()
        if now >= deadline:
            return None
        time.sleep(min(pause, deadline - now))
        pause = min(pause * 2, 1e-3)


async def _off_loop(f: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, f, *args)

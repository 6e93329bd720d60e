"""The runtime: launch kernels, send, receive, call, telemetry, shutdown.

``Runtime`` is the blocking API (for threads); ``RingKernelRuntime`` (``resident.ring_runtime``)
the asyncio one, with the same methods as coroutines. The blocking API waits in the Rust
engine: every wait releases the GIL and runs in slices of at most 20 ms with a signal check in
between (Ctrl-C interrupts it).

The asyncio API never blocks its event loop and uses no executor: a coroutine that must wait
(an output, a reply, room in a full lane) looks without waiting, then awaits a wake-up the
kernel delivers to the loop (one socket the loop watches, written by the kernel's thread when
it publishes, takes an input, ends or changes state), and looks again. Operations that take
long inside the engine (``launch`` of a device kernel that compiles, ``deactivate``,
``terminate``, ``shutdown``) run on a thread of their own whose result is handed to the loop.
Cancelling any of these coroutines leaves nothing behind: a cancelled ``receive`` takes no
output, a cancelled ``call`` withdraws its request. Timeouts count from the moment of the call.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import enum
import functools
import heapq
import itertools
import threading
import time
import weakref

import numpy as np
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import resident._resident as _resident
from .errors import (
    CallTimeoutError,
    InvalidConfigError,
    KernelNotFoundError,
    KernelStateError,
    MessageTypeError,
    ResidentError,
    SendTimeoutError,
)
from . import batch as _batch
from . import device as _device
from . import kernel as _kernel
from . import keyed as _keyed
from .kernel import KernelSpec, _run_kernel, get_kernel

# The asyncio runtime over this one is ``resident.ring_runtime``.
__all__ = [
    "Runtime",
    "KernelState",
    "Telemetry",
    "KernelReport",
]

# What the engine returns when no output came (any object, None included, is a message).
_NOTHING = _resident.NOTHING
# Terminated kernels whose id and final state the runtime remembers (as the engine does).
_GONE_MAX = 256


class KernelState(str, enum.Enum):
    """A kernel's state, as ``get_kernel_state`` returns it: the engine's states by
    PyDotCompute's names. A ``str`` equal to the engine's name that ``state()`` returns
    (``KernelState.DEACTIVATED == "inactive"``). ``FAILED`` is resident's: the handler raised
    or its loop ended early (``failure()`` says how)."""

    CREATED = "created"
    LAUNCHED = "launched"
    ACTIVE = "active"
    DEACTIVATED = "inactive"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


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

    @property
    def avg_latency_ms(self) -> float:  # PyDotCompute's name
        return self.latency_mean_ns / 1e6

    @property
    def max_latency_ns(self) -> int:  # PyDotCompute's name
        return self.latency_max_ns

    @property
    def total_latency_ns(self) -> int:  # PyDotCompute's name (from the mean: within 1 ns a message)
        return self.latency_mean_ns * self.latency_count


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
    """The message whose handling failed, if the kernel failed on one (for a Python handler
    that raised: the last message it received)."""
    released: int = 0
    """Objects the engine had discarded without handing them back (outputs dropped by a drop
    policy, a reply that raced with its caller giving up), released at termination."""

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


def _check_max(max: Any) -> int:
    if max.__class__ is not int or max < 0:
        raise ValueError(f"receive_batch: max must be an int >= 0, got {max!r}")
    return min(max, _MAX_TAKE)


# ``receive_batch``'s ``max`` beyond this takes what is there (no queue holds more).
_MAX_TAKE = 1 << 48
# A batch kernel's ``send_batch`` hands the engine at most this many records per engine call
# (the engine copies a call's records and builds an envelope for each: memory stays bounded
# whatever the batch's length, and Ctrl-C is seen between calls).
_SEND_CHUNK = 1 << 16


def _wrong_kernel(rt: "Runtime", kernel_id: str, what: str, msg: Any) -> None:
    """Raises ``MessageTypeError`` when ``kernel_id`` is a batch kernel (which takes arrays
    of records, not message objects); returns otherwise."""
    if kernel_id.__class__ is str and kernel_id in rt._batch:
        raise MessageTypeError(
            f"kernel '{kernel_id}' is a batch kernel: {what} takes message objects; send an "
            f"array of its records with send_batch and read its outputs with receive_batch",
            kernel_id,
            None,
            msg,
        ) from None


def _no_out(kernel_id: str, out: Any) -> None:
    if out is not None:
        raise MessageTypeError(
            f"kernel '{kernel_id}': receive_batch(out=...) is for a batch kernel's records; a "
            f"message kernel's receive_batch returns a list of its output objects",
            kernel_id,
        )


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
        known = [f.name for f in dataclasses.fields(spec) if f.name not in ("kernel_id", "func")]
        unknown = {k: v for k, v in overrides.items() if k not in known}
        _kernel.reject_unknown("launch()", unknown, known)
        d = dict(spec.__dict__)
        d["kernel_id"] = kernel_id
        d.update(overrides)
        spec = type(spec)(**d)
    return spec


def _compiles(spec: Any) -> bool:
    """Whether launching ``spec`` may compile a device handler (a device kernel, or a keyed
    kernel with a CUDA or WGSL handler): the asyncio launch runs it on a thread then."""
    if isinstance(spec, _device.DeviceKernelSpec):
        return True
    return isinstance(spec, _keyed.KeyedKernelSpec) and (
        spec.cuda is not None or spec.wgsl is not None or spec.numba is not None
    )


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
        # Tells this runtime's handlers from another's with the same kernel id.
        self._token = object()
        # Python kernels' block timeouts (``backpressure="block"``), for the asyncio sends.
        self._block: Dict[str, float] = {}
        # Final states of device kernels terminated (the last ``_GONE_MAX``).
        self._final_states: Dict[str, np.ndarray] = {}
        # Final telemetry of kernels terminated (the last ``_GONE_MAX``).
        self._final_telemetry: Dict[str, Telemetry] = {}
        self._telemetry_on = bool(enable_telemetry)
        self._started = time.monotonic()
        # Kernels running as tasks of their caller's loop: id -> (loop, task, the loop's
        # wake-up).
        self._on_loop: Dict[
            str, Tuple[asyncio.AbstractEventLoop, "asyncio.Task[None]", "_LoopWake"]
        ] = {}

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
        if isinstance(s, _keyed.KeyedKernelSpec):
            return _keyed._launch(self, s)
        self._final_states.pop(s.kernel_id, None)
        if isinstance(s, _batch.BatchKernelSpec):
            state, device, func, buffers, args = s.state, None, s.func, {}, []
            if isinstance(s, _device.DeviceKernelSpec):
                # Each launch starts from the initial state and buffer values, on the device
                # as on the CPU.
                state, device = s.initial_state(), s.device_spec(self.backend)
                buffers, args = s.initial_buffers(), s.buffer_args()
                func = s.cpu_func(buffers)
                if s.numba is not None and device is None:
                    s.numba.check_gpu()  # the CPU form runs; refused if no GPU could
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
            functools.partial(_run_kernel, (self._token, s.kernel_id)),
            s.func,
            s.queue_size,
            s.backpressure,
            s.block_timeout,
            s.priority_lanes,
            s.output_queue_size,
        )
        self._block[s.kernel_id] = s.block_timeout

    def _launch_on_loop(self, s: KernelSpec) -> None:
        """Launches the Python kernel ``s`` as a task of the running event loop: the engine
        starts no thread; its queues, policies, deadlines, telemetry and terminate report are
        the engine's, as for a kernel on a thread. The loop's wake-up stays armed for the
        kernel's life: a send, activate or terminate made on another thread reaches the
        kernel's waiting future through the loop's socket; one made on the loop's own thread
        completes it directly."""
        loop = asyncio.get_running_loop()
        w = _loop_wake(loop)
        raw = self._rt.launch(
            s.kernel_id,
            None,
            s.func,
            s.queue_size,
            s.backpressure,
            s.block_timeout,
            s.priority_lanes,
            s.output_queue_size,
            True,
        )
        self._block[s.kernel_id] = s.block_timeout
        self._rt.subscribe(s.kernel_id, w.waker)
        w.waker.arm()
        ctx = _kernel.KernelContext(raw, w)
        task = loop.create_task(_kernel._run_on_loop(s.func, ctx), name=f"resident:{s.kernel_id}")
        task.add_done_callback(lambda _t: w.waker.disarm())
        self._on_loop[s.kernel_id] = (loop, task, w)

    def activate(self, kernel_id: str) -> None:
        """``launched | inactive -> active``."""
        self._rt.activate(kernel_id)

    def deactivate(self, kernel_id: str) -> None:
        """``active -> inactive``: intake stops, messages queue up until ``activate``."""
        self._rt.deactivate(kernel_id)

    def reactivate(self, kernel_id: str) -> None:
        self._rt.activate(kernel_id)

    def terminate(self, kernel_id: str, timeout: Optional[float] = None) -> KernelReport:
        """Stops the kernel and returns its report (undelivered messages handed back).

        The kernel is freed then, as in Rust: its queues, the objects they held and its id
        (``kernel_ids`` no longer lists it; the id can be launched again). The runtime
        remembers the last 256 terminated ids with their final state and telemetry: ``state``
        and ``get_telemetry`` return them, and a late ``send`` or ``call`` raises
        ``KernelNotAcceptingError`` with its message handed back."""
        try:
            d = self._rt.terminate(kernel_id, timeout)
        finally:
            self._abandon_stuck([kernel_id])
        try:
            rep = self._report(d)
            self._keep_final_telemetry(kernel_id)
            spec = self._batch.get(kernel_id)
            if isinstance(spec, _device.DeviceKernelSpec) and spec.state_dtype is not None:
                # A device kernel's final state stays readable (``snapshot_state``).
                self._final_states[kernel_id] = self.snapshot_state(kernel_id)
                while len(self._final_states) > _GONE_MAX:
                    self._final_states.pop(next(iter(self._final_states)))
        finally:
            self._forget(kernel_id)
        return rep

    def _keep_final_telemetry(self, kernel_id: str) -> None:
        """Remembers a terminated kernel's last figures (``get_telemetry`` returns them)."""
        try:
            final = Telemetry(**self._rt.telemetry(kernel_id))
        except ResidentError:  # nothing to remember; the report is what matters
            return
        self._final_telemetry.pop(kernel_id, None)
        self._final_telemetry[kernel_id] = final
        while len(self._final_telemetry) > _GONE_MAX:
            self._final_telemetry.pop(next(iter(self._final_telemetry)))

    def _abandon_stuck(self, kernel_ids: List[str]) -> None:
        """Raises ``KernelAbandoned`` in the handlers of these kernels that the engine gave up
        on (failed, their thread still in Python), so that they end before the interpreter
        does."""
        keys = []
        for k in kernel_ids:
            try:
                if self._rt.state(k) == "failed":
                    keys.append((self._token, k))
            except Exception:
                pass
        _kernel._abandon(keys)

    def _forget(self, kernel_id: str) -> None:
        if self._rt.state(kernel_id) in ("terminated", "failed"):
            self._rt.forget(kernel_id)
            for d in (self._batch, self._host_state, self._host_buffers, self._block, self._on_loop):
                d.pop(kernel_id, None)

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

    def send_batch(self, kernel_id: str, records: Any, *, priority: Optional[int] = None) -> int:
        """**Message kernels** (``@ring_kernel``): sends the message objects of ``records`` (a
        list, or any iterable of objects) in order, in one engine call, each at ``priority``
        or its own ``priority`` (default 128; all are checked before any is sent); returns
        how many were taken. Under ``backpressure="block"`` a full queue waits up to the
        block timeout per message. Fewer than all: ``records[n:]`` were refused by the
        policy and not sent (still the caller's); none taken raises (``QueueFullError``,
        ``SendTimeoutError``, ``KernelNotAcceptingError``) with the refused messages, as a
        list, in the exception's ``message``. An empty batch does nothing. An array of
        records raises ``MessageTypeError``.

        **Batch kernels**: sends the records of an array of the kernel's ``in_dtype`` (numpy, or any DLPack
        array of host memory: PyTorch, CuPy's host arrays, JAX on CPU, a ``UnifiedBuffer``, a
        ``DLPackArray``; read in place, no intermediate copy) to a batch kernel in one call;
        returns how many were taken. Fewer than ``len(records)``: the rest were
        refused by the policy (``reject`` full, ``block`` timed out) and were not sent; none
        taken raises (``QueueFullError``, ``SendTimeoutError``, ...).

        ``records`` must be a structured array with the same fields as ``in_dtype``: the same
        names, types, order and offsets (``DtypeLayoutError`` otherwise, naming the first
        difference), or a list of tuples in ``in_dtype``'s field order. Nothing is converted
        by position or broadcast into every field."""
        spec = self._batch.get(kernel_id)
        if spec is None:
            msgs, p = self._messages(kernel_id, records, priority)
            if not msgs:
                return 0
            n, err = self._rt.send_many(kernel_id, msgs, p, True)
            if err is not None and n == 0:
                raise err
            return n
        if priority is not None:
            raise ValueError(f"kernel '{kernel_id}': a batch kernel's records take no priority")
        arr = _batch.checked_records(records, spec.in_dtype, kernel_id)
        return self._send_records(kernel_id, spec, arr)

    def _messages(self, kernel_id: str, records: Any, priority: Optional[int]) -> Any:
        """A message kernel's batch as a list, and its priority checked."""
        try:
            msgs = _kernel.as_batch(records, f"kernel '{kernel_id}': send_batch")
        except MessageTypeError:
            self._rt.state(kernel_id)  # KernelNotFoundError first, when there is no kernel
            raise
        if priority is not None:
            priority = _priority(None, priority)
        return msgs, priority

    def _send_records(self, kernel_id: str, spec: Any, arr: np.ndarray) -> int:
        if isinstance(spec, _keyed.KeyedKernelSpec):
            return _keyed.send_records(self, kernel_id, spec, arr)
        block = spec.backpressure == "block"
        rt = self._rt
        if len(arr) <= _SEND_CHUNK and not (block and rt.input_room(kernel_id) == 0):
            return rt.send_batch(kernel_id, _batch.to_records(arr, spec.record))
        # Long, or about to wait: in chunks, each waiting for room here (Ctrl-C is seen; a
        # ``KeyboardInterrupt`` says in ``sent`` how many records were taken before it).
        sent = 0
        try:
            while sent < len(arr):
                size = _SEND_CHUNK
                if block:
                    room = self._room_within(kernel_id, spec.block_timeout)
                    if room == 0:
                        if sent == 0:
                            raise SendTimeoutError(
                                f"kernel '{kernel_id}': input queue full, send_batch timed out "
                                f"after {spec.block_timeout} s",
                                kernel_id,
                                "send_batch",
                            )
                        break
                    size = min(size, room)
                part = arr[sent : sent + size]
                try:
                    n = rt.send_batch(kernel_id, _batch.to_records(part, spec.record))
                except ResidentError:
                    if sent == 0:
                        raise
                    break
                sent += n
                if n < len(part):
                    break
        except KeyboardInterrupt as e:
            e.sent = sent  # type: ignore[attr-defined]
            raise
        return sent

    def _room_within(self, kernel_id: str, timeout: float) -> int:
        """Room in a batch kernel's input queue, waiting up to ``timeout`` seconds for some
        (Ctrl-C interrupts the wait); 0 when none came or the kernel stopped accepting."""
        rt = self._rt
        r = rt.input_room(kernel_id)
        if r > 0:
            return r
        deadline = time.monotonic() + timeout
        pause = 50e-6
        while True:
            if self.state(kernel_id) not in ("launched", "active", "inactive"):
                return 1  # the engine refuses the send at once, records handed back
            time.sleep(pause)
            pause = min(pause * 2, 2e-3)
            r = rt.input_room(kernel_id)
            if r > 0 or time.monotonic() >= deadline:
                return r

    def receive_batch(
        self, kernel_id: str, max: int, timeout: Optional[float] = 0.0, *, out: Any = None
    ) -> Any:
        """**Message kernels**: up to ``max`` outputs as a list of objects, in order, in one
        engine call: those ready now, or else the first to come within ``timeout`` seconds
        (None: without limit) and whatever else came with it; ``[]`` when none came.

        **Batch kernels**: up to ``max`` outputs of a batch kernel as one array of its ``out_dtype``, waiting
        up to ``timeout`` seconds for the first (an empty array when none came).

        With ``out`` (a 1-D writable array of ``out_dtype``: numpy, or any DLPack array of
        host memory, e.g. a PyTorch CPU tensor or a ``UnifiedBuffer``), up to
        ``min(max, len(out))`` outputs are written into its first rows instead, and the call
        returns how many (an ``int``)."""
        if kernel_id not in self._batch:
            max = _check_max(max)
            _no_out(kernel_id, out)
            return self._rt.receive_many(kernel_id, max, timeout)
        max = _check_max(max)
        spec = self._batch_spec(kernel_id)
        if out is not None:
            dst = _batch.output_view(out, spec.out_dtype, kernel_id)
            raw = self._rt.receive_batch(kernel_id, min(max, len(dst)), timeout)
            return _batch.into_records(raw, spec.record, spec.out_dtype, dst)
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

    def snapshot_keys(self, kernel_id: str, start: int = 0, stop: Optional[int] = None) -> np.ndarray:
        """A keyed kernel's key states ``start..stop`` (every key by default) as an array of
        its ``state_dtype``; also after ``terminate``. ``KeyOutOfRange`` outside the keys."""
        return _keyed.snapshot_keys(self, kernel_id, start, stop)

    def snapshot_key(self, kernel_id: str, key: int) -> Any:
        """One key's state record (``KeyOutOfRange`` outside the keys)."""
        return _keyed.snapshot_key(self, kernel_id, key)

    def snapshot_state(self, kernel_id: str) -> np.ndarray:
        """A copy of a device kernel's state, one record of its ``state_dtype``: read back from
        the device when the handler runs there (on wgpu: its value after every batch
        submitted so far; on CUDA and CudaSim: its value between two batches, the kernel
        parked for the copy; wait for the outputs you care about first), else a copy of the
        CPU form's state."""
        final = self._final_states.get(kernel_id)
        if final is not None and kernel_id not in self._batch:
            return final.copy()
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

    def get_kernel_state(self, kernel_id: str) -> KernelState:
        """The kernel's state as a ``KernelState`` (a ``str``, equal to what ``state``
        returns)."""
        return KernelState(self._rt.state(kernel_id))

    @property
    def is_active(self) -> bool:
        """True from construction until ``shutdown`` (the engine runs from construction)."""
        return self._reports is None

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
        try:
            return self._rt.send(kernel_id, msg, _priority(msg, priority))
        except KernelNotFoundError:
            _wrong_kernel(self, kernel_id, "send", msg)
            raise

    def receive(self, kernel_id: str, timeout: Optional[float] = None) -> Any:
        """The next output, waiting up to ``timeout`` seconds (None: without limit)."""
        try:
            return self._rt.receive(kernel_id, timeout)[0]
        except KernelNotFoundError:
            _wrong_kernel(self, kernel_id, "receive", None)
            raise

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
        try:
            pc = self._rt.call_start(kernel_id, msg, _priority(msg, priority), timeout)
        except KernelNotFoundError:
            _wrong_kernel(self, kernel_id, "call", msg)
            raise
        t = 1e9 if timeout is None else timeout
        try:
            r = pc.wait(t)
        except BaseException:
            pc.cancel()
            raise
        if r is _NOTHING:
            pc.cancel()
            raise CallTimeoutError(
                f"kernel '{kernel_id}': call timed out after {t} s", kernel_id, "call"
            )
        return r

    def get_telemetry(self, kernel_id: str) -> Optional[Telemetry]:
        """The kernel's figures; after ``terminate``, its final figures (state
        ``terminated``; the last 256 terminated kernels are remembered). None when the
        runtime was made with ``enable_telemetry=False``."""
        if not self._telemetry_on:
            self._rt.state(kernel_id)  # KernelNotFoundError for an unknown id
            return None
        try:
            return Telemetry(**self._rt.telemetry(kernel_id))
        except KernelStateError:
            final = self._final_telemetry.get(kernel_id)
            if final is None:
                raise
            return final

    def get_all_telemetry(self) -> Dict[str, Telemetry]:
        """Every live kernel's figures by id (empty with ``enable_telemetry=False``)."""
        if not self._telemetry_on:
            return {}
        return {k: Telemetry(**self._rt.telemetry(k)) for k in self._rt.kernel_ids()}

    def get_summary(self) -> Dict[str, Any]:
        """Totals over the live kernels: ``kernel_count``, ``total_messages_processed``,
        ``total_messages_dropped``, ``total_errors``, ``uptime_seconds`` (since the runtime
        was made) and ``gpu_utilization`` (None: not read here). With
        ``enable_telemetry=False`` the totals are 0."""
        every = self.get_all_telemetry().values()
        return {
            "kernel_count": len(self._rt.kernel_ids()),
            "total_messages_processed": sum(t.messages_processed for t in every),
            "total_messages_dropped": sum(t.messages_dropped for t in every),
            "total_errors": sum(t.errors for t in every),
            "uptime_seconds": time.monotonic() - self._started,
            "gpu_utilization": None,
        }

    def shutdown(self) -> List[KernelReport]:
        """Lets active kernels drain (up to ``shutdown_timeout``), terminates every kernel
        and returns their reports. A second call returns the same reports."""
        if self._reports is None:
            ids = self._rt.kernel_ids()
            try:
                self._reports = [self._report(d) for d in self._rt.shutdown()]
            finally:
                self._abandon_stuck(ids)
        return self._reports


class _LoopWake:
    """One event loop's wake-up: the socket it watches and the futures waiting on it (the
    waker's set, ``futs``). A kernel's ring made on the loop's own thread (a send from a
    coroutine to a kernel on the loop, a kernel on the loop publishing) settles the futures
    directly, in the extension (nothing when none waits), without the socket.

    It also keeps the deadlines of the loop's waits (``at``): one timer of the loop for the
    earliest, not one ``call_at`` per wait (a wait's own timer, made and cancelled for each
    message, cost more than a microsecond of the loop's time: a Python ``TimerHandle``, its
    place in the loop's heap by Python comparisons, its cancellation and its removal)."""

    __slots__ = ("waker", "futs", "loop", "_dl", "_dl_at", "_dl_h", "_dl_max", "__weakref__")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.waker = _resident.Waker()
        self.futs: "set[asyncio.Future[Any]]" = self.waker.futs
        self.loop = loop
        # The waits' deadlines: a heap of (loop time, sequence number, future); the entry of
        # a wait that ended goes when it reaches the top or when the heap is compacted.
        self._dl: List[Tuple[float, int, "asyncio.Future[Any]"]] = []
        # The loop's timer for the earliest deadline (its time), or None.
        self._dl_at: Optional[float] = None
        self._dl_h: Optional[asyncio.TimerHandle] = None
        self._dl_max = _DL_MIN
        loop.add_reader(self.waker.fileno(), self._on_wake)

    def _on_wake(self) -> None:
        self.waker.drain()
        self.waker.settle()

    def at(self, when: float, f: "asyncio.Future[Any]") -> None:
        """Settles ``f`` (when it is not done by then) once the loop's clock reaches
        ``when``, as ``loop.call_at(when, ...)`` would."""
        dl = self._dl
        heapq.heappush(dl, (when, next(_dl_seq), f))
        at = self._dl_at
        if at is None or when < at:
            if self._dl_h is not None:
                self._dl_h.cancel()
            self._dl_at = when
            self._dl_h = self.loop.call_at(when, self._fire)
        if len(dl) > self._dl_max:
            # Entries of waits that ended (their futures done): out, in time linear in the
            # heap, once per as many new entries as there are left.
            dl[:] = [e for e in dl if not e[2].done()]
            heapq.heapify(dl)
            self._dl_max = max(_DL_MIN, 2 * len(dl))

    def _fire(self) -> None:
        """The timer for the earliest deadline: settles every wait due (the loop found the
        timer due at its time: so is every deadline up to that time), then sets the timer
        for the next wait still waiting."""
        due = self._dl_at
        self._dl_at = self._dl_h = None
        dl = self._dl
        now = self.loop.time()
        if due is None or due < now:
            due = now
        pop = heapq.heappop
        while dl and dl[0][0] <= due:
            f = pop(dl)[2]
            if not f.done():
                f.set_result(None)
        while dl and dl[0][2].done():
            pop(dl)
        if dl:
            self._dl_at = dl[0][0]
            self._dl_h = self.loop.call_at(self._dl_at, self._fire)


# A wait deadline heap is compacted past twice its live entries, and never below this.
_DL_MIN = 256
_dl_seq = itertools.count()


_wakes: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWake]" = (
    weakref.WeakKeyDictionary()
)


def _loop_wake(loop: asyncio.AbstractEventLoop) -> _LoopWake:
    w = _wakes.get(loop)
    if w is None:
        w = _wakes[loop] = _LoopWake(loop)
    return w


async def _park(loop: asyncio.AbstractEventLoop, w: _LoopWake, until: float) -> None:
    """Waits on this loop until a ring of ``w`` completes the wait's future, or ``until``
    (loop time), whichever is first; the future is gone afterwards (its deadline entry is
    dropped by ``w``)."""
    f = loop.create_future()
    w.futs.add(f)
    w.at(until, f)
    try:
        await f
    finally:
        w.futs.discard(f)


async def _in_thread(f: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Runs ``f`` on a thread of its own (not the loop's default executor, which other work
    shares) and awaits its result. Cancelled, the operation still completes; its result is
    dropped."""
    loop = asyncio.get_running_loop()
    fut: "asyncio.Future[Any]" = loop.create_future()

    def done(r: Any, e: Optional[BaseException]) -> None:
        if fut.done():
            return
        if e is None:
            fut.set_result(r)
        else:
            fut.set_exception(e)

    def run() -> None:
        try:
            r, e = f(*args, **kwargs), None
        except BaseException as x:  # handed to the awaiting coroutine
            r, e = None, x
        try:
            loop.call_soon_threadsafe(done, r, e)
        except RuntimeError:  # the loop was closed meanwhile: nobody awaits the result
            pass

    threading.Thread(target=run, name=f"resident-{getattr(f, '__name__', 'op')}", daemon=True).start()
    return await fut


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
    # Handlers abandoned by a terminate or shutdown were told to stop (``KernelAbandoned``):
    # let them leave Python before the interpreter ends (a thread still in Python then would
    # crash the process). A handler stuck inside one C call that never returns is not
    # reached by this.
    with _kernel._handler_lock:
        running = list(_kernel._handler_threads)
    _kernel._abandon(running)
    deadline = time.monotonic() + 2.0
    while _resident.handlers_in_python() and time.monotonic() < deadline:
        time.sleep(0.005)

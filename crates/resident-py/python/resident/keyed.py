"""Keyed kernels: ``keys`` small per-key states (one record of a numpy structured
``state_dtype`` each) in one kernel, every message naming its key in the ``uint32`` field
``key_field`` of its ``in_dtype`` record: the Rust engine's keyed kernel
(``RingKernel::keyed``), declared from Python.

The engine does the keyed work: a record naming a key the kernel does not have is refused at
``send_batch`` (``KeyOutOfRange``, the whole batch, nothing queued); the messages of one key
are handled in the order sent (within a priority lane) and different keys independently;
the states stay in the kernel for its life (in device memory when a device handler runs them)
and ``Runtime.snapshot_keys`` reads them back between two batches, also after ``terminate``.

The key handler, ``def handle(key, state, msg) -> out or None``, is called once per message
with the message's key, its key's state (one writable record of ``state_dtype``: update its
fields in place) and the message (one record of ``in_dtype``); it returns one ``out_dtype``
record (a tuple in field order, or a record) or None for no output. With ``cuda=`` (run on
``cuda`` and ``cudasim``) or ``wgsl=`` (run on ``wgpu``) the same kernel runs a device key
handler on those backends, as Rust's ``key_cuda``/``key_wgsl`` (CUDA C and WGSL)::

    __device__ bool handle(KeyState* ks, const ResidentIn* in, ResidentOut* out,
                           const Envelope* env);
    fn handle(ks: ptr<function, KeyState>, input: ResidentIn,
              out: ptr<function, ResidentOut>, env: Envelope) -> bool

where ``KeyState`` is ``state_dtype``'s struct. Records move as whole arrays
(``send_batch``/``receive_batch``), as for ``@batch_kernel``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

import resident._resident as _resident
from ._dtypes import kernel_dtypes
from .batch import BatchKernelSpec, to_records
from .device import _check_names, _fields, _natural_size
from .errors import DtypeLayoutError, KeyOutOfRange
from .kernel import _registry, reject_unknown
from . import numba_handlers as _numba

__all__ = ["keyed_kernel", "KeyedKernelSpec", "KeyOutOfRange"]

KEYED_RECORD_SIZES: Tuple[int, ...] = tuple(_resident.KEYED_RECORD_SIZES)
"""Record sizes of keyed kernels: each record is padded to the smallest that holds it and a
4-byte copy of its key."""
KEYED_STATE_SIZES: Tuple[int, ...] = tuple(_resident.KEYED_STATE_SIZES)
"""Per-key state sizes: each state is padded to the smallest that holds it."""


def _need(dtype: np.dtype, what: str) -> int:
    """Bytes a record of ``dtype`` takes on the host and on a device."""
    if dtype.fields is None:
        return dtype.itemsize
    return max(dtype.itemsize, _natural_size(_fields(dtype, what)))


def _smallest(sizes: Tuple[int, ...], need: int, what: str, kernel_id: str) -> int:
    for s in sizes:
        if s >= need:
            return s
    raise DtypeLayoutError(
        f"kernel '{kernel_id}': {what} of {need} bytes exceed {sizes[-1]}", kernel_id
    )


@dataclass(frozen=True)
class KeyedKernelSpec(BatchKernelSpec):
    """A keyed kernel (see the module docs). ``state`` is every key's initial state (one
    record, default all zeros) or an array of ``keys`` records (key ``k`` starts as
    ``state[k]``)."""

    keys: int = 1
    state_dtype: Optional[np.dtype] = None
    key_field: str = "key"
    cuda: Optional[str] = None
    wgsl: Optional[str] = None
    function: str = "handle"
    workgroup_size: int = 64
    workers: int = 1
    numba: Any = None
    """The ``numba=`` handler (a ``NumbaHandler``), or None."""

    def __post_init__(self) -> None:
        k = f"kernel '{self.kernel_id}'"
        if self.numba is not None and (self.cuda is not None or self.wgsl is not None):
            raise ValueError(
                f"{k}: numba= is the kernel's handler on every engine; it takes no cuda= or "
                f"wgsl= beside it"
            )
        if self.state_dtype is None:
            raise DtypeLayoutError(f"{k}: a keyed kernel needs its state_dtype", self.kernel_id)
        object.__setattr__(self, "state_dtype", np.dtype(self.state_dtype))
        if not isinstance(self.keys, (int, np.integer)) or not 1 <= int(self.keys) <= 2**32 - 1:
            raise ValueError(f"{k}: keys must be an integer from 1 to 2**32 - 1, got {self.keys!r}")
        object.__setattr__(self, "keys", int(self.keys))
        if self.workers < 1:
            raise ValueError(f"{k}: workers must be >= 1")
        super().__post_init__()
        _fields(self.state_dtype, f"{k} state_dtype")  # structured, device scalar types
        if self.in_dtype.fields is None:
            raise DtypeLayoutError(
                f"{k}: in_dtype {self.in_dtype} is not a structured dtype; it needs the key "
                f"field '{self.key_field}'",
                self.kernel_id,
            )
        key = self.in_dtype.fields.get(self.key_field)
        if key is None:
            raise DtypeLayoutError(
                f"{k}: in_dtype has no key field '{self.key_field}' (its fields are "
                f"{list(self.in_dtype.fields)})",
                self.kernel_id,
                self.key_field,
            )
        if key[0] != np.dtype("<u4"):
            raise DtypeLayoutError(
                f"{k}: the key field '{self.key_field}' is {key[0]}, a key is a uint32 "
                f"(little-endian)",
                self.kernel_id,
                self.key_field,
            )
        on_device = self.cuda is not None or self.wgsl is not None or self.numba is not None
        for d, n in ((self.in_dtype, "in_dtype"), (self.out_dtype, "out_dtype"),
                     (self.state_dtype, "state_dtype")):
            _check_names(d, f"{k} {n}", self.cuda is not None or self.numba is not None,
                         self.wgsl is not None)
            if on_device:
                _fields(d, f"{k} {n}")
        _ = self.state_size
        self.initial_states()  # refuses a state that is not of state_dtype, now
        if on_device:
            self.device_spec()  # refuses layouts the device cannot hold, now

    @property
    def record(self) -> int:
        k = f"kernel '{self.kernel_id}'"
        need = max(_need(self.in_dtype, f"{k} in_dtype") + 4, _need(self.out_dtype, f"{k} out_dtype"))
        return _smallest(KEYED_RECORD_SIZES, need, "records (with the key's copy)", self.kernel_id)

    @property
    def state_size(self) -> int:
        """Bytes each key's state takes in the kernel (``state_dtype`` padded)."""
        assert self.state_dtype is not None
        need = _need(self.state_dtype, f"kernel '{self.kernel_id}' state_dtype")
        return _smallest(KEYED_STATE_SIZES, need, "a key state", self.kernel_id)

    def initial_states(self) -> np.ndarray:
        """Every key's initial state, padded: ``keys * state_size`` bytes."""
        assert self.state_dtype is not None
        dt, n, m = self.state_dtype, self.keys, self.state_size
        if self.state is None:
            return np.zeros(n * m, np.uint8)
        try:
            arr = np.array(self.state, dtype=dt).reshape(-1)
        except (TypeError, ValueError) as e:
            raise DtypeLayoutError(
                f"kernel '{self.kernel_id}': the initial state is not of state_dtype {dt}: {e}",
                self.kernel_id,
            ) from None
        if len(arr) not in (1, n):
            raise ValueError(
                f"kernel '{self.kernel_id}': the initial state is one record or {n} records "
                f"(one per key), got {len(arr)}"
            )
        raw = np.zeros((n, m), np.uint8)
        raw[:, : dt.itemsize] = arr.view(np.uint8).reshape(len(arr), dt.itemsize)
        return raw.reshape(-1)

    def device_spec(self, backend: Optional[str] = None) -> Any:
        """The engine's checked description of the message layouts and handler sources
        (None without a device handler). A ``numba=`` handler is compiled for ``backend``
        (``"cuda"``, ``"cudasim"``; None: the layouts are checked with its C shim only)."""
        cuda, external = self.cuda, None
        if self.numba is not None:
            got = self.numba.device_source(backend)
            if got is None:
                return None
            cuda, external = got
        if cuda is None and self.wgsl is None:
            return None
        k = f"kernel '{self.kernel_id}'"
        try:
            return _resident.DeviceSpec(
                self.record,
                _fields(self.in_dtype, f"{k} in_dtype"),
                _fields(self.out_dtype, f"{k} out_dtype"),
                # Checked here (C offsets, WGSL types); the engine declares it as `KeyState`.
                _fields(self.state_dtype, f"{k} state_dtype"),  # type: ignore[arg-type]
                self.state_size,
                bytes(self.state_size),
                cuda,
                self.wgsl,
                self.function,
                False,
                self.workgroup_size,
                (
                    f"the numpy dtype {self.in_dtype}",
                    f"the numpy dtype {self.out_dtype}",
                    f"the numpy dtype {self.state_dtype}",
                ),
                external=external,
            )
        except DtypeLayoutError as e:
            raise DtypeLayoutError(f"{k}: {e}", self.kernel_id, e.detail) from None

    def to_wire(self, arr: np.ndarray) -> np.ndarray:
        """Records of ``in_dtype`` as the kernel takes them: padded, each with its key's copy
        in its last 4 bytes."""
        raw = to_records(arr, self.record).reshape(-1, self.record)
        raw[:, -4:] = np.ascontiguousarray(arr[self.key_field], dtype="<u4").view(np.uint8).reshape(-1, 4)
        return raw.reshape(-1)


def _run_key(spec: KeyedKernelSpec, func: Any, key: int, st: np.ndarray, raw: np.ndarray) -> Any:
    """Runs on the kernel's thread for each message: the key handler over views of the key's
    state (written back by the engine's side) and the message."""
    state = st.view(spec.state_dtype)[0]
    msg = raw[: spec.in_dtype.itemsize].view(spec.in_dtype)[0]
    out = func(key, state, msg)
    if out is None:
        return None
    return np.array(out, dtype=spec.out_dtype).reshape(1).view(np.uint8)


_KEYED_KERNEL_ARGS = (
    "kernel_id", "keys", "in_dtype", "out_dtype", "state_dtype", "key_field", "state", "cuda",
    "wgsl", "function", "workgroup_size", "workers", "queue_size", "backpressure",
    "block_timeout", "max_batch", "numba",
)


def keyed_kernel(
    func: Optional[Callable[..., Any]] = None,
    *,
    kernel_id: Optional[str] = None,
    keys: int,
    in_dtype: Any,
    state_dtype: Any,
    key_field: str,
    out_dtype: Any = None,
    state: Any = None,
    cuda: Optional[str] = None,
    wgsl: Optional[str] = None,
    function: str = "handle",
    workgroup_size: int = 64,
    workers: int = 1,
    queue_size: int = 4096,
    backpressure: str = "block",
    block_timeout: float = 1.0,
    max_batch: int = 4096,
    numba: Any = None,
    **unknown: Any,
) -> Any:
    """Declares ``def handle(key, state, msg) -> out or None`` as a keyed kernel of ``keys``
    keys (see the module docs). ``in_dtype`` records name their key in the uint32 field
    ``key_field``; each key's state is one record of the structured ``state_dtype``, starting
    as ``state`` (one record for every key, or ``keys`` records; default zeros). ``cuda``/
    ``wgsl`` are the device key handlers (function ``function``), run on CUDA and CudaSim /
    wgpu; the Python handler runs on the other backends, on ``workers`` threads (the keys
    sharded over them; 1 by default, as Python handlers share the GIL). ``max_batch``
    messages are taken per batch (the engine's keyed default, 4096).

    ``numba=f`` declares the kernel with ``f(state, inp, out, env) -> bool`` as its handler on
    every engine, compiled by Numba (``resident.numba_handlers``): the call returns ``f``,
    registered; ``@keyed_kernel(..., numba=True)`` over ``f`` is the same. Any other keyword
    argument raises ``UnknownArgumentError`` naming the closest known one."""
    reject_unknown("@keyed_kernel", unknown, _KEYED_KERNEL_ARGS)

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        kid = kernel_id or f.__name__
        handler = None
        in_dt, out_dt, st_dt = kernel_dtypes(in_dtype, out_dtype, state_dtype, state_required=True)
        if numba is not None and numba is not False:
            handler = _numba.NumbaHandler(f, kid, "keyed", st_dt, in_dt, out_dt)
        spec = KeyedKernelSpec(
            kernel_id=kernel_id or f.__name__,
            func=f,
            in_dtype=in_dt,
            out_dtype=out_dt,
            state=state,
            queue_size=queue_size,
            backpressure=backpressure,
            block_timeout=block_timeout,
            max_batch=max_batch,
            keys=keys,
            state_dtype=st_dt,
            key_field=key_field,
            cuda=cuda,
            wgsl=wgsl,
            function=function,
            workgroup_size=workgroup_size,
            workers=workers,
            numba=handler,
        )
        f._ring_kernel_spec = spec  # type: ignore[attr-defined]
        _registry[spec.kernel_id] = spec  # type: ignore[assignment]
        return f

    if func is not None:
        return wrap(func)
    if callable(numba) and numba is not True:
        return wrap(numba)
    return wrap


# ---- the runtime's keyed operations ---------------------------------------------------------


def _handles(rt: Any) -> Dict[str, Any]:
    h = rt.__dict__.get("_keyed_handles")
    if h is None:
        h = rt.__dict__.setdefault("_keyed_handles", {})
    return h


def _launch(rt: Any, s: KeyedKernelSpec) -> None:
    dev = s.device_spec(rt.backend)
    key_fn, func, native = functools.partial(_run_key, s), s.func, None
    if s.numba is not None and dev is None:
        # The CPU engine calls the function's native form itself, for each message, with its
        # envelope, with no Python in between (the same cfunc CudaSim calls); the function is
        # checked for a GPU too.
        cf = s.numba.cfunc()
        native = (int(cf.address), cf)
        s.numba.check_gpu()
    state_fields = None
    if dev is not None:
        state_fields = _fields(s.state_dtype, f"kernel '{s.kernel_id}' state_dtype")  # type: ignore[arg-type]
    h = _resident.launch_keyed(
        rt._rt,
        s.kernel_id,
        s.record,
        s.state_size,
        s.state_dtype.itemsize,  # type: ignore[union-attr]
        s.initial_states(),
        s.key_field,
        key_fn,
        func,
        s.queue_size,
        s.backpressure,
        s.block_timeout,
        s.priority_lanes,
        s.max_batch,
        s.workers,
        dev,
        state_fields,
        f"the numpy dtype {s.state_dtype}",
        native,
    )
    _handles(rt)[s.kernel_id] = (h, s)
    rt._final_states.pop(s.kernel_id, None)
    rt._batch[s.kernel_id] = s
    rt._host_state[s.kernel_id] = None
    rt._host_buffers[s.kernel_id] = {}


def snapshot_keys(
    self: Any, kernel_id: str, start: int = 0, stop: Optional[int] = None
) -> np.ndarray:
    """A copy of the states of keys ``start..stop`` (default: every key) of a keyed kernel, as
    an array of its ``state_dtype``, read between two batches (from the device when a device
    handler holds them), also after ``terminate``. At most 2**20 keys per call; a range
    outside the keys raises ``KeyOutOfRange``."""
    got = _handles(self).get(kernel_id)
    if got is None:
        self._rt.state(kernel_id)  # KernelNotFoundError for an unknown id
        raise TypeError(f"kernel '{kernel_id}' is not a keyed kernel")
    h, spec = got
    stop = h.keys if stop is None else stop
    start, stop = int(start), int(stop)
    if start < 0 or stop < 0:
        bad = min(start, stop)
        raise KeyOutOfRange(
            f"kernel '{kernel_id}': key {bad} is not one of its {h.keys} keys", kernel_id, str(bad)
        )
    raw = h.snapshot_keys(min(start, 2**32 - 1), min(stop, 2**32 - 1))
    n, m, dt = len(raw) // spec.state_size, spec.state_size, spec.state_dtype
    if n == 0:
        return np.zeros(0, dt)
    return np.ascontiguousarray(raw.reshape(n, m)[:, : dt.itemsize]).view(dt).reshape(n)


def snapshot_key(self: Any, kernel_id: str, key: int) -> Any:
    """A copy of key ``key``'s state (one record of ``state_dtype``); see ``snapshot_keys``."""
    return snapshot_keys(self, kernel_id, key, int(key) + 1)[0]


def send_records(rt: Any, kernel_id: str, spec: KeyedKernelSpec, arr: np.ndarray) -> int:
    """A keyed kernel's records, in its wire form (the key copied where the engine reads it)."""
    h, _ = _handles(rt)[kernel_id]
    return h.send_batch(spec.to_wire(arr))

"""Batch kernels: fixed-size records (a numpy dtype) sent and received as whole arrays and
handled by a vectorized function per drained batch, ``def handle(state, batch) -> out``.

No Python object exists per message: ``send_batch`` copies the array's records into the
engine's queue in one call, the kernel's thread hands each drained batch (up to ``max_batch``
records) to the function as one numpy array, and ``receive_batch`` returns the outputs as one
array. Records are padded to the engine's blob size (8, 16, 32, 64, 128 or 256 bytes: the
smallest that holds both dtypes).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import numpy as np

from ._dtypes import kernel_dtypes

from .kernel import BACKPRESSURE, _registry, reject_unknown
from .numba_handlers import NumbaHandler

__all__ = ["batch_kernel", "BatchKernelSpec", "RECORD_SIZES"]

RECORD_SIZES = (8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class BatchKernelSpec:
    kernel_id: str
    func: Callable[[Any, np.ndarray], Any]
    in_dtype: np.dtype
    out_dtype: np.dtype
    state: Any = None
    queue_size: int = 4096
    backpressure: str = "block"
    block_timeout: float = 1.0
    priority_lanes: int = 1
    max_batch: int = 1024

    def __post_init__(self) -> None:
        if self.backpressure not in BACKPRESSURE:
            raise ValueError(f"backpressure must be one of {BACKPRESSURE}")
        if self.max_batch < 1 or self.queue_size < 1:
            raise ValueError("queue_size and max_batch must be >= 1")
        for d in (self.in_dtype, self.out_dtype):
            if d.hasobject:
                raise TypeError(f"kernel '{self.kernel_id}': dtype {d} holds Python objects")
            if d.itemsize == 0:
                raise ValueError(f"kernel '{self.kernel_id}': dtype {d} has no bytes")
        _ = self.record

    @property
    def record(self) -> int:
        need = max(self.in_dtype.itemsize, self.out_dtype.itemsize)
        for s in RECORD_SIZES:
            if s >= need:
                return s
        raise ValueError(
            f"kernel '{self.kernel_id}': records of {need} bytes exceed {RECORD_SIZES[-1]}"
        )


def batch_kernel(
    func: Optional[Callable[..., Any]] = None,
    *,
    kernel_id: Optional[str] = None,
    in_dtype: Any,
    out_dtype: Any = None,
    state: Any = None,
    queue_size: int = 4096,
    backpressure: str = "block",
    block_timeout: float = 1.0,
    max_batch: int = 1024,
    numba: Any = None,
    **unknown: Any,
) -> Any:
    """Declares ``def handle(state, batch) -> out`` as a batch kernel: ``batch`` is a numpy
    array of ``in_dtype`` records, ``out`` an array (or anything ``np.asarray`` turns into one)
    of ``out_dtype`` records (default: ``in_dtype``). ``state`` (e.g. a numpy array) is the
    kernel's state, passed to every call; the kernel keeps it for its whole life.

    ``numba=f`` (or ``numba=True`` over ``f``) runs ``f(state, inp, out, env) -> bool`` over
    each message instead, compiled by ``numba.njit`` on its first batch, on the host as every
    batch kernel (``resident.numba_handlers``; ``@device_kernel(numba=f)`` runs it on the
    device); ``state`` is then None or one record of a structured dtype.
    Any other keyword argument raises ``UnknownArgumentError`` naming the closest known one."""
    reject_unknown(
        "@batch_kernel",
        unknown,
        ("kernel_id", "in_dtype", "out_dtype", "state", "queue_size", "backpressure",
         "block_timeout", "max_batch", "numba"),
    )
    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        func = f
        in_dt, out_dt, _ = kernel_dtypes(in_dtype, out_dtype)
        if numba is not None and numba is not False:
            st = None if state is None else np.asarray(state)
            func = NumbaHandler(
                f, kernel_id or f.__name__, "device", None if st is None else st.dtype,
                in_dt, out_dt,
            ).lazy_batch_runner()
        spec = BatchKernelSpec(
            kernel_id=kernel_id or f.__name__,
            func=func,
            in_dtype=in_dt,
            out_dtype=out_dt,
            state=state,
            queue_size=queue_size,
            backpressure=backpressure,
            block_timeout=block_timeout,
            max_batch=max_batch,
        )
        f._ring_kernel_spec = spec  # type: ignore[attr-defined]
        _registry[spec.kernel_id] = spec  # type: ignore[assignment]
        return f

    if func is not None:
        return wrap(func)
    if callable(numba) and numba is not True:
        return wrap(numba)
    return wrap


def to_records(arr: np.ndarray, record: int) -> np.ndarray:
    """The records of a 1-D array as a flat uint8 array, each padded to ``record`` bytes."""
    arr = np.ascontiguousarray(arr).reshape(-1)
    n, isz = len(arr), arr.dtype.itemsize
    if isz == record:
        return arr.view(np.uint8).reshape(-1)
    buf = np.zeros((n, record), np.uint8)
    if n:
        buf[:, :isz] = arr.view(np.uint8).reshape(n, isz)
    return buf.reshape(-1)


def from_records(raw: np.ndarray, record: int, dtype: np.dtype) -> np.ndarray:
    n = len(raw) // record
    isz = dtype.itemsize
    if n == 0:
        return np.zeros(0, dtype)
    return np.ascontiguousarray(raw.reshape(n, record)[:, :isz]).view(dtype).reshape(n)


def output_view(out: Any, dtype: np.dtype, kernel_id: str) -> np.ndarray:
    """A writable 1-D numpy view (no copy) of ``out``, a caller's array of ``dtype`` records
    (numpy, or any DLPack array of host memory), for ``receive_batch(out=...)``."""
    from .dlpack import as_host_array
    from .errors import DtypeLayoutError

    view = as_host_array(out, f"kernel '{kernel_id}': receive_batch(out=...)")
    if not isinstance(view, np.ndarray):
        raise TypeError(
            f"kernel '{kernel_id}': receive_batch(out=...) takes a numpy array or a DLPack "
            f"array of host memory, got {type(out).__name__}"
        )
    if view.ndim != 1:
        raise ValueError(f"kernel '{kernel_id}': receive_batch(out=...) takes a 1-D array, got shape {view.shape}")
    if not view.flags.writeable:
        raise ValueError(f"kernel '{kernel_id}': receive_batch(out=...) got a read-only array")
    same = view.dtype == dtype if dtype.fields is None else (
        view.dtype.fields is not None and _layout_diff(view.dtype, dtype) is None
    )
    if not same:
        raise DtypeLayoutError(
            f"kernel '{kernel_id}': receive_batch(out=...) got an array of {view.dtype}, the "
            f"kernel's outputs are {dtype}",
            kernel_id,
        )
    return view


def into_records(raw: np.ndarray, record: int, dtype: np.dtype, dst: np.ndarray) -> int:
    """Writes the whole records of ``raw`` into ``dst``'s first rows (one copy); returns how
    many."""
    n = len(raw) // record
    if n:
        dst[:n] = raw.reshape(n, record)[:, : dtype.itemsize].view(dtype)[:, 0]
    return n


def _run_batch(spec: BatchKernelSpec, func: Any, state: Any, raw: np.ndarray, n: int) -> np.ndarray:
    """Runs on the kernel's thread for each drained batch."""
    batch = from_records(raw, spec.record, spec.in_dtype)
    out = func(state, batch)
    out = np.asarray(out, dtype=spec.out_dtype).reshape(-1)
    return to_records(out, spec.record)


def runner(spec: BatchKernelSpec) -> Callable[..., Any]:
    return functools.partial(_run_batch, spec)


def _layout_diff(got: np.dtype, want: np.dtype) -> Optional[str]:
    """The first difference between two structured dtypes (names, order, types, offsets,
    size), or None when they lay records out the same way."""
    gf, wf = got.fields or {}, want.fields or {}
    gn = sorted(gf, key=lambda n: gf[n][1])
    wn = sorted(wf, key=lambda n: wf[n][1])
    if gn != wn:
        return f"its fields are {gn}, the kernel's are {wn} (names and order must match)"
    for n in wn:
        (gt, go), (wt, wo) = gf[n][:2], wf[n][:2]
        if gt != wt:
            return f"field '{n}' is {gt}, the kernel's is {wt}"
        if go != wo:
            return f"field '{n}' lies at byte {go}, the kernel's at byte {wo}"
    if got.itemsize != want.itemsize:
        return f"its records are {got.itemsize} bytes, the kernel's {want.itemsize}"
    return None


def checked_records(records: Any, dtype: np.dtype, kernel_id: str) -> np.ndarray:
    """``records`` as a 1-D array of ``dtype``, refusing what would be converted by position
    or broadcast: a structured array must have ``dtype``'s layout (its fields by name, type,
    order and offset), a sequence must hold one tuple per record; an array of a plain
    (unstructured) ``dtype`` may be of any type numpy casts to it safely or within its kind."""
    from .dlpack import as_host_array
    from .errors import DtypeLayoutError

    # Any DLPack array of host memory is read in place (np.from_dlpack, no copy).
    records = as_host_array(records, f"kernel '{kernel_id}': send_batch")
    if not isinstance(records, np.ndarray) and (
        records is None or isinstance(records, (int, float, complex, bool)) or not hasattr(records, "__iter__")
    ):
        raise DtypeLayoutError(
            f"kernel '{kernel_id}': send_batch takes an array of {dtype} records, got "
            f"{type(records).__name__}",
            kernel_id,
        )
    if not isinstance(records, np.ndarray):
        if dtype.fields is not None:
            seq = list(records)
            bad = next(
                (r for r in seq if not isinstance(r, (tuple, np.void)) or len(r) != len(dtype.fields)),
                None,
            )
            if bad is not None:
                raise DtypeLayoutError(
                    f"kernel '{kernel_id}': send_batch takes records of {dtype} (a structured "
                    f"array, or tuples of {len(dtype.fields)} values in field order), got "
                    f"{bad!r}",
                    kernel_id,
                )
            try:
                return np.array(seq, dtype=dtype).reshape(-1)
            except (TypeError, ValueError, OverflowError) as e:
                raise DtypeLayoutError(
                    f"kernel '{kernel_id}': send_batch got tuples that are not records of "
                    f"{dtype}: {e}",
                    kernel_id,
                ) from None
        try:
            records = np.asarray(records)
        except (TypeError, ValueError) as e:
            raise DtypeLayoutError(
                f"kernel '{kernel_id}': send_batch got {type(records).__name__}, not an array "
                f"of {dtype} records: {e}",
                kernel_id,
            ) from None
    if dtype.subdtype is None and records.ndim != 1:
        raise DtypeLayoutError(
            f"kernel '{kernel_id}': send_batch takes a 1-D array of records, got shape "
            f"{records.shape} (reshape it yourself if its records are in C order)",
            kernel_id,
        )
    if dtype.fields is None:
        if records.dtype.fields is not None or not np.can_cast(records.dtype, dtype, "same_kind"):
            raise DtypeLayoutError(
                f"kernel '{kernel_id}': send_batch got an array of {records.dtype}, the kernel "
                f"takes {dtype}",
                kernel_id,
            )
        return np.ascontiguousarray(records, dtype=dtype).reshape(-1)
    if records.dtype.fields is None:
        raise DtypeLayoutError(
            f"kernel '{kernel_id}': send_batch got an array of {records.dtype}, the kernel "
            f"takes records of {dtype}: build them with np.zeros(n, in_dtype) and fill each "
            f"field (a plain array would be copied into every field)",
            kernel_id,
        )
    diff = _layout_diff(records.dtype, dtype)
    if diff is not None:
        raise DtypeLayoutError(
            f"kernel '{kernel_id}': send_batch got records of {records.dtype}, not the "
            f"kernel's {dtype}: {diff}",
            kernel_id,
            None,
        )
    return np.ascontiguousarray(records).reshape(-1)

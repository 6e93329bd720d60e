"""``UnifiedBuffer`` (host and device copies, moved only when the other side is newer) and a
memory pool of them, over the engine's ``UnifiedBuffer``."""

from __future__ import annotations

import contextlib
import enum
import math
import itertools
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

import resident._resident as _resident
from . import dlpack as _dlpack
from .errors import BufferStateError

__all__ = [
    "BufferState",
    "UnifiedBuffer",
    "DevicePointer",
    "MemoryPool",
    "PoolStatistics",
    "get_memory_pool",
]

Shape = Union[int, Tuple[int, ...]]


class BufferState(enum.Enum):
    """Which copy is current (the engine's ``BufferState``)."""

    UNINITIALIZED = "uninitialized"
    HOST_ONLY = "host_only"
    DEVICE_ONLY = "device_only"
    SYNCHRONIZED = "synchronized"
    HOST_DIRTY = "host_dirty"
    DEVICE_DIRTY = "device_dirty"


@dataclass(frozen=True)
class DevicePointer:
    """The device copy of a buffer: its address and size (host memory on the CPU backend)."""

    address: int
    nbytes: int
    backend: str


def _shape(shape: Shape) -> Tuple[int, ...]:
    t = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
    if any(s < 0 for s in t):
        raise ValueError(f"shape must not have negative sizes, got {shape!r}")
    return t


@_dlpack.register_host_view
class UnifiedBuffer:
    """``shape`` values of ``dtype`` (any numpy dtype, structured ones included) with a host
    and a device copy. ``pinned=True`` puts the host copy in pinned, device-mapped memory on
    CUDA. ``backend`` picks the device (``"auto"``: CUDA, else a hardware wgpu adapter, else
    the CPU, where host and device copy are one memory).

    ``.host`` is a numpy view of the host copy (no copy): reading it copies the device copy
    back first when that one is newer, and since the view is writable it marks the host copy
    newer, so the next ``sync_to_device()`` (or ``.device``) copies it over.

    The buffer is a DLPack producer of its host copy (``np.from_dlpack(buf)``,
    ``torch.from_dlpack(buf)``: the same memory, no copy; an export marks the host copy newer
    as ``.host`` does), and ``device_view()`` of its device copy (CUDA: ``kDLCUDA`` and
    ``__cuda_array_interface__``). Structured dtypes cannot cross DLPack
    (``DLPackDtypeError``). An export keeps the buffer's memory alive until its consumer is
    done; a pool refuses to take the buffer back while one lives.
    """

    def __init__(
        self,
        shape: Shape,
        dtype: Any = np.float32,
        pinned: bool = False,
        *,
        backend: str = "auto",
        _raw: Any = None,
    ) -> None:
        self._shape = _shape(shape)
        self._dtype = np.dtype(dtype)
        nbytes = math.prod(self._shape) * self._dtype.itemsize
        if _raw is None:
            _raw = _resident.Buffer(nbytes, pinned, backend)
        elif _raw.nbytes < nbytes:
            raise ValueError("pooled buffer too small")  # pragma: no cover - pool bug
        self._raw = _raw
        self._nbytes = nbytes
        self._released = False
        # Device views handed out (a CUDA array interface consumer holds its view).
        self._views: "weakref.WeakSet[_dlpack.DeviceView]" = weakref.WeakSet()

    def _b(self) -> Any:
        if self._released:
            raise ValueError("this buffer was released to its pool; acquire a new one")
        return self._raw

    @property
    def shape(self) -> Tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def size(self) -> int:
        return math.prod(self._shape)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def pinned(self) -> bool:
        return self._b().pinned

    @property
    def backend(self) -> str:
        return self._b().backend

    @property
    def state(self) -> BufferState:
        return BufferState(self._b().state)

    @property
    def transfers(self) -> Dict[str, int]:
        """Copies made so far: ``to_device``, ``to_host`` and their bytes."""
        a, b, c, d = self._b().transfers
        return {"to_device": a, "to_host": b, "to_device_bytes": c, "to_host_bytes": d}

    @property
    def host(self) -> np.ndarray:
        raw = self._b()
        if self._nbytes == 0:
            return np.zeros(self._shape, self._dtype)
        return raw.host_view()[: self._nbytes].view(self._dtype).reshape(self._shape)

    @property
    def device(self) -> DevicePointer:
        """Makes the device copy current and returns where it is."""
        raw = self._b()
        return DevicePointer(raw.device_address(), self._nbytes, raw.backend)

    def mark_device_dirty(self) -> None:
        """Declares that a device kernel wrote the device copy."""
        self._b().mark_device_dirty()

    def sync_to_device(self) -> None:
        """Copies the host copy over when it is newer (no-op when the device is current);
        ``BufferStateError`` on a buffer never written."""
        self._b().sync_to_device()

    def sync_to_host(self) -> None:
        """Copies the device copy back when it is newer."""
        self._b().sync_to_host()

    def mark_host_dirty(self) -> None:
        """Declares that the host copy was written through a view or export taken earlier
        (so the next ``sync_to_device()`` copies it over). When the device copy is marked newer
        too (both sides written), it is copied back first: the device's values win."""
        self._b().mark_host_dirty()

    def device_view(self) -> "_dlpack.DeviceView":
        """The device copy as an array other libraries take without a copy (DLPack
        ``kDLCUDA`` and ``__cuda_array_interface__`` on CUDA, ``kDLCPU`` on the CPU backend,
        where it is the host memory; ``DLPackError`` on wgpu and CudaSim). Taking it makes the
        device copy current and marks it newer (the consumer may write it)."""
        v = _dlpack.DeviceView(self)
        self._views.add(v)
        return v

    @property
    def dlpack_exports(self) -> int:
        """DLPack exports of this buffer (host or device) whose consumer is not done, plus
        live ``device_view()`` objects."""
        return self._b().exports + len(self._views)

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (_dlpack.KDL_CPU, 0)

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Any = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule of the host copy (the array API standard's protocol): no copy
        unless ``copy=True``. The device copy is copied back first when it is newer, and the
        host copy is marked newer. ``stream`` must be None (host memory); ``dl_device`` other
        than ``(1, 0)`` raises ``DLPackError`` (use ``device_view()``)."""
        raw = self._b()
        dl = _dlpack.dl_dtype(self._dtype)
        _dlpack.check_request((_dlpack.KDL_CPU, 0), stream, dl_device, "the host copy")
        versioned = _dlpack._versioned(max_version)
        if copy or self._nbytes == 0:
            c = np.array(self.host, copy=True)
            return c.__dlpack__(max_version=max_version) if versioned else c.__dlpack__()
        return raw.dlpack(list(self._shape), dl, False, versioned)

    def copy_from(self, data: Any) -> None:
        data = _dlpack.as_host_array(data, "copy_from")
        self.host[...] = np.asarray(data, dtype=self._dtype).reshape(self._shape)

    def copy_to(self, out: np.ndarray) -> None:
        out[...] = self.host

    def __len__(self) -> int:
        return self._shape[0] if self._shape else 1

    def __repr__(self) -> str:
        s = "released" if self._released else self.state.value
        return f"UnifiedBuffer(shape={self._shape}, dtype={self._dtype}, state={s})"


@dataclass(frozen=True)
class PoolStatistics:
    """A pool's counters (the engine pool's: bytes counted by size class)."""

    hits: int
    misses: int
    live_bytes: int
    pooled_bytes: int
    high_water_bytes: int
    live_buffers: int
    pooled_buffers: int

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0


class MemoryPool:
    """Recycles ``UnifiedBuffer`` memory by size class (a power of two, at least 256 bytes,
    as the engine's pool): ``release`` returns a buffer's memory to the pool, not to the
    system, and ``acquire`` of the same class reuses it (its contents are what the last user
    left). A released buffer object refuses further use; releasing twice, or releasing a
    buffer the pool did not hand out, raises ``ValueError``. ``limit_bytes`` caps the idle
    memory kept. The pool tracks the buffers it handed out by weak reference: one garbage
    collected without ``release`` is no longer counted live (its memory is freed with it, not
    pooled: a numpy view of it may still be in use)."""

    def __init__(self, backend: str = "auto", limit_bytes: Optional[int] = None) -> None:
        self._backend = backend
        self._limit = limit_bytes
        self._lock = threading.Lock()
        self._idle: Dict[Tuple[int, bool], List[Any]] = {}
        self._live: Dict[int, int] = {}  # the buffer's pool token -> size class
        self._tokens = itertools.count()
        self._hits = self._misses = 0
        self._live_bytes = self._pooled_bytes = self._high = 0

    def acquire(self, shape: Shape, dtype: Any = np.float32, pinned: bool = False) -> UnifiedBuffer:
        shp, dt = _shape(shape), np.dtype(dtype)
        nbytes = math.prod(shp) * dt.itemsize
        cls = _resident.size_class(nbytes)
        with self._lock:
            idle = self._idle.get((cls, pinned))
            raw = idle.pop() if idle else None
            if raw is not None:
                self._hits += 1
                self._pooled_bytes -= cls
            else:
                self._misses += 1
            self._live_bytes += cls
            self._high = max(self._high, self._live_bytes + self._pooled_bytes)
        if raw is None:
            raw = _resident.Buffer(cls, pinned, self._backend)
        buf = UnifiedBuffer(shp, dt, pinned, _raw=raw)
        token = next(self._tokens)
        with self._lock:
            self._live[token] = cls
        buf._pool_token = token  # type: ignore[attr-defined]
        weakref.finalize(buf, _collected, weakref.ref(self), token)
        return buf

    def _forget_collected(self, token: int) -> None:
        with self._lock:
            cls = self._live.pop(token, None)
            if cls is not None:
                self._live_bytes -= cls

    def release(self, buf: UnifiedBuffer) -> None:
        """Returns the buffer's memory to the pool. ``BufferStateError`` (the buffer stays
        live) while a DLPack export of it or a ``device_view()`` lives: the next user of the
        memory would share it with that consumer."""
        with self._lock:
            token = getattr(buf, "_pool_token", -1)
            if token not in self._live or buf._released:
                raise ValueError("buffer was not acquired from this pool or was already released")
            n = buf.dlpack_exports
            if n:
                raise BufferStateError(
                    f"{n} DLPack export(s) or device view(s) of this buffer are alive: delete "
                    f"them (and the arrays made from them) before releasing it to the pool"
                )
            cls = self._live.pop(token)
            buf._released = True
            self._live_bytes -= cls
            if self._limit is not None and self._pooled_bytes + cls > self._limit:
                return  # over the limit: freed
            self._idle.setdefault((cls, bool(buf._raw.pinned)), []).append(buf._raw)
            self._pooled_bytes += cls

    @contextlib.contextmanager
    def buffer(self, shape: Shape, dtype: Any = np.float32, pinned: bool = False) -> Iterator[UnifiedBuffer]:
        """``with pool.buffer((n,), np.float32) as buf: ...`` releases on exit."""
        b = self.acquire(shape, dtype, pinned)
        try:
            yield b
        finally:
            self.release(b)

    def stats(self) -> PoolStatistics:
        with self._lock:
            return PoolStatistics(
                self._hits,
                self._misses,
                self._live_bytes,
                self._pooled_bytes,
                self._high,
                len(self._live),
                sum(len(v) for v in self._idle.values()),
            )

    get_stats = stats

    def free_all_blocks(self) -> int:
        """Frees the idle memory; returns the bytes freed."""
        with self._lock:
            n = self._pooled_bytes
            self._idle.clear()
            self._pooled_bytes = 0
            return n

    trim = free_all_blocks


def _collected(pool_ref: "weakref.ref[MemoryPool]", token: int) -> None:
    """A buffer the pool handed out was garbage collected (released or not)."""
    pool = pool_ref()
    if pool is not None:
        pool._forget_collected(token)


_pool: Optional[MemoryPool] = None
_pool_lock = threading.Lock()


def get_memory_pool() -> MemoryPool:
    """The process-wide pool (on the ``auto`` backend)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = MemoryPool()
        return _pool

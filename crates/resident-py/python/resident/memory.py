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
from .errors import BufferNotAllocatedError, BufferStateError
from .runtime import _in_thread

__all__ = [
    "BufferState",
    "UnifiedBuffer",
    "DevicePointer",
    "MemoryPool",
    "PoolStatistics",
    "get_memory_pool",
    "configure_memory_pool",
]

Shape = Union[int, Tuple[int, ...]]
# Serializes buffers' lazy allocation (rare: once per buffer).
_alloc_lock = threading.Lock()


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

    The memory is allocated lazily: by ``allocate()`` or by the first use that needs it
    (``.host``, ``.device``, a sync, ``copy_from``, ...); ``is_allocated`` says whether it is.
    ``free()`` releases it (the state goes back to ``UNINITIALIZED``; a later use allocates
    anew, zeroed). The backend is opened, and checked, at construction.

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
            # Opens the device (once per backend), so a bad or absent backend fails here.
            self._kind = _resident.device_of(backend)[0]
        elif _raw.nbytes < nbytes:
            raise ValueError("pooled buffer too small")  # pragma: no cover - pool bug
        else:
            self._kind = _raw.backend
        self._mem = _raw
        self._backend_name = backend
        self._pinned = bool(pinned)
        self._nbytes = nbytes
        self._released = False
        # Device views handed out (a CUDA array interface consumer holds its view).
        self._views: "weakref.WeakSet[_dlpack.DeviceView]" = weakref.WeakSet()

    @property
    def _raw(self) -> Any:
        """The engine's buffer, allocated on first use (once, if threads race to it)."""
        mem = self._mem
        if mem is None:
            with _alloc_lock:
                if self._mem is None:
                    self._mem = _resident.Buffer(self._nbytes, self._pinned, self._backend_name)
                mem = self._mem
        return mem

    def _b(self) -> Any:
        if self._released:
            raise BufferNotAllocatedError("this buffer was released to its pool; acquire a new one")
        return self._raw

    @property
    def is_allocated(self) -> bool:
        """Whether the buffer holds memory now (see ``allocate`` and ``free``)."""
        return self._mem is not None and not self._released

    def allocate(self, *, host: bool = True, device: bool = True) -> "UnifiedBuffer":
        """Allocates the memory now if it is not yet (both copies: ``host`` and ``device``
        are accepted for PyDotCompute and change nothing). Returns the buffer."""
        self._b()
        return self

    def free(self) -> None:
        """Releases the memory (DLPack exports alive keep theirs until their consumer is
        done); the buffer is ``UNINITIALIZED`` again and a later use allocates anew. A
        buffer from a ``MemoryPool`` goes back with ``pool.release(buf)`` instead
        (``BufferStateError`` here)."""
        if getattr(self, "_pool_token", None) is not None:
            raise BufferStateError(
                "this buffer belongs to a MemoryPool: give it back with pool.release(buf)"
            )
        self._views = weakref.WeakSet()
        self._mem = None

    def zeros(self) -> "UnifiedBuffer":
        """Sets every value to zero (on the host copy, marked newer). Returns the buffer."""
        return self.fill(0)

    def fill(self, value: Any) -> "UnifiedBuffer":
        """Sets every value to ``value`` (on the host copy, marked newer). Returns the
        buffer."""
        self.host[...] = value
        return self

    async def ensure_on_device(self) -> None:
        """Awaits ``sync_to_device()`` when the host copy is newer (the copy runs on a thread
        of its own; the loop goes on)."""
        if self.state in (BufferState.HOST_DIRTY, BufferState.HOST_ONLY):
            await _in_thread(self.sync_to_device)

    async def ensure_on_host(self) -> None:
        """Awaits ``sync_to_host()`` when the device copy is newer (on a thread of its own)."""
        if self.state in (BufferState.DEVICE_DIRTY, BufferState.DEVICE_ONLY):
            await _in_thread(self.sync_to_host)

    def synchronize(self) -> None:
        """Makes both copies equal: copies the newer (or only) one over the other; nothing
        when they are equal or the buffer was never written."""
        st = self.state
        if st in (BufferState.HOST_DIRTY, BufferState.HOST_ONLY):
            self.sync_to_device()
        elif st in (BufferState.DEVICE_DIRTY, BufferState.DEVICE_ONLY):
            self.sync_to_host()

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
        if self._mem is None and not self._released:
            return self._pinned
        return self._b().pinned

    @property
    def backend(self) -> str:
        if self._mem is None and not self._released:
            return self._kind
        return self._b().backend

    @property
    def state(self) -> BufferState:
        if self._mem is None and not self._released:
            return BufferState.UNINITIALIZED
        return BufferState(self._b().state)

    @property
    def transfers(self) -> Dict[str, int]:
        """Copies made so far: ``to_device``, ``to_host`` and their bytes."""
        if self._mem is None and not self._released:
            return {"to_device": 0, "to_host": 0, "to_device_bytes": 0, "to_host_bytes": 0}
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
        if self._mem is None and not self._released:
            return len(self._views)
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
    """A pool's counters (the engine pool's: bytes counted by size class). PyDotCompute's
    names are read from them: ``used_bytes`` (held by buffers handed out), ``total_bytes``
    (handed out plus kept idle), ``n_free_blocks`` (idle buffers kept), ``free_bytes``,
    ``utilization``, ``used_mb``, ``total_mb``."""

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

    @property
    def used_bytes(self) -> int:
        return self.live_bytes

    @property
    def total_bytes(self) -> int:
        return self.live_bytes + self.pooled_bytes

    @property
    def n_free_blocks(self) -> int:
        return self.pooled_buffers

    @property
    def free_bytes(self) -> int:
        return self.pooled_bytes

    @property
    def utilization(self) -> float:
        """``used_bytes / total_bytes`` (0.0 for an empty pool)."""
        t = self.total_bytes
        return self.used_bytes / t if t else 0.0

    @property
    def used_mb(self) -> float:
        return self.used_bytes / (1 << 20)

    @property
    def total_mb(self) -> float:
        return self.total_bytes / (1 << 20)


class _Counts:
    """One kind of memory's counters (pinned or not)."""

    __slots__ = ("hits", "misses", "live_bytes", "pooled_bytes", "high", "live")

    def __init__(self) -> None:
        self.hits = self.misses = self.live_bytes = self.pooled_bytes = self.high = 0
        self.live = 0


class MemoryPool:
    """Recycles ``UnifiedBuffer`` memory by size class (a power of two, at least 256 bytes,
    as the engine's pool): ``release`` returns a buffer's memory to the pool, not to the
    system, and ``acquire`` of the same class reuses it (its contents are what the last user
    left). A released buffer object refuses further use; releasing twice, or releasing a
    buffer the pool did not hand out, raises ``ValueError``. ``limit_bytes`` caps the idle
    memory kept (``set_limit`` changes it). The pool tracks the buffers it handed out by weak
    reference: one garbage collected without ``release`` is no longer counted live (its
    memory is freed with it, not pooled: a numpy view of it may still be in use).

    A pool is enabled when made; ``disable()`` makes it a plain allocator (``acquire``
    allocates, ``release`` frees; the idle memory is freed), ``enable()`` turns the
    recycling back on. ``get_memory_pool()`` is the process-wide one."""

    def __init__(self, backend: str = "auto", limit_bytes: Optional[int] = None) -> None:
        self._backend = backend
        self._limit = _check_limit(limit_bytes)
        self._lock = threading.Lock()
        self._idle: Dict[Tuple[int, bool], List[Any]] = {}
        self._live: Dict[int, Tuple[int, bool]] = {}  # the buffer's pool token -> (class, pinned)
        self._tokens = itertools.count()
        self._c = {False: _Counts(), True: _Counts()}
        self._enabled = True

    @property
    def enabled(self) -> bool:
        """Whether released memory is kept for reuse."""
        return self._enabled

    def enable(self) -> None:
        """Keeps released memory for reuse again (the default)."""
        self._enabled = True

    def disable(self) -> None:
        """Stops keeping released memory (and frees what is idle now): ``acquire``
        allocates, ``release`` frees. Buffers handed out stay valid and counted."""
        self._enabled = False
        self.free_all_blocks()

    def set_limit(self, size_mb: Optional[float]) -> None:
        """Caps the idle memory kept at ``size_mb`` MiB (None: no cap); idle memory beyond
        the new cap is freed now."""
        limit = None if size_mb is None else _check_limit(int(_mb(size_mb) * (1 << 20)))
        with self._lock:
            self._limit = limit
            self._trim(limit)

    @property
    def limit_bytes(self) -> Optional[int]:
        return self._limit

    def _trim(self, limit: Optional[int]) -> None:
        """Frees idle memory, largest classes first, until it is within ``limit`` (lock held)."""
        if limit is None:
            return
        for key in sorted(self._idle, reverse=True):
            idle = self._idle[key]
            while idle and self._pooled() > limit:
                idle.pop()
                self._c[key[1]].pooled_bytes -= key[0]
        self._idle = {k: v for k, v in self._idle.items() if v}

    def _pooled(self) -> int:
        return self._c[False].pooled_bytes + self._c[True].pooled_bytes

    def acquire(self, shape: Shape, dtype: Any = np.float32, pinned: bool = False) -> UnifiedBuffer:
        shp, dt = _shape(shape), np.dtype(dtype)
        pinned = bool(pinned)
        nbytes = math.prod(shp) * dt.itemsize
        cls = _resident.size_class(nbytes)
        with self._lock:
            c = self._c[pinned]
            idle = self._idle.get((cls, pinned))
            raw = idle.pop() if idle else None
            if raw is not None:
                c.hits += 1
                c.pooled_bytes -= cls
            else:
                c.misses += 1
            c.live_bytes += cls
            c.high = max(c.high, c.live_bytes + c.pooled_bytes)
        if raw is None:
            raw = _resident.Buffer(cls, pinned, self._backend)
        buf = UnifiedBuffer(shp, dt, pinned, _raw=raw)
        token = next(self._tokens)
        with self._lock:
            self._live[token] = (cls, pinned)
            self._c[pinned].live += 1
        buf._pool_token = token  # type: ignore[attr-defined]
        weakref.finalize(buf, _collected, weakref.ref(self), token)
        return buf

    def _forget_collected(self, token: int) -> None:
        with self._lock:
            got = self._live.pop(token, None)
            if got is not None:
                c = self._c[got[1]]
                c.live_bytes -= got[0]
                c.live -= 1

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
            cls, pinned = self._live.pop(token)
            c = self._c[pinned]
            buf._released = True
            c.live_bytes -= cls
            c.live -= 1
            if not self._enabled:
                return  # a plain allocator: freed
            if self._limit is not None and self._pooled() + cls > self._limit:
                return  # over the limit: freed
            self._idle.setdefault((cls, pinned), []).append(buf._raw)
            c.pooled_bytes += cls

    @contextlib.contextmanager
    def buffer(self, shape: Shape, dtype: Any = np.float32, pinned: bool = False) -> Iterator[UnifiedBuffer]:
        """``with pool.buffer((n,), np.float32) as buf: ...`` releases on exit."""
        b = self.acquire(shape, dtype, pinned)
        try:
            yield b
        finally:
            self.release(b)

    def _stats(self, kinds: Tuple[bool, ...]) -> PoolStatistics:
        with self._lock:
            cs = [self._c[k] for k in kinds]
            return PoolStatistics(
                sum(c.hits for c in cs),
                sum(c.misses for c in cs),
                sum(c.live_bytes for c in cs),
                sum(c.pooled_bytes for c in cs),
                sum(c.high for c in cs),
                sum(c.live for c in cs),
                sum(len(v) for (_, p), v in self._idle.items() if p in kinds),
            )

    def stats(self) -> PoolStatistics:
        """Every buffer's counters, pinned or not (``high_water_bytes``: the sum of each
        kind's high water)."""
        return self._stats((False, True))

    get_stats = stats

    def get_pinned_stats(self) -> PoolStatistics:
        """The counters of the pinned buffers (``acquire(..., pinned=True)``) alone."""
        return self._stats((True,))

    def free_all_blocks(self) -> int:
        """Frees the idle memory; returns the bytes freed."""
        with self._lock:
            n = self._pooled()
            self._idle.clear()
            for c in self._c.values():
                c.pooled_bytes = 0
            return n

    trim = free_all_blocks

    def __repr__(self) -> str:
        st = self.stats()
        return (
            f"MemoryPool(backend={self._backend!r}, enabled={self._enabled}, "
            f"used={st.used_bytes} B, idle={st.pooled_bytes} B)"
        )


def _mb(size_mb: Any) -> float:
    if isinstance(size_mb, bool) or not isinstance(size_mb, (int, float)) or not size_mb >= 0:
        raise ValueError(f"size_mb must be a number >= 0 or None, got {size_mb!r}")
    return float(size_mb)


def _check_limit(limit_bytes: Optional[int]) -> Optional[int]:
    if limit_bytes is None:
        return None
    if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 0:
        raise ValueError(f"limit_bytes must be an int >= 0 or None, got {limit_bytes!r}")
    return limit_bytes


def _collected(pool_ref: "weakref.ref[MemoryPool]", token: int) -> None:
    """A buffer the pool handed out was garbage collected (released or not)."""
    pool = pool_ref()
    if pool is not None:
        pool._forget_collected(token)


_pool: Optional[MemoryPool] = None
_pool_lock = threading.Lock()


def get_memory_pool() -> MemoryPool:
    """The process-wide pool (on the ``auto`` backend): the same object every call."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = MemoryPool()
        return _pool


def configure_memory_pool(
    initial_size_mb: float = 0, max_size_mb: Optional[float] = None, enable: bool = True
) -> MemoryPool:
    """Configures the process-wide pool and returns it: ``max_size_mb`` caps its idle memory
    (``set_limit``; None leaves the cap as it is), ``enable`` enables or disables it.
    ``initial_size_mb`` (PyDotCompute's) must be 0: the pool allocates on demand and
    reserves nothing ahead."""
    if _mb(initial_size_mb) != 0:
        raise ValueError(
            "configure_memory_pool: initial_size_mb must be 0 (the pool reserves no memory "
            "ahead; it keeps what buffers release)"
        )
    pool = get_memory_pool()
    if max_size_mb is not None:
        pool.set_limit(max_size_mb)
    if enable:
        pool.enable()
    else:
        pool.disable()
    return pool

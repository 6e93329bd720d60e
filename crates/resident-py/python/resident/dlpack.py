"""Zero-copy arrays through DLPack and the CUDA array interface.

- ``UnifiedBuffer`` is a DLPack producer of its host copy (``np.from_dlpack(buf)``,
  ``torch.from_dlpack(buf)``), and ``buf.device_view()`` of its device copy (``kDLCUDA`` on the
  CUDA backend, with ``__cuda_array_interface__`` version 3).
- ``from_dlpack(x)`` wraps any DLPack producer (NumPy, CuPy, PyTorch, JAX, a ``UnifiedBuffer``)
  as a :class:`DLPackArray` without a copy; the wrapper keeps the producer alive.

The capsules are made and consumed in Rust (``src/dlpack.rs``): a capsule holds one reference
to the memory's owner, released by its deleter when the consumer is done. The lifetime rules
are in the Python guide ("Arrays from other libraries: DLPack").
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Tuple

import numpy as np

import resident._resident as _resident
from .errors import DLPackDtypeError, DLPackError

__all__ = ["DLPackArray", "DeviceView", "from_dlpack"]

# DLDeviceType values used here (dlpack.h).
KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
KDL_ROCM_HOST = 11
KDL_CUDA_MANAGED = 13
_DEVICE_NAMES = {
    1: "cpu",
    2: "cuda",
    3: "cuda pinned host",
    4: "opencl",
    7: "vulkan",
    8: "metal",
    9: "vpi",
    10: "rocm",
    11: "rocm pinned host",
    12: "ext_dev",
    13: "cuda managed",
    14: "oneapi",
    15: "webgpu",
    16: "hexagon",
}
# Memory the host can read and write, so a numpy view of it is valid.
HOST_ACCESSIBLE = (KDL_CPU, KDL_CUDA_HOST, KDL_ROCM_HOST, KDL_CUDA_MANAGED)

# DLDataTypeCode <-> numpy kind.
_CODE_OF_KIND = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_KIND_OF_CODE = {0: "i", 1: "u", 2: "f", 5: "c"}


def device_name(device_type: int) -> str:
    return _DEVICE_NAMES.get(int(device_type), f"device type {int(device_type)}")


def dl_dtype(dtype: Any) -> Tuple[int, int, int]:
    """The DLPack ``(code, bits, lanes)`` of a numpy dtype; ``DLPackDtypeError`` for one
    DLPack cannot describe."""
    dt = np.dtype(dtype)
    if dt.fields is not None or dt.subdtype is not None or dt.kind not in _CODE_OF_KIND:
        raise DLPackDtypeError(
            f"dtype {dt} cannot cross DLPack: it describes booleans, integers, floats and "
            f"complex numbers only (a structured dtype stays in resident: use .host, or a "
            f"plain array per field)"
        )
    if not dt.isnative:
        raise DLPackDtypeError(f"dtype {dt} is not in native byte order; DLPack has no byte order")
    if (dt.kind == "f" and dt.itemsize > 8) or (dt.kind == "c" and dt.itemsize > 16):
        raise DLPackDtypeError(f"dtype {dt} (long double) has no DLPack type other libraries read")
    return (_CODE_OF_KIND[dt.kind], dt.itemsize * 8, 1)


@functools.lru_cache(maxsize=64)
def np_dtype(code: int, bits: int, lanes: int) -> np.dtype:
    """The numpy dtype of a DLPack ``(code, bits, lanes)``; ``DLPackDtypeError`` when numpy
    has none."""
    if lanes != 1:
        raise DLPackDtypeError(f"DLPack vector type of {lanes} lanes has no numpy dtype")
    if code == 6 and bits == 8:
        return np.dtype(np.bool_)
    kind = _KIND_OF_CODE.get(code)
    if kind is None or bits == 0 or bits % 8:
        what = {3: "an opaque handle", 4: "bfloat16", 6: f"a {bits}-bit bool"}.get(
            code, f"type code {code} of {bits} bits"
        )
        raise DLPackDtypeError(f"DLPack dtype {what} has no numpy dtype")
    try:
        return np.dtype(f"{kind}{bits // 8}")
    except TypeError:
        raise DLPackDtypeError(f"DLPack dtype {kind}{bits} has no numpy dtype") from None


def _versioned(max_version: Optional[Tuple[int, int]]) -> bool:
    """Whether the consumer reads DLPack 1.0 capsules (``dltensor_versioned``)."""
    return max_version is not None and int(tuple(max_version)[0]) >= 1


def _device_tuple(d: Any) -> Tuple[int, int]:
    t = tuple(d)
    return (int(t[0]), int(t[1]))


def check_request(
    own: Tuple[int, int], stream: Any, dl_device: Any, what: str
) -> None:
    """Refuses, as the array API standard says (``BufferError``), a ``dl_device`` other than
    the array's own and a stream the device does not have."""
    if dl_device is not None and _device_tuple(dl_device) != own:
        raise DLPackError(
            f"{what} is on {device_name(own[0])}:{own[1]}, cannot export it to "
            f"{device_name(_device_tuple(dl_device)[0])}:{_device_tuple(dl_device)[1]}"
        )
    if own[0] == KDL_CUDA:
        if stream is not None and (not isinstance(stream, int) or stream == 0 or stream < -1):
            raise DLPackError(
                f"stream {stream!r}: a CUDA stream is None, -1, 1 (legacy default), 2 "
                f"(per-thread default) or a cudaStream_t as an int (0 is ambiguous)"
            )
    elif stream is not None and stream != -1:
        raise DLPackError(f"{what} is in host memory: stream must be None, got {stream!r}")


class DeviceView:
    """A ``UnifiedBuffer``'s device copy as an array other libraries take without a copy:
    ``torch.from_dlpack(view)``, ``cupy.from_dlpack(view)``, ``cupy.asarray(view)`` (through
    ``__cuda_array_interface__``, CUDA only). On the CPU backend the device copy is the host
    memory (``kDLCPU``).

    Each export (``__dlpack__``, reading ``__cuda_array_interface__``) first makes the device
    copy current (copies the host copy over when it is newer) and marks the device copy newer,
    as the consumer may write it; ``buf.host`` then copies it back. Every copy resident makes
    is finished when the call returns, so there is nothing to wait for on any stream:
    ``__cuda_array_interface__['stream']`` is None and ``__dlpack__(stream=...)`` accepts any
    allowed stream. Work another library queues on the memory is its own: synchronize it
    (``torch.cuda.synchronize()``) before ``buf.host`` or ``buf.sync_to_host()`` reads it.
    The view keeps the buffer alive; a pool refuses to take the buffer back while a view or
    an export lives."""

    __slots__ = ("_buf", "_raw", "_device", "__weakref__")

    def __init__(self, buf: Any) -> None:
        raw = buf._b()
        kind = raw.backend
        if kind == "cuda":
            device = (KDL_CUDA, int(raw.ordinal))
        elif kind == "cpu":
            device = (KDL_CPU, 0)
        else:
            raise DLPackError(
                f"the device copy of a buffer on '{kind}' is not addressable by other libraries "
                f"(the device side is exported on cpu and cuda; use .host)"
            )
        self._buf = buf
        self._raw = raw
        self._device = device
        if buf.nbytes:
            raw.mark_device_dirty()

    @property
    def buffer(self) -> Any:
        return self._buf

    @property
    def shape(self) -> Tuple[int, ...]:
        return self._buf.shape

    @property
    def dtype(self) -> np.dtype:
        return self._buf.dtype

    @property
    def nbytes(self) -> int:
        return self._buf.nbytes

    @property
    def address(self) -> int:
        """The device copy's address (host memory on the CPU backend)."""
        return int(self._raw.device_address()) if self._buf.nbytes else 0

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self._device

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Any = None,
        copy: Optional[bool] = None,
    ) -> Any:
        self._buf._b()
        dl = dl_dtype(self.dtype)
        check_request(self._device, stream, dl_device, "this device view")
        if copy:
            raise DLPackError("resident does not copy device memory for an export: pass copy=None")
        if self._buf.nbytes == 0:
            if self._device[0] != KDL_CPU:
                raise DLPackError("an empty buffer has no device memory to export")
            return np.zeros(self.shape, self.dtype).__dlpack__()
        # The engine's copies are synchronous: nothing is pending on any stream.
        return self._raw.dlpack(list(self.shape), dl, True, _versioned(max_version))

    @property
    def __cuda_array_interface__(self) -> dict:
        """Version 3 of the CUDA array interface (CUDA backend only; AttributeError
        elsewhere, so ``hasattr`` tells)."""
        if self._device[0] != KDL_CUDA:
            raise AttributeError(
                f"__cuda_array_interface__: the buffer is on '{self._raw.backend}', not CUDA"
            )
        self._buf._b()
        self._raw.mark_device_dirty()
        dt = self.dtype
        return {
            "shape": tuple(self.shape),
            "typestr": dt.str,
            "descr": dt.descr,
            "data": (int(self._raw.device_address()), False),
            "strides": None,
            "version": 3,
            # Every copy resident made is finished: no stream to synchronize with.
            "stream": None,
        }

    def __repr__(self) -> str:
        return (
            f"DeviceView({device_name(self._device[0])}:{self._device[1]}, "
            f"shape={self.shape}, dtype={self.dtype})"
        )


class DLPackArray:
    """Another library's array held through DLPack, without a copy (``from_dlpack``). It keeps
    the producer object and its exported memory alive for as long as it lives; the producer's
    deleter runs when it (and every array made from it) is gone.

    ``host`` is a numpy view of the memory (host-accessible memory only; no copy), also what
    ``np.asarray`` returns; the object is itself a DLPack producer of the same memory (and, for
    a CUDA array, has ``__cuda_array_interface__``). Batch and device kernels take it where they
    take arrays (``send_batch``, a kernel's ``state``, ``receive_batch(out=...)``)."""

    __slots__ = ("_imp", "_producer", "_dtype", "_shape", "_strides", "_host", "__weakref__")

    def __init__(self, imp: Any, producer: Any = None) -> None:
        self._imp = imp
        self._producer = producer
        self._dtype = np_dtype(*imp.dtype)
        self._shape = tuple(int(s) for s in imp.shape)
        st = imp.strides
        isz = self._dtype.itemsize
        self._strides = None if st is None else tuple(int(s) * isz for s in st)
        self._host: Optional[np.ndarray] = None

    @property
    def shape(self) -> Tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self._shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.size * self._dtype.itemsize

    @property
    def strides(self) -> Optional[Tuple[int, ...]]:
        """In bytes, as numpy counts them; None when the producer gave none (C-contiguous)."""
        return self._strides

    @property
    def device(self) -> Tuple[int, int]:
        """``(DLDeviceType, device id)``: ``(1, 0)`` for host memory, ``(2, n)`` for CUDA n."""
        return tuple(self._imp.device)  # type: ignore[return-value]

    @property
    def address(self) -> int:
        """The first element's address (a device address for a CUDA array)."""
        return int(self._imp.data)

    @property
    def read_only(self) -> bool:
        return bool(self._imp.read_only)

    @property
    def producer(self) -> Any:
        """The object the array came from (kept alive by this one)."""
        return self._producer

    @property
    def host(self) -> np.ndarray:
        """A numpy view of the memory (no copy; read-only when the producer said so).
        ``DLPackError`` for device memory the host cannot reach."""
        if self._host is None:
            dev = self.device
            if dev[0] not in HOST_ACCESSIBLE:
                raise DLPackError(
                    f"the array is on {device_name(dev[0])}:{dev[1]}: the host cannot read it "
                    f"(copy it to the host with its library first: tensor.cpu(), cupy.asnumpy)"
                )
            self._host = np.from_dlpack(self)
        return self._host

    def numpy(self) -> np.ndarray:
        return self.host

    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray:
        h = self.host
        if dtype is not None and np.dtype(dtype) != h.dtype:
            if copy is False:
                raise ValueError(f"a {h.dtype} array cannot be read as {np.dtype(dtype)} without a copy")
            return h.astype(dtype)
        return np.array(h, copy=True) if copy else h

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self.device

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Any = None,
        copy: Optional[bool] = None,
    ) -> Any:
        check_request(self.device, stream, dl_device, "this array")
        versioned = _versioned(max_version)
        if copy:
            if self.device[0] not in HOST_ACCESSIBLE:
                raise DLPackError("resident does not copy device memory for an export: pass copy=None")
            c = np.array(self.host, copy=True)
            return c.__dlpack__(max_version=max_version) if versioned else c.__dlpack__()
        if self.read_only and not versioned:
            raise DLPackError(
                "the array is read-only and a legacy DLPack capsule cannot say so: the "
                "consumer must ask for DLPack >= 1.0 (max_version=(1, 0))"
            )
        return self._imp.export(versioned)

    @property
    def __cuda_array_interface__(self) -> dict:
        """Version 3, for a CUDA array (AttributeError otherwise). ``stream`` is 1: the
        producer ordered its work before the legacy default stream when it was imported."""
        dev = self.device
        if dev[0] != KDL_CUDA:
            raise AttributeError(f"__cuda_array_interface__: the array is on {device_name(dev[0])}")
        return {
            "shape": self._shape,
            "typestr": self._dtype.str,
            "descr": self._dtype.descr,
            "data": (self.address, self.read_only),
            "strides": self._strides,
            "version": 3,
            "stream": 1,
        }

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d array")
        return self._shape[0]

    def __repr__(self) -> str:
        dev = self.device
        return (
            f"DLPackArray({device_name(dev[0])}:{dev[1]}, shape={self._shape}, "
            f"dtype={self._dtype}, producer={type(self._producer).__name__})"
        )


def from_dlpack(x: Any, *, backend: str = "auto") -> DLPackArray:
    """Wraps a DLPack producer (a NumPy, CuPy, PyTorch or JAX array, a ``UnifiedBuffer``, ...)
    without a copy. Host memory (``kDLCPU``, pinned or managed CUDA memory) is accepted
    everywhere; a CUDA array (``kDLCUDA``) only when ``backend`` resolves to CUDA on the same
    device (``DLPackError`` otherwise), and it is asked to be ready on the legacy default
    stream (``stream=1``). The producer is asked for a DLPack 1.0 capsule and, if it does
    not take ``max_version``, for a legacy one."""
    if isinstance(x, DLPackArray):
        return x
    if not (hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")):
        raise TypeError(
            f"{type(x).__name__} is not a DLPack producer (it has no __dlpack__ and "
            f"__dlpack_device__); np.asarray it first"
        )
    dev = _device_tuple(x.__dlpack_device__())
    if dev[0] == KDL_CUDA:
        kind, ordinal = _resident.device_of(backend)
        if kind != "cuda":
            raise DLPackError(
                f"a CUDA array needs the CUDA backend; backend '{backend}' is '{kind}' here"
            )
        if dev[1] != ordinal:
            raise DLPackError(f"the array is on CUDA device {dev[1]}, resident on device {ordinal}")
        stream: Any = 1
    elif dev[0] in HOST_ACCESSIBLE:
        stream = None
    else:
        raise DLPackError(f"arrays on {device_name(dev[0])} are not supported (cpu and cuda are)")
    try:
        cap = x.__dlpack__(stream=stream, max_version=(1, 0))
    except TypeError:
        # A producer from before DLPack 1.0 (no max_version argument).
        cap = x.__dlpack__(stream=stream)
    return DLPackArray(_resident.DLPackImport(cap), x)


# Types whose ``.host`` is a numpy view of their host memory (structured records included,
# which DLPack cannot carry). ``memory.UnifiedBuffer`` registers itself: that module stands
# above this one.
_HOST_VIEWS: Tuple[type, ...] = ()


def register_host_view(cls: type) -> type:
    """Lets ``as_host_array`` take instances of ``cls`` by their ``.host`` view."""
    global _HOST_VIEWS
    if cls not in _HOST_VIEWS:
        _HOST_VIEWS = _HOST_VIEWS + (cls,)
    return cls


def as_host_array(x: Any, what: str) -> Any:
    """``x`` as a numpy array when it is a DLPack producer of host memory (no copy), a
    ``UnifiedBuffer`` (its host view) or a ``DLPackArray``; ``x`` itself otherwise.
    ``DLPackError`` for device memory (records cross the engine's queues in host memory)."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, DLPackArray):
        if x.device[0] not in HOST_ACCESSIBLE:
            raise _device_refusal(x.device, what)
        return x.host
    if isinstance(x, _HOST_VIEWS):
        return x.host
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        dev = _device_tuple(x.__dlpack_device__())
        if dev[0] not in HOST_ACCESSIBLE:
            raise _device_refusal(dev, what)
        return np.from_dlpack(x)
    return x


def _device_refusal(dev: Tuple[int, int], what: str) -> DLPackError:
    return DLPackError(
        f"{what}: the array is on {device_name(dev[0])}:{dev[1]}, and batch records cross the "
        f"engine's queues in host memory: copy it to the host first (tensor.cpu(), "
        f"cupy.asnumpy(a))"
    )

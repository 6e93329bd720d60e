"""DLPack and the CUDA array interface: UnifiedBuffer as a producer (host side, and the device
side through device_view()), resident.from_dlpack as a consumer, batch kernels taking and
filling DLPack arrays, lifetimes, refusals. Pointers are compared to show that no copy was
made. CuPy/PyTorch/JAX tests skip with their reason where the package or a GPU is missing."""

import asyncio
import ctypes
import gc
import tracemalloc
import weakref

import numpy as np
import pytest

import resident
from resident import _resident
from resident import BufferState, DLPackArray, MemoryPool, UnifiedBuffer

from conftest import fresh

# ---- helpers ---------------------------------------------------------------------------------

_name = ctypes.pythonapi.PyCapsule_GetName
_name.restype = ctypes.c_char_p
_name.argtypes = [ctypes.py_object]


def capsule_name(cap) -> str:
    return _name(cap).decode()


def addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class OnlyDLPack:
    """A producer that has nothing but the DLPack protocol (as a JAX or PyTorch array would
    be seen), over a numpy array; counts the calls."""

    def __init__(self, arr):
        self.arr = arr
        self.calls = 0

    def __dlpack__(self, **kw):
        self.calls += 1
        return self.arr.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


class LegacyOnly(OnlyDLPack):
    """A producer from before DLPack 1.0: no max_version argument."""

    def __dlpack__(self, stream=None):
        self.calls += 1
        return self.arr.__dlpack__(stream=stream)


def _cuda_ordinal():
    try:
        kind, ordinal = _resident.device_of("cuda")
    except Exception:
        return None
    return ordinal if kind == "cuda" else None


CUDA = _cuda_ordinal() is not None
try:
    import torch  # type: ignore
except Exception:  # pragma: no cover - absent here
    torch = None
try:
    import cupy  # type: ignore
except Exception:  # pragma: no cover - absent here
    cupy = None
try:
    import jax  # type: ignore
    import jax.numpy as jnp  # type: ignore
except Exception:  # pragma: no cover - absent here
    jax = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed here")
needs_cupy = pytest.mark.skipif(cupy is None, reason="CuPy is not installed here")
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device (resident's cuda backend) here")


# ---- UnifiedBuffer as a producer ---------------------------------------------------------------


def test_buffer_host_export_is_the_same_memory():
    buf = UnifiedBuffer((4, 3), np.float32, backend="cpu")
    buf.host[:] = np.arange(12, dtype=np.float32).reshape(4, 3)
    a = np.from_dlpack(buf)
    assert a.shape == (4, 3) and a.dtype == np.float32
    assert addr(a) == addr(buf.host)
    assert buf.__dlpack_device__() == (1, 0)
    a[1, 2] = 42.0  # written through the export, seen in buf.host
    assert buf.host[1, 2] == 42.0
    buf.host[0, 0] = -1.0  # and the other way round
    assert a[0, 0] == -1.0
    assert buf.state is BufferState.HOST_ONLY
    assert buf.dlpack_exports == 1
    del a
    gc.collect()
    assert buf.dlpack_exports == 0, "the consumer's deleter released the export once"


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint16, np.int32, np.int64, np.float16,
                                   np.float32, np.float64, np.complex64, np.complex128])
def test_buffer_exports_every_plain_dtype(dtype):
    buf = UnifiedBuffer((5,), dtype, backend="cpu")
    buf.host[:] = np.arange(5).astype(dtype)
    a = np.from_dlpack(buf)
    assert a.dtype == np.dtype(dtype) and addr(a) == addr(buf.host)
    np.testing.assert_array_equal(a, np.arange(5).astype(dtype))


def test_capsule_names_legacy_and_versioned():
    buf = UnifiedBuffer((8,), np.int32, backend="cpu")
    legacy = buf.__dlpack__()
    assert capsule_name(legacy) == "dltensor"
    versioned = buf.__dlpack__(max_version=(1, 0))
    assert capsule_name(versioned) == "dltensor_versioned"
    assert buf.dlpack_exports == 2
    imp = _resident.DLPackImport(legacy)
    assert capsule_name(legacy) == "used_dltensor", "a consumer renames the capsule"
    assert imp.data == addr(buf.host) and imp.shape == [8] and imp.dtype == (0, 32, 1)
    assert imp.device == (1, 0) and not imp.versioned
    imp2 = _resident.DLPackImport(versioned)
    assert capsule_name(versioned) == "used_dltensor_versioned" and imp2.versioned
    with pytest.raises(resident.DLPackError):
        _resident.DLPackImport(legacy)  # consumed once
    del legacy, versioned
    gc.collect()
    assert buf.dlpack_exports == 2, "a consumed capsule leaves the tensor to its consumer"
    del imp, imp2
    gc.collect()
    assert buf.dlpack_exports == 0


def test_unconsumed_capsule_frees_its_tensor():
    buf = UnifiedBuffer((8,), np.int32, backend="cpu")
    cap = buf.__dlpack__(max_version=(1, 0))
    assert buf.dlpack_exports == 1
    del cap
    gc.collect()
    assert buf.dlpack_exports == 0


def test_export_keeps_the_memory_alive_after_the_buffer_is_gone():
    buf = UnifiedBuffer((1000,), np.float64, backend="cpu")
    buf.host[:] = np.arange(1000.0)
    a = np.from_dlpack(buf)
    del buf
    gc.collect()
    np.testing.assert_array_equal(a, np.arange(1000.0))
    a[:] = 7.0  # still the buffer's memory, still writable
    assert a.sum() == 7000.0


def test_export_reads_back_a_newer_device_copy_first():
    buf = UnifiedBuffer((4,), np.float32, backend="cpu")
    buf.host[:] = 1.0
    buf.sync_to_device()
    buf.mark_device_dirty()
    assert buf.state is BufferState.DEVICE_DIRTY
    a = np.from_dlpack(buf)
    assert buf.state is BufferState.HOST_DIRTY, "an export marks the host copy newer, as .host does"
    np.testing.assert_array_equal(a, 1.0)
    buf.sync_to_device()
    a[:] = 2.0  # written after the sync: tell the buffer
    buf.mark_host_dirty()
    assert buf.state is BufferState.HOST_DIRTY


def test_copy_true_exports_a_copy():
    buf = UnifiedBuffer((4,), np.float32, backend="cpu")
    buf.host[:] = 3.0
    c = np.from_dlpack(buf, copy=True)
    assert addr(c) != addr(buf.host)
    np.testing.assert_array_equal(c, 3.0)
    c[:] = 0
    assert (buf.host == 3.0).all()


def test_empty_and_zero_dim_buffers():
    e = UnifiedBuffer((0,), np.float32, backend="cpu")
    assert np.from_dlpack(e).shape == (0,)
    s = UnifiedBuffer((), np.int64, backend="cpu")
    s.host[...] = 9
    z = np.from_dlpack(s)
    assert z.shape == () and int(z) == 9 and addr(z) == addr(s.host)


def test_bad_requests_are_typed():
    st = np.dtype([("id", "<u4"), ("x", "<f4")])
    sbuf = UnifiedBuffer((3,), st, backend="cpu")
    with pytest.raises(resident.DLPackDtypeError) as e:
        np.from_dlpack(sbuf)
    assert isinstance(e.value, TypeError) and isinstance(e.value, BufferError)
    assert "structured" in str(e.value)
    assert sbuf.host.shape == (3,), "the structured buffer stays usable through .host"
    with pytest.raises(resident.DLPackDtypeError):
        UnifiedBuffer((3,), ">f4", backend="cpu").__dlpack__()  # non-native byte order
    buf = UnifiedBuffer((3,), np.float32, backend="cpu")
    with pytest.raises(resident.DLPackError):
        buf.__dlpack__(dl_device=(2, 0))  # cannot export host memory to CUDA
    with pytest.raises(resident.DLPackError):
        buf.__dlpack__(stream=1)  # host memory has no stream
    assert buf.dlpack_exports == 0, "a refused export leaves nothing behind"
    with pytest.raises(TypeError):
        resident.from_dlpack([1, 2, 3])  # not a producer
    with pytest.raises(resident.DLPackError):
        _resident.DLPackImport(object())  # not a capsule


def test_released_buffer_refuses_export_and_pool_refuses_live_exports():
    pool = MemoryPool(backend="cpu")
    buf = pool.acquire((256,), np.float32)
    a = np.from_dlpack(buf)
    with pytest.raises(resident.BufferStateError, match="DLPack export"):
        pool.release(buf)
    assert pool.stats().live_buffers == 1, "the refused release left the buffer live"
    a[:] = 1.0
    del a
    gc.collect()
    view = buf.device_view()
    with pytest.raises(resident.BufferStateError):
        pool.release(buf)
    del view
    gc.collect()
    pool.release(buf)
    with pytest.raises(ValueError):
        buf.__dlpack__()  # released


def test_device_view_on_cpu_is_the_host_memory():
    buf = UnifiedBuffer((16,), np.int32, backend="cpu")
    buf.host[:] = np.arange(16)
    v = buf.device_view()
    assert v.__dlpack_device__() == (1, 0)
    assert v.address == buf.device.address == addr(buf.host)
    d = np.from_dlpack(v)
    assert addr(d) == v.address
    np.testing.assert_array_equal(d, np.arange(16))
    assert not hasattr(v, "__cuda_array_interface__"), "no CUDA array interface off CUDA"
    with pytest.raises(resident.DLPackError):
        v.__dlpack__(dl_device=(2, 0))


def test_device_view_refused_where_the_device_copy_is_not_addressable():
    try:
        buf = UnifiedBuffer((16,), np.float32, backend="cudasim")
    except resident.BackendNotAvailableError as e:  # pragma: no cover - g++ missing
        pytest.skip(f"cudasim backend unavailable: {e}")
    buf.host[:] = 1.0
    with pytest.raises(resident.DLPackError, match="not addressable"):
        buf.device_view()
    assert addr(np.from_dlpack(buf)) == addr(buf.host), "its host side still exports"


# ---- resident.from_dlpack as a consumer -----------------------------------------------------


def test_from_dlpack_numpy_is_zero_copy():
    x = np.arange(100, dtype=np.float64)
    w = resident.from_dlpack(x)
    assert isinstance(w, DLPackArray)
    assert w.address == addr(x) and addr(w.host) == addr(x) and addr(np.asarray(w)) == addr(x)
    assert w.shape == (100,) and w.dtype == np.float64 and w.device == (1, 0)
    assert w.nbytes == 800 and len(w) == 100 and w.producer is x
    w.host[3] = -3.0
    assert x[3] == -3.0
    assert np.from_dlpack(w).__array_interface__["data"][0] == addr(x), "re-exported as is"
    assert resident.from_dlpack(w) is w


def test_from_dlpack_keeps_the_producer_alive():
    x = np.arange(1000, dtype=np.int32)
    ref = weakref.ref(x)
    w = resident.from_dlpack(OnlyDLPack(x))
    del x
    gc.collect()
    assert ref() is not None, "the wrapper keeps the producer alive"
    np.testing.assert_array_equal(w.host, np.arange(1000))
    h = w.host
    del w
    gc.collect()
    assert ref() is not None, "a view made from the wrapper keeps it alive too"
    assert h.sum() == sum(range(1000))
    del h
    gc.collect()
    assert ref() is None, "released once nothing uses it"


def test_from_dlpack_of_a_unified_buffer_and_legacy_producers():
    buf = UnifiedBuffer((10,), np.uint8, backend="cpu")
    w = resident.from_dlpack(buf)
    assert w.address == addr(buf.host) and buf.dlpack_exports == 1
    del w
    gc.collect()
    assert buf.dlpack_exports == 0
    p = LegacyOnly(np.ones(4, np.float32))
    w = resident.from_dlpack(p)
    assert not w._imp.versioned and w.address == addr(p.arr) and p.calls == 1


def test_from_dlpack_strided_and_read_only_arrays():
    base = np.arange(40, dtype=np.int64).reshape(4, 10)
    x = base[:, ::3]  # not contiguous
    w = resident.from_dlpack(x)
    assert w.strides == x.strides and w.shape == x.shape
    assert addr(w.host) == addr(x)
    np.testing.assert_array_equal(w.host, x)
    ro = np.arange(5.0)
    ro.flags.writeable = False
    r = resident.from_dlpack(ro)
    assert r.read_only and not r.host.flags.writeable
    with pytest.raises(resident.DLPackError, match="read-only"):
        r.__dlpack__()  # a legacy capsule cannot say read-only


def test_from_dlpack_refuses_cuda_arrays_without_the_cuda_backend():
    class FakeCuda:
        called = False

        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kw):  # pragma: no cover - must not be called
            FakeCuda.called = True
            raise AssertionError("consumed")

    with pytest.raises(resident.DLPackError, match="CUDA backend"):
        resident.from_dlpack(FakeCuda(), backend="cpu")
    assert not FakeCuda.called, "refused before the producer exported anything"


def test_from_dlpack_refuses_dtypes_numpy_has_not():
    class Bf16:
        def __init__(self):
            self.buf = UnifiedBuffer((4,), np.uint16, backend="cpu")

        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kw):  # a bfloat16 tensor over the same memory
            return self.buf._raw.dlpack([4], (4, 16, 1), False, False)

    p = Bf16()
    with pytest.raises(resident.DLPackDtypeError, match="bfloat16"):
        resident.from_dlpack(p)
    gc.collect()
    assert p.buf.dlpack_exports == 0, "the refused import released the producer's tensor"


# ---- batch kernels take and fill DLPack arrays ------------------------------------------------


def _doubler(kid):
    @resident.batch_kernel(kernel_id=kid, in_dtype=np.int64)
    def double(state, batch):
        return batch * 2

    return double


def _drain(rt, kid, n, **kw):
    out = []
    while sum(map(len, out)) < n:
        out.append(rt.receive_batch(kid, n, timeout=5.0, **kw))
    return np.concatenate(out)


def test_send_batch_takes_any_dlpack_array(rt):
    kid = fresh("dl_send")
    _doubler(kid)
    rt.launch(kid)
    rt.activate(kid)
    src = np.arange(100, dtype=np.int64)
    assert rt.send_batch(kid, OnlyDLPack(src)) == 100
    np.testing.assert_array_equal(_drain(rt, kid, 100), src * 2)
    assert rt.send_batch(kid, resident.from_dlpack(src)) == 100
    np.testing.assert_array_equal(_drain(rt, kid, 100), src * 2)
    buf = UnifiedBuffer((10,), np.int64, backend="cpu")
    buf.host[:] = 5
    assert rt.send_batch(kid, buf) == 10
    np.testing.assert_array_equal(_drain(rt, kid, 10), 10)
    assert rt.send_batch(kid, resident.from_dlpack(np.arange(20, dtype=np.int64)[::2])) == 10
    np.testing.assert_array_equal(_drain(rt, kid, 10), np.arange(0, 20, 2) * 2)
    with pytest.raises(resident.DtypeLayoutError):
        rt.send_batch(kid, OnlyDLPack(np.ones(3, np.float32)))  # wrong dtype


def test_send_batch_refuses_device_arrays(rt):
    kid = fresh("dl_dev")
    _doubler(kid)
    rt.launch(kid)

    class OnCuda:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kw):  # pragma: no cover
            raise AssertionError("consumed")

    with pytest.raises(resident.DLPackError, match="host memory"):
        rt.send_batch(kid, OnCuda())


def test_receive_batch_into_a_callers_array(rt):
    kid = fresh("dl_out")
    _doubler(kid)
    rt.launch(kid)
    rt.activate(kid)
    rt.send_batch(kid, np.arange(50, dtype=np.int64))
    out = UnifiedBuffer((64,), np.int64, backend="cpu")
    got = 0
    while got < 50:
        got += rt.receive_batch(kid, 50 - got, timeout=5.0, out=out.host[got:])
    np.testing.assert_array_equal(out.host[:50], np.arange(50) * 2)
    rt.send_batch(kid, np.arange(10, dtype=np.int64))
    dst = np.full(4, -1, np.int64)
    n = 0
    while n < 4:
        k = rt.receive_batch(kid, 100, timeout=5.0, out=OnlyDLPack(dst[n:]))
        assert k <= 4 - n, "at most len(out) records"
        n += k
    np.testing.assert_array_equal(dst, [0, 2, 4, 6])
    np.testing.assert_array_equal(_drain(rt, kid, 6), [8, 10, 12, 14, 16, 18])
    with pytest.raises(resident.DtypeLayoutError):
        rt.receive_batch(kid, 1, out=np.zeros(4, np.float64))
    ro = np.zeros(4, np.int64)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        rt.receive_batch(kid, 1, out=ro)


def test_async_batch_with_dlpack_arrays():
    kid = fresh("dl_async")
    _doubler(kid)

    async def main():
        async with resident.RingKernelRuntime(backend="cpu") as art:
            await art.launch(kid)
            await art.activate(kid)
            assert await art.send_batch(kid, OnlyDLPack(np.arange(30, dtype=np.int64))) == 30
            dst = np.zeros(30, np.int64)
            got = 0
            while got < 30:
                got += await art.receive_batch(kid, 30, timeout=5.0, out=dst[got:])
            return dst

    np.testing.assert_array_equal(asyncio.run(main()), np.arange(30) * 2)


def _round_trip_peak(fn):
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_100mb_from_numpy_into_a_kernel_and_back_copies_nothing(rt):
    """100 MB of float32 handed to a batch kernel as its state through DLPack, scaled in place by
    the kernel's handler, and read back through DLPack: the same memory all the way (pointers),
    and the traced allocations stay far below one copy; np.array(copy=True) beside it."""
    n = 100 * 1000 * 1000 // 4
    big = np.ones(n, np.float32)
    kid = fresh("dl_big")

    @resident.batch_kernel(kernel_id=kid, in_dtype=np.float32, out_dtype=np.uint64)
    def scale(state, batch):
        h = state.host
        h *= batch[0]
        return np.array([h.__array_interface__["data"][0]], np.uint64)

    seen = {}

    def through_dlpack():
        arr = resident.from_dlpack(big)
        rt.launch(kid, state=arr)
        rt.activate(kid)
        rt.send_batch(kid, np.array([2.0], np.float32))
        seen["kernel"] = int(_drain(rt, kid, 1)[0])
        back = np.from_dlpack(arr)
        seen["back"] = addr(back)
        rt.terminate(kid)

    peak = _round_trip_peak(through_dlpack)
    assert seen["kernel"] == addr(big) and seen["back"] == addr(big), "the same memory throughout"
    assert big[0] == 2.0 and big[-1] == 2.0, "the kernel's in-place write is in the caller's array"
    assert peak < 1_000_000, f"{peak} bytes allocated: something copied the 100 MB"

    copied = _round_trip_peak(lambda: np.array(big, copy=True))
    assert copied >= big.nbytes, "np.array(copy=True) allocates the whole array"


# ---- other libraries (skipped where absent) -------------------------------------------------


@needs_torch
def test_torch_cpu_round_trip():
    buf = UnifiedBuffer((8,), np.float32, backend="cpu")
    buf.host[:] = np.arange(8, dtype=np.float32)
    t = torch.from_dlpack(buf)
    assert t.data_ptr() == addr(buf.host)
    t[0] = 100.0
    assert buf.host[0] == 100.0
    src = torch.arange(16, dtype=torch.int64)
    w = resident.from_dlpack(src)
    assert w.address == src.data_ptr() and addr(w.host) == src.data_ptr()


@needs_torch
@needs_cuda
def test_torch_cuda_device_view_round_trip():
    buf = UnifiedBuffer((1024,), np.float32, backend="cuda")
    buf.host[:] = 1.0
    view = buf.device_view()
    t = torch.from_dlpack(view)
    assert t.is_cuda and t.device.index == view.__dlpack_device__()[1]
    assert t.data_ptr() == buf.device.address == view.address
    t.mul_(3.0)
    torch.cuda.synchronize()  # torch's work on its stream is done before resident reads
    assert buf.state is BufferState.DEVICE_DIRTY
    np.testing.assert_array_equal(buf.host, 3.0)
    g = torch.arange(64, dtype=torch.float32, device=f"cuda:{t.device.index}")
    w = resident.from_dlpack(g, backend="cuda")
    assert w.address == g.data_ptr() and w.device == (2, t.device.index)
    assert torch.from_dlpack(w).data_ptr() == g.data_ptr()
    with pytest.raises(resident.DLPackError):
        w.host  # device memory


@needs_cupy
@needs_cuda
def test_cupy_device_view_and_cuda_array_interface():
    buf = UnifiedBuffer((256,), np.int32, backend="cuda")
    buf.host[:] = np.arange(256, dtype=np.int32)
    view = buf.device_view()
    cai = view.__cuda_array_interface__
    assert cai["version"] == 3 and cai["stream"] is None and cai["typestr"] == "<i4"
    a = cupy.asarray(view)  # through the CUDA array interface
    assert a.data.ptr == buf.device.address
    b = cupy.from_dlpack(view)
    assert b.data.ptr == buf.device.address
    b += 1
    cupy.cuda.runtime.deviceSynchronize()
    np.testing.assert_array_equal(buf.host, np.arange(256) + 1)
    c = cupy.arange(10, dtype=cupy.float64)
    w = resident.from_dlpack(c, backend="cuda")
    assert w.address == c.data.ptr
    assert cupy.asarray(w).data.ptr == c.data.ptr


@needs_cuda
def test_cuda_device_view_through_residents_own_consumer():
    buf = UnifiedBuffer((100,), np.float64, backend="cuda")
    buf.host[:] = 2.5
    view = buf.device_view()
    ordinal = _cuda_ordinal()
    assert view.__dlpack_device__() == (2, ordinal)
    assert buf.state is BufferState.DEVICE_DIRTY, "the host copy went over, the device is newer"
    cap = view.__dlpack__(stream=1, max_version=(1, 0))
    imp = _resident.DLPackImport(cap)
    assert imp.device == (2, ordinal) and imp.data == buf.device.address == view.address
    assert buf.dlpack_exports == 2  # the view and the export
    del imp, cap
    w = resident.from_dlpack(view, backend="cuda")
    assert w.device == (2, ordinal) and w.address == view.address
    cai = w.__cuda_array_interface__
    assert cai["data"][0] == view.address and cai["version"] == 3
    with pytest.raises(resident.DLPackError):
        w.host  # device memory
    with pytest.raises(resident.DLPackError):
        view.__dlpack__(stream=0)  # ambiguous, refused as the standard says
    del w
    gc.collect()
    np.testing.assert_array_equal(buf.host, 2.5)


@pytest.mark.skipif(jax is None, reason="JAX is not installed here")
def test_jax_cpu_array_into_a_batch_kernel(rt):
    kid = fresh("dl_jax")

    @resident.batch_kernel(kernel_id=kid, in_dtype=np.int32)
    def inc(state, batch):
        return batch + 1

    rt.launch(kid)
    rt.activate(kid)
    x = jax.device_put(np.arange(10, dtype=np.int32), jax.devices("cpu")[0])
    w = resident.from_dlpack(x)
    assert w.device == (1, 0) and w.shape == (10,)
    assert rt.send_batch(kid, x) == 10
    np.testing.assert_array_equal(_drain(rt, kid, 10), np.arange(10) + 1)

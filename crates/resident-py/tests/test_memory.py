"""UnifiedBuffer state machine and memory pool semantics, over the engine's buffers."""

import os

import numpy as np
import pytest

import resident
from resident import BufferState, MemoryPool, UnifiedBuffer, get_memory_pool


def test_host_writes_sync_and_state():
    buf = UnifiedBuffer((10000,), dtype=np.float32, backend="cpu")
    assert buf.state is BufferState.UNINITIALIZED
    data_a, data_b = np.arange(5000, dtype=np.float32), np.ones(5000, np.float32)
    buf.host[:5000] = data_a
    buf.host[5000:] = data_b
    assert buf.state is BufferState.HOST_ONLY
    buf.sync_to_device()
    assert buf.state is BufferState.SYNCHRONIZED
    dev = buf.device
    assert dev.nbytes == 40000 and dev.address != 0
    buf.sync_to_host()
    np.testing.assert_array_equal(buf.host[:5000], data_a)
    np.testing.assert_array_equal(buf.host[5000:], data_b)
    assert buf.state is BufferState.HOST_DIRTY, ".host hands out a writable view"


def test_structured_dtype_and_shapes():
    dt = np.dtype([("id", "<u4"), ("x", "<f4"), ("flags", "u1", (4,))])
    buf = UnifiedBuffer((3, 2), dtype=dt, backend="cpu")
    h = buf.host
    assert h.shape == (3, 2) and h.dtype == dt
    h["x"] = 1.5
    assert (buf.host["x"] == 1.5).all()


def test_errors_are_typed():
    buf = UnifiedBuffer((4,), backend="cpu")
    with pytest.raises(resident.BufferStateError):
        buf.sync_to_device()  # never written
    with pytest.raises(ValueError):
        UnifiedBuffer((-1,))
    with pytest.raises(ValueError):
        UnifiedBuffer((4,), backend="abacus")
    empty = UnifiedBuffer((0,), backend="cpu")
    assert empty.host.shape == (0,)


@pytest.mark.skipif(not os.environ.get("RESIDENT_REQUIRE_WGPU"), reason="wgpu adapter only checked in CI")
def test_wgpu_buffer_copies_when_the_other_side_is_newer():
    buf = UnifiedBuffer((256,), dtype=np.float32, backend="wgpu")
    buf.host[:] = np.arange(256, dtype=np.float32)
    buf.sync_to_device()
    assert buf.transfers["to_device"] == 1
    buf.sync_to_device()
    assert buf.transfers["to_device"] == 1, "no copy when the device is current"
    buf.mark_device_dirty()
    buf.sync_to_host()
    assert buf.transfers["to_host"] == 1
    np.testing.assert_array_equal(buf.host, np.arange(256, dtype=np.float32))


def test_pool_reuses_by_size_class_and_counts():
    pool = MemoryPool(backend="cpu")
    a = pool.acquire((100,), dtype=np.float32)  # 400 B -> 512 class
    a.host[:] = 7
    pool.release(a)
    with pytest.raises(ValueError):
        a.host  # released: refused
    with pytest.raises(ValueError):
        pool.release(a)  # twice
    b = pool.acquire((120,), dtype=np.float32)  # 480 B -> same class: reused
    s = pool.stats()
    assert (s.hits, s.misses) == (1, 1) and s.live_bytes == 512 and s.pooled_bytes == 0
    assert (b.host[:100] == 7).all(), "contents are what the last user left"
    with pool.buffer((1000,), np.float64) as c:
        assert c.nbytes == 8000
        assert pool.stats().live_bytes == 512 + 8192
    s = pool.stats()
    assert s.live_bytes == 512 and s.pooled_bytes == 8192 and s.high_water_bytes == 512 + 8192
    with pytest.raises(ValueError):
        pool.release(UnifiedBuffer((4,), backend="cpu"))
    assert pool.free_all_blocks() == 8192


def test_pool_limit_frees_over_the_limit():
    pool = MemoryPool(backend="cpu", limit_bytes=1024)
    bufs = [pool.acquire((200,), np.float32) for _ in range(3)]  # 1024 B class each
    for b in bufs:
        pool.release(b)
    assert pool.stats().pooled_bytes == 1024


def test_seed_pool_loop():
    pool = get_memory_pool()
    batch_size = 64
    for _ in range(3):
        buf = pool.acquire((batch_size,), dtype=np.float32)
        try:
            buf.host[:] = 1.0
        finally:
            pool.release(buf)
    assert pool is get_memory_pool()

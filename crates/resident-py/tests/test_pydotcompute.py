"""PyDotCompute 0.2.0's public names on resident (issue 40): each one imported from where a
PyDotCompute program imports it, and its behaviour checked (resident's where PyDotCompute's is
a defect, as the guide's table says)."""

import asyncio
import dataclasses
import importlib
import sys
import threading
import time
import uuid

import numpy as np
import pytest

import resident
from conftest import echo_body, fresh

try:
    import numba  # noqa: F401

    HAVE_NUMBA = True
except ImportError:
    HAVE_NUMBA = False


def art(**kw):
    kw.setdefault("backend", "cpu")
    return resident.RingKernelRuntime(shutdown_timeout=2.0, terminate_timeout=5.0, **kw)


# --- the top-level names and the submodules PyDotCompute programs import from -------------

PDC_TOP = [
    "Accelerator", "UnifiedBuffer", "BufferState", "MemoryPool", "ComputeOrchestrator",
    "RingKernelRuntime", "RingKernelMessage", "kernel", "gpu_kernel", "ring_kernel", "message",
]

SUBMODULES = {
    "resident.ring_kernels": ["RingKernelRuntime", "RingKernel", "KernelState",
                              "RingKernelMessage", "message", "get_loop_info"],
    "resident.ring_kernels.message": ["RingKernelMessage", "message", "get_message_type",
                                      "deserialize_message"],
    "resident.ring_kernels.runtime": ["RingKernelRuntime"],
    "resident.ring_kernels.lifecycle": ["KernelState", "RingKernel", "KernelContext"],
    "resident.core": ["Accelerator", "UnifiedBuffer", "BufferState", "MemoryPool",
                      "ComputeOrchestrator"],
    "resident.core.unified_buffer": ["UnifiedBuffer", "BufferState"],
    "resident.core.memory_pool": ["MemoryPool", "PoolStatistics", "get_memory_pool",
                                  "configure_memory_pool"],
    "resident.core.accelerator": ["Accelerator"],
    "resident.core.orchestrator": ["ComputeOrchestrator", "KernelLaunchConfig"],
    "resident.decorators": ["kernel", "gpu_kernel", "ring_kernel"],
    "resident.exceptions": ["PyDotComputeError", "KernelError", "KernelNotFoundError",
                            "KernelStateError", "KernelAlreadyExistsError", "MessageError",
                            "MessageSerializationError", "MessageDeserializationError",
                            "QueueError", "QueueFullError", "QueueTimeoutError", "BufferError",
                            "BufferNotAllocatedError", "BackendError",
                            "BackendNotAvailableError", "CompilationError",
                            "KernelCompilationError", "ValidationError",
                            "InvalidConfigurationError"],
}


def test_pydotcompute_top_level_names_are_resident_s():
    for name in PDC_TOP:
        assert name in resident.__all__, name
        assert getattr(resident, name) is not None
    assert resident.RingKernelMessage is resident.Message


@pytest.mark.parametrize("mod", sorted(SUBMODULES))
def test_submodules_hold_the_package_s_own_objects(mod):
    m = importlib.import_module(mod)
    for name in SUBMODULES[mod]:
        obj = getattr(m, name)
        top = getattr(resident, name, None)
        if top is None:
            top = getattr(resident.exceptions, name, None)
        if name == "kernel" and mod == "resident.decorators":
            assert callable(obj) and callable(resident.kernel)
        else:
            assert obj is top, f"{mod}.{name} is not resident's own"


def test_submodule_names_do_not_hide_the_decorators():
    """``resident.ring_kernels.message`` (a submodule) does not replace the ``message``
    decorator that ``resident.ring_kernels`` exports, whichever is imported first."""
    importlib.import_module("resident.ring_kernels.message")
    rk = importlib.import_module("resident.ring_kernels")
    assert rk.message is resident.message and callable(rk.message)
    assert not isinstance(rk.message, type(sys))


def test_exception_bases_and_aliases():
    ex = resident.exceptions
    assert ex.PyDotComputeError is resident.ResidentError
    assert ex.KernelAlreadyExistsError is resident.DuplicateKernelError
    assert ex.BufferError is resident.BufferStateError
    assert ex.InvalidConfigurationError is resident.InvalidConfigError
    for cls, bases in [
        (resident.KernelNotFoundError, (resident.KernelError, KeyError)),
        (resident.KernelStateError, (resident.KernelError,)),
        (resident.QueueFullError, (resident.QueueError,)),
        (resident.QueueTimeoutError, (resident.QueueError, TimeoutError, asyncio.TimeoutError)),
        (resident.ReceiveTimeoutError, (resident.QueueTimeoutError,)),
        (resident.SendTimeoutError, (resident.QueueTimeoutError,)),
        (resident.CallTimeoutError, (resident.QueueTimeoutError,)),
        (resident.MessageSerializationError, (resident.MessageError, TypeError)),
        (resident.MessageDeserializationError, (resident.MessageError, ValueError)),
        (resident.MessageTypeError, (resident.MessageError, TypeError)),
        (resident.BackendNotAvailableError, (resident.BackendError,)),
        (resident.InvalidConfigError, (resident.ValidationError, ValueError)),
        (resident.BufferNotAllocatedError, (resident.BufferStateError, ValueError)),
        (resident.NumbaNotAvailableError, (resident.BackendNotAvailableError, ImportError)),
    ]:
        for b in bases:
            assert issubclass(cls, b), (cls, b)
        assert issubclass(cls, ex.PyDotComputeError)


def test_receive_timeout_is_a_queue_timeout_and_an_asyncio_timeout():
    """PyDotCompute's ``receive`` raises ``QueueTimeoutError``, which is not an
    ``asyncio.TimeoutError``; resident's is both."""

    async def main():
        async with art() as rt:
            k = fresh("echo")
            await rt.launch(k, echo_body)
            await rt.activate(k)
            with pytest.raises(resident.QueueTimeoutError) as e:
                await rt.receive(k, timeout=0.05)
            assert isinstance(e.value, asyncio.TimeoutError) and e.value.kernel_id == k

    asyncio.run(main())


# --- messages -----------------------------------------------------------------------------


@resident.message
class Point:
    x: float = 0.0
    y: float = 0.0
    tag: str = ""
    extra: object = None


@dataclasses.dataclass
class Sub(resident.RingKernelMessage):
    value: int = 0


def test_serialize_round_trips_every_field_type():
    payload = {"a": (1, 2.5, "s", b"\x00\xff", None, True), 3: [uuid.uuid4()],
               "arr": np.arange(6, dtype=np.int16).reshape(2, 3), "f": np.float32(1.5),
               "rec": np.zeros(2, np.dtype([("k", "<u4"), ("v", "<f8")]))}
    p = Point(x=1.0, y=-2.0, tag="t", extra=payload, priority=200)
    q = Point.deserialize(p.serialize())
    assert type(q) is Point
    assert (q.x, q.y, q.tag, q.priority, q.message_id, q.correlation_id) == (
        1.0, -2.0, "t", 200, p.message_id, None)
    e = q.extra
    assert e["a"] == payload["a"] and e[3] == payload[3]
    assert e["arr"].dtype == np.int16 and (e["arr"] == payload["arr"]).all()
    assert type(e["f"]) is np.float32 and e["f"] == 1.5
    assert e["rec"].dtype == payload["rec"].dtype
    e["arr"][0, 0] = 9  # a writable copy, not a view of the bytes
    nested = Point(extra=Sub(value=7))
    back = resident.deserialize_message(nested.serialize())
    assert type(back.extra) is Sub and back.extra.value == 7
    assert back.extra.message_id == nested.extra.message_id


def test_subclass_messages_serialize_and_register():
    s = Sub(value=3, priority=10)
    assert resident.get_message_type("Sub") is Sub
    assert resident.get_message_type("Point") is Point
    assert resident.get_message_type("NoSuchMessage") is None
    t = Sub.deserialize(s.serialize())
    assert (t.value, t.priority, t.message_id) == (3, 10, s.message_id)
    u = resident.deserialize_message(s.serialize())
    assert type(u) is Sub and u.value == 3
    # The base class reads any registered type back (as deserialize_message does).
    assert type(resident.RingKernelMessage.deserialize(Point(x=1.0).serialize())) is Point


def test_serialization_errors_are_typed():
    with pytest.raises(resident.MessageSerializationError) as e:
        Point(extra={"fn": print}).serialize()
    assert "extra" in str(e.value)
    with pytest.raises(resident.MessageSerializationError):
        Point(extra=np.array([object()])).serialize()
    good = Point(x=1.0).serialize()
    for bad in [b"", b"junk", good[:-3], good.replace(b"Point", b"Nope!")]:
        with pytest.raises(resident.MessageDeserializationError):
            resident.deserialize_message(bad)
    with pytest.raises(resident.MessageDeserializationError):
        Sub.deserialize(good)  # a Point, not a Sub
    with pytest.raises(resident.MessageDeserializationError):
        Point.deserialize("not bytes")
    with pytest.raises(resident.MessageDeserializationError):  # priority out of range
        Point.deserialize(good.replace(b'["priority", 128]', b'["priority", 999]'))


def test_with_correlation_copies_with_the_id():
    p = Point(x=2.0)
    cid = uuid.uuid4()
    q = p.with_correlation(cid)
    assert q is not p and q.correlation_id == cid and p.correlation_id is None
    assert (q.x, q.message_id) == (2.0, p.message_id)
    s = Sub(value=1).with_correlation(cid)
    assert type(s) is Sub and s.correlation_id == cid


# --- the runtime --------------------------------------------------------------------------


def test_launch_returns_the_kernel_and_kernel_state():
    KS = resident.KernelState

    async def main():
        rt = art(use_uvloop=False, use_eager_tasks=False)  # PyDotCompute's flags, accepted
        assert rt.is_active
        async with rt:
            k = fresh("echo")
            kern = await rt.launch(k, echo_body)
            assert isinstance(kern, resident.RingKernel) and kern.kernel_id == k
            assert kern.state is KS.LAUNCHED and rt.get_kernel_state(k) is KS.LAUNCHED
            await kern.activate()
            assert kern.is_active and rt.get_kernel_state(k) == "active"
            assert await kern.call(5, timeout=5) == ("echo", 5)
            await kern.send(6)
            assert await kern.receive(timeout=5) == ("echo", 6)
            t = kern.telemetry
            assert t.messages_processed == 2 and t.error_count == 0
            assert t.max_latency_ns == t.latency_max_ns > 0
            assert t.avg_latency_ns == t.latency_mean_ns
            assert t.avg_latency_ms == t.latency_mean_ns / 1e6
            assert t.total_latency_ns == t.latency_mean_ns * t.latency_count
            await kern.deactivate()
            assert kern.state is KS.DEACTIVATED and KS.DEACTIVATED == "inactive"
            rep = await kern.terminate()
            assert rep.kernel_id == k and kern.state is KS.TERMINATED
        assert not rt.is_active

    asyncio.run(main())
    assert [s.name for s in KS][:6] == ["CREATED", "LAUNCHED", "ACTIVE", "DEACTIVATED",
                                        "TERMINATING", "TERMINATED"]
    assert str(KS.ACTIVE) == "active"


def test_kernel_scope_launches_activates_and_terminates():
    async def main():
        async with art() as rt:
            k = fresh("echo")
            async with rt.kernel_scope(k, echo_body) as kern:
                assert rt.state(k) == "active"
                assert await kern.call("x", timeout=5) == ("echo", "x")
            after = rt.state(k)
            assert k not in rt.kernel_ids
            k2 = fresh("echo")
            with pytest.raises(RuntimeError, match="inside"):
                async with rt.kernel_scope(k2, echo_body):
                    raise RuntimeError("inside")
            return after, rt.state(k2)

    assert asyncio.run(main()) == ("terminated", "terminated")


def test_send_timeout_bounds_the_wait_for_room():
    """``send(..., timeout=)`` (PyDotCompute's keyword): under ``block`` a full queue makes it
    wait at most that long (less than the kernel's block timeout), the message handed back."""

    async def main():
        async with art() as rt:
            k = fresh("full")
            await rt.launch(k, echo_body, queue_size=2, backpressure="block", block_timeout=30.0)
            await rt.send(k, 1)
            await rt.send(k, 2)  # launched, not active: nothing is taken
            t0 = time.perf_counter()
            with pytest.raises(resident.SendTimeoutError) as e:
                await rt.send(k, 3, timeout=0.1)
            return time.perf_counter() - t0, e.value.message

    took, msg = asyncio.run(main())
    assert 0.05 < took < 5.0 and msg == 3


def test_get_loop_info_describes_the_running_loop():
    async def main():
        async with art() as rt:
            return rt.get_loop_info(), resident.get_loop_info()

    info, same = asyncio.run(main())
    assert info == same
    assert info["loop_class"] == type(asyncio.new_event_loop()).__name__
    assert info["platform"] == sys.platform
    assert info["python_version"].startswith(f"{sys.version_info[0]}.{sys.version_info[1]}.")
    assert info["eager_tasks_available"] == (sys.version_info >= (3, 12))
    assert info["uvloop_installed"] is False
    assert resident.get_loop_info()["loop_class"] == "no_running_loop"


# --- memory -------------------------------------------------------------------------------


def test_unified_buffer_allocates_lazily_and_frees():
    BS = resident.BufferState
    buf = resident.UnifiedBuffer((8,), np.float32, backend="cpu")
    assert not buf.is_allocated and buf.state is BS.UNINITIALIZED
    assert buf.backend == "cpu" and buf.pinned is False and not buf.is_allocated
    assert buf.allocate() is buf and buf.is_allocated
    assert buf.zeros() is buf and (buf.host == 0).all()
    assert buf.fill(2.5) is buf and (buf.host == 2.5).all()
    buf.synchronize()  # the host copy was newer: copied over
    assert buf.state is BS.SYNCHRONIZED
    buf.mark_device_dirty()
    buf.synchronize()
    assert buf.state is BS.SYNCHRONIZED  # (one memory on the CPU backend: no copy)
    buf.fill(1.0)
    asyncio.run(buf.ensure_on_device())  # awaited, the copy on a thread
    assert buf.state is BS.SYNCHRONIZED
    buf.mark_device_dirty()
    asyncio.run(buf.ensure_on_host())
    assert buf.state is BS.SYNCHRONIZED and (buf.host == 1.0).all()
    buf.free()
    assert not buf.is_allocated and buf.state is BS.UNINITIALIZED
    lazy = resident.UnifiedBuffer((4,), np.int32, backend="cpu")
    lazy.copy_from(np.arange(4))  # allocates on use
    assert lazy.is_allocated and lazy.state is BS.HOST_ONLY
    out = np.zeros(4, np.int32)
    lazy.copy_to(out)
    assert list(out) == [0, 1, 2, 3]
    lazy.mark_host_dirty()
    lazy.synchronize()
    assert lazy.state is BS.SYNCHRONIZED
    with pytest.raises(ValueError):
        resident.UnifiedBuffer((4,), backend="abacus")  # checked at construction


def test_pool_buffers_released_are_not_allocated_and_cannot_be_freed():
    pool = resident.MemoryPool(backend="cpu")
    b = pool.acquire((16,), np.float32)
    with pytest.raises(resident.BufferStateError):
        b.free()
    pool.release(b)
    assert not b.is_allocated
    with pytest.raises(resident.BufferNotAllocatedError):
        b.host


def test_memory_pool_enable_disable_limit_and_pinned_stats():
    pool = resident.MemoryPool(backend="cpu")
    assert pool.enabled
    a = pool.acquire((1000,), np.float32)  # 4000 B: the 4096 class
    st = pool.get_stats()
    assert (st.used_bytes, st.total_bytes, st.n_free_blocks) == (4096, 4096, 0)
    assert st.utilization == 1.0 and st.used_mb == 4096 / (1 << 20)
    pool.release(a)
    st = pool.get_stats()
    assert (st.used_bytes, st.total_bytes, st.n_free_blocks, st.free_bytes) == (0, 4096, 1, 4096)
    assert st.utilization == 0.0 and st.total_mb == 4096 / (1 << 20)
    pool.disable()
    assert not pool.enabled and pool.get_stats().n_free_blocks == 0  # idle memory freed
    pool.release(pool.acquire((1000,), np.float32))
    assert pool.get_stats().n_free_blocks == 0  # a plain allocator
    pool.enable()
    pool.release(pool.acquire((1000,), np.float32))
    pool.release(pool.acquire((100,), np.float32))
    assert pool.get_stats().pooled_bytes == 4096 + 512
    pool.set_limit(1000 / (1 << 20))  # 1000 bytes: the 4096 block goes
    assert pool.get_stats().pooled_bytes == 512 and pool.limit_bytes == 1000
    pool.set_limit(None)
    assert pool.limit_bytes is None
    with pytest.raises(ValueError):
        pool.set_limit(-1)
    p = pool.acquire((10,), np.float32, pinned=True)
    ps = pool.get_pinned_stats()
    assert ps.used_bytes == 256 and ps.live_buffers == 1
    assert pool.get_stats().used_bytes == 256
    pool.release(p)
    assert pool.get_pinned_stats().n_free_blocks == 1
    assert pool.free_all_blocks() == 512 + 256


def test_get_memory_pool_is_one_pool_and_configure_memory_pool():
    pool = resident.get_memory_pool()
    assert resident.get_memory_pool() is pool
    try:
        assert resident.configure_memory_pool(max_size_mb=2, enable=False) is pool
        assert not pool.enabled and pool.limit_bytes == 2 << 20
        assert resident.configure_memory_pool() is pool and pool.enabled
        with pytest.raises(ValueError):
            resident.configure_memory_pool(initial_size_mb=64)
    finally:
        pool.set_limit(None)
        pool.enable()


# --- devices, the orchestrator, Numba kernels --------------------------------------------


def test_accelerator_lists_the_devices_of_the_backends_available():
    acc = resident.Accelerator()
    names = resident.available_backends()
    assert [d.device_id for d in acc.devices] == list(range(acc.device_count))
    assert {d.backend for d in acc.devices} == set(names)
    assert acc.cuda_available == ("cuda" in names)
    cpu = [d for d in acc.devices if d.device_type is resident.DeviceType.CPU]
    assert len(cpu) == 1 and cpu[0].multiprocessor_count >= 1
    assert cpu[0].compute_capability_str == "N/A"
    if not acc.cuda_available:
        assert acc.current_device is cpu[0]
    last = acc.device_count - 1
    acc.set_device(last)
    assert acc.current_device.device_id == last and acc.get_device(0) is acc.devices[0]
    assert set(acc.get_memory_info()) == {"total", "free", "used"}
    with pytest.raises(resident.InvalidConfigError):
        acc.set_device(acc.device_count)
    assert resident.get_accelerator() is resident.get_accelerator()


def test_orchestrator_runs_functions_off_the_loop_and_records_them():
    loop_thread = threading.get_ident()
    seen = []

    def scale(a, k):
        seen.append(threading.get_ident())
        time.sleep(0.2)
        a *= k

    async def add_one(a):
        a += 1

    async def main():
        async with resident.ComputeOrchestrator() as o:
            assert o.is_active and o.accelerator is resident.get_accelerator()
            assert o.memory_pool is resident.get_memory_pool()
            o.register_kernel("scale", scale)
            a = np.ones(4)
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.01)

            t = asyncio.create_task(ticker())
            run = await o.launch_kernel("scale", resident.KernelLaunchConfig(grid_size=1), a, 3.0)
            t.cancel()
            await o.launch_kernel(add_one, None, a)
            with pytest.raises(resident.KernelNotFoundError):
                await o.launch_kernel("nope", None)
            with pytest.raises(ZeroDivisionError):
                await o.launch_kernel(lambda: 1 / 0)
            hist = o.get_execution_history()
            return run, a, ticks, hist, o.get_execution_history(kernel_name="scale")

    run, a, ticks, hist, scaled = asyncio.run(main())
    assert list(a) == [4.0] * 4 and run.success and run.duration_ms >= 150
    assert run.config.grid_size == (1,) and run.config.block_size == (256,)
    assert seen and seen[0] != loop_thread and ticks >= 5  # the loop went on meanwhile
    assert [h.kernel_name for h in hist] == ["scale", "add_one", "<lambda>"]
    assert not hist[-1].success and isinstance(hist[-1].error, ZeroDivisionError)
    assert scaled == [run]
    with pytest.raises(resident.InvalidConfigError):
        resident.KernelLaunchConfig(block_size=(0,))


def test_kernel_without_numba_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba fails
    with pytest.raises(resident.NumbaNotAvailableError, match=r"resident\[numba\]") as e:
        @resident.kernel(block=(256,))
        def f(a):
            return a

    assert isinstance(e.value, ImportError)
    with pytest.raises(resident.NumbaNotAvailableError):
        resident.gpu_kernel(lambda a: a)


@pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed (pip install resident[numba])")
def test_kernel_compiles_with_numba_on_the_cpu():
    @resident.kernel(block=(256,))
    def saxpy(a, x, y, out):
        for i in range(x.shape[0]):
            out[i] = a * x[i] + y[i]

    @resident.kernel
    def total(x):
        s = 0.0
        for v in x:
            s += v
        return s

    x, y, out = np.arange(5.0), np.ones(5), np.zeros(5)
    saxpy(2.0, x, y, out)
    assert list(out) == [1.0, 3.0, 5.0, 7.0, 9.0]
    assert total(x) == 10.0 and saxpy.block == (256,) and saxpy.name == "saxpy"
    if not resident.Accelerator().cuda_available:
        assert saxpy.target == "cpu"
    assert hasattr(saxpy._compiled, "signatures")  # compiled by Numba, not run as Python

    @resident.kernel(device="cpu")
    def broken(x):
        return x.no_such_attribute

    with pytest.raises(resident.CompilationError):
        broken(np.zeros(2))
    with pytest.raises(resident.InvalidConfigError):
        resident.kernel(device="tpu")(lambda a: a)
    with pytest.raises(resident.InvalidConfigError):
        resident.kernel(block=(0,))(lambda a: a)

    @resident.gpu_kernel
    def on_gpu(a):
        pass

    assert on_gpu.target == "cuda"
    if not resident.Accelerator().cuda_available:
        with pytest.raises(resident.BackendNotAvailableError):
            on_gpu(np.zeros(4))

        async def orchestrated():
            async with resident.ComputeOrchestrator() as o:
                with pytest.raises(resident.BackendNotAvailableError):
                    await o.launch_kernel(on_gpu, resident.KernelLaunchConfig(1, 32), np.zeros(4))
                out = np.zeros(5)
                await o.launch_kernel(saxpy, None, 1.0, x, y, out)  # the CPU kernel, on a thread
                return o.get_execution_history(), out

        hist, out2 = asyncio.run(orchestrated())
        assert [h.success for h in hist] == [False, True] and list(out2) == [1, 2, 3, 4, 5]


def test_kernel_scope_after_the_block_terminated_the_kernel_itself():
    async def main():
        async with art() as rt:
            k = fresh("echo")
            async with rt.kernel_scope(k, echo_body) as kern:
                rep = await kern.terminate()
            assert rep.kernel_id == k and rt.state(k) == "terminated"
            with pytest.raises(resident.KernelNotFoundError):
                async with rt.kernel_scope(fresh("never"), None):
                    pass

    asyncio.run(main())

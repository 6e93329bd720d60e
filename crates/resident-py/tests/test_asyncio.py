"""asyncio habits (issue 29): waits that neither block the loop nor use threads, cancellation
that loses nothing, replies matched for every object, resources that follow the kernel, and
loud errors on bad input. Timing bounds are generous: the machines that run this are shared."""

import asyncio
import dataclasses
import os
import resource
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import resident
from resident import RingKernelRuntime
from conftest import echo_body, fresh


async def plain_echo(ctx):
    """Replies with the message itself (the seeds' echo)."""
    while not ctx.should_terminate:
        if not ctx.is_active:
            await ctx.wait_active()
            continue
        try:
            msg = await ctx.receive(timeout=0.1)
        except asyncio.TimeoutError:
            continue
        await ctx.send(msg)


def slow_echo(delay):
    async def body(ctx):
        while not ctx.should_terminate:
            if not ctx.is_active:
                await ctx.wait_active()
                continue
            try:
                msg = await ctx.receive(timeout=0.1)
            except asyncio.TimeoutError:
                continue
            await asyncio.sleep(delay)
            await ctx.send(msg)

    return body


def art():
    return RingKernelRuntime(backend="cpu", shutdown_timeout=2.0, terminate_timeout=5.0)


class Ticker:
    """A loop-liveness probe: a task that ticks every 10 ms and records the longest gap."""

    def __init__(self):
        self.worst = 0.0
        self._task = None

    async def _run(self):
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            self.worst = max(self.worst, now - last)
            last = now

    async def __aenter__(self):
        self._task = asyncio.get_running_loop().create_task(self._run())
        await asyncio.sleep(0)  # the probe starts ticking before the work it watches
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc):
        self._task.cancel()


def python_threads():
    return {t.ident for t in threading.enumerate()}


# ---- 1: the seeds' echo program ------------------------------------------------------------


@pytest.mark.parametrize("queue_size", [64, 4096])
def test_seed_echo_producer_task_and_receiver_run_to_the_end(queue_size):
    n = 20000

    async def main():
        async with art() as rt:
            kid = fresh("seed_echo")
            await rt.launch(kid, plain_echo, queue_size=queue_size)
            await rt.activate(kid)

            async def producer():
                for i in range(n):
                    await rt.send(kid, i)

            task = asyncio.create_task(producer())
            got = [await rt.receive(kid, timeout=30) for _ in range(n)]
            await task
            return got

    assert asyncio.run(main()) == list(range(n)), "every message, in order"


# ---- 2: cancellation takes nothing ---------------------------------------------------------


def test_cancelled_receive_takes_nothing():
    async def main():
        async with art() as rt:
            kid = fresh("slow")
            await rt.launch(kid, slow_echo(0.05))
            await rt.activate(kid)
            for i in range(5):
                await rt.send(kid, i)
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(rt.receive(kid), 0.005)
                assert await rt.receive(kid, timeout=10) == i, f"round {i}: the reply was lost"
            tele = rt.get_telemetry(kid)
            assert tele.objects_held == 0

    asyncio.run(main())


def test_cancelled_receive_batch_takes_nothing():
    dt = np.dtype([("v", "<i4")])
    kid = fresh("slow_batch")

    def slow(state, batch):
        time.sleep(0.05)
        return batch

    resident.batch_kernel(kernel_id=kid, in_dtype=dt)(slow)

    async def main():
        async with art() as rt:
            await rt.launch(kid)
            await rt.activate(kid)
            got = []
            for i in range(10):
                a = np.zeros(1, dt)
                a["v"] = i
                await rt.send_batch(kid, a)
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(rt.receive_batch(kid, 10, timeout=10), 0.005)
                got.extend(int(r["v"]) for r in await rt.receive_batch(kid, 10, timeout=10))
            assert got == list(range(10))

    asyncio.run(main())


def test_cancelled_call_withdraws_its_request_and_leaves_no_waiter():
    async def main():
        async with art() as rt:
            kid = fresh("slow")
            await rt.launch(kid, slow_echo(0.3))
            await rt.activate(kid)
            task = asyncio.create_task(rt.call(kid, "first"))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await rt.call(kid, "second", timeout=10) == "second"

    asyncio.run(main())


# ---- 3: no executor, no thread per wait, no starvation --------------------------------------


def test_waits_use_no_threads_and_do_not_starve_each_other():
    async def main():
        async with art() as rt:
            slow, fast = fresh("slow"), fresh("fast")
            await rt.launch(slow, slow_echo(0.5))
            await rt.launch(fast, plain_echo)
            await rt.activate(slow)
            await rt.activate(fast)
            before = python_threads()
            pending = [asyncio.create_task(rt.call(slow, i, timeout=30)) for i in range(8)]
            await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            assert await rt.call(fast, "x", timeout=1.0) == "x"
            assert time.perf_counter() - t0 < 1.0, "a call to a free kernel waited for others"
            assert not python_threads() - before, "a wait started a thread"
            # Calls that gave up leave nothing behind: the next call still returns.
            for i in range(6):
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(rt.call(slow, ("gave up", i)), 0.05)
            assert await rt.call(fast, "y", timeout=5.0) == "y"
            for p in pending:
                p.cancel()
            # Cancelled receivers do not hold the runtime's shutdown.
            consumers = [asyncio.create_task(rt.receive(fast)) for _ in range(6)]
            await asyncio.sleep(0.05)
            for c in consumers:
                c.cancel()
            await asyncio.gather(*consumers, return_exceptions=True)
            assert not python_threads() - before

    t0 = time.perf_counter()
    asyncio.run(asyncio.wait_for(main(), 60))
    assert time.perf_counter() - t0 < 30, "leaving `async with` waited for abandoned waits"


# ---- 4: None is a reply ----------------------------------------------------------------------


async def none_replier(ctx):
    while not ctx.should_terminate:
        if not ctx.is_active:
            await ctx.wait_active()
            continue
        try:
            await ctx.receive(timeout=0.1)
        except asyncio.TimeoutError:
            continue
        await ctx.send(None)


def test_a_reply_of_none_is_a_reply(rt):
    kid = fresh("none")
    rt.launch(kid, none_replier)
    rt.activate(kid)
    assert rt.call(kid, 1, timeout=10) is None

    async def main():
        async with art() as art_:
            k2 = fresh("none")
            await art_.launch(k2, none_replier)
            await art_.activate(k2)
            return [await art_.call(k2, i, timeout=10) for i in range(3)]

    assert asyncio.run(main()) == [None, None, None]


# ---- 10: replies of plain objects in the seeds' batch pattern --------------------------------


async def batch_pattern(ctx):
    """The seeds' batch processor: collect with receive(timeout=0.001), then reply per
    message (plain objects, no correlation ids)."""
    while not ctx.should_terminate:
        if not ctx.is_active:
            await ctx.wait_active()
            continue
        batch = []
        for _ in range(100):
            try:
                batch.append(await ctx.receive(timeout=0.001))
            except asyncio.TimeoutError:
                break
        for m in batch:
            await ctx.send(("re", m))


def test_plain_object_calls_get_their_own_replies_in_the_batch_pattern():
    async def main():
        async with art() as rt:
            kid = fresh("batchpat")
            await rt.launch(kid, batch_pattern)
            await rt.activate(kid)
            replies = await asyncio.gather(*(rt.call(kid, i, timeout=10) for i in range(20)))
            assert replies == [("re", i) for i in range(20)]

    asyncio.run(main())


async def reverse_replier(ctx):
    """Answers pairs of requests in reverse order, naming each request with reply_to."""
    held = []
    while not ctx.should_terminate:
        try:
            held.append(await ctx.receive(timeout=0.1))
        except asyncio.TimeoutError:
            continue
        if len(held) == 2:
            for m in reversed(held):
                await ctx.send(("re", m), reply_to=m)
            held = []


def test_reply_to_names_the_request(rt):
    kid = fresh("rev")
    rt.launch(kid, reverse_replier)
    rt.activate(kid)
    out = {}

    def caller(i):
        out[i] = rt.call(kid, i, timeout=10)

    ts = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert out == {i: ("re", i) for i in range(4)}


# ---- 9: send_batch is loud on another layout ---------------------------------------------------


def test_send_batch_refuses_other_layouts(rt):
    dt = np.dtype([("a", "<f4"), ("b", "<i4")])
    kid = fresh("layout")
    resident.batch_kernel(kernel_id=kid, in_dtype=dt)(lambda s, b: b)
    rt.launch(kid)
    rt.activate(kid)
    swapped = np.zeros(2, np.dtype([("b", "<i4"), ("a", "<f4")]))
    with pytest.raises(resident.DtypeLayoutError, match="names and order"):
        rt.send_batch(kid, swapped)
    with pytest.raises(resident.DtypeLayoutError, match="every field"):
        rt.send_batch(kid, np.array([1.5, 2.5]))
    with pytest.raises(resident.DtypeLayoutError):
        rt.send_batch(kid, [1.5, 2.5])
    with pytest.raises(resident.DtypeLayoutError, match="field 'b'"):
        rt.send_batch(kid, np.zeros(2, np.dtype([("a", "<f4"), ("b", "<f4")])))
    good = np.zeros(2, dt)
    good["a"], good["b"] = [1.5, 2.5], [7, 8]
    assert rt.send_batch(kid, good) == 2
    assert rt.send_batch(kid, [(3.5, 9)]) == 1
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 3 and time.monotonic() < deadline:
        got.extend(rt.receive_batch(kid, 10, timeout=1.0).tolist())
    assert got == [(1.5, 7), (2.5, 8), (3.5, 9)]


# ---- 12: loud declarations, Message as a dataclass base, failed_message ---------------------


def test_misspelled_decorator_arguments_are_refused_with_a_suggestion():
    with pytest.raises(resident.UnknownArgumentError, match="did you mean 'queue_size'"):
        resident.ring_kernel(queue_sise=16)
    with pytest.raises(resident.UnknownArgumentError, match="did you mean 'backpressure'"):
        resident.ring_kernel(kernel_id=fresh("x"), backpresure="reject")
    with pytest.raises(resident.UnknownArgumentError, match="did you mean 'max_batch'"):
        resident.batch_kernel(in_dtype=np.int32, max_bacth=4)
    with pytest.raises(resident.UnknownArgumentError, match="did you mean 'state_dtype'"):
        resident.device_kernel(in_dtype=np.dtype([("x", "<f4")]), state_dtyp=None)
    # PyDotCompute's arguments stay accepted.
    resident.ring_kernel(kernel_id=fresh("ok"), grid_size=1, block_size=32)(echo_body)
    with pytest.raises(TypeError):  # also a TypeError, as Python's own
        resident.ring_kernel(queue_sise=16)
    with resident.Runtime(backend="cpu") as rt:
        with pytest.raises(resident.UnknownArgumentError, match="did you mean 'block_timeout'"):
            rt.launch(fresh("ov"), echo_body, block_timeot=0.5)


def test_keyword_field_names_are_refused_at_declaration():
    src = "__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out, const Envelope* e) { return true; }"
    with pytest.raises(resident.DtypeLayoutError, match="'class'") as e:
        resident.device_kernel(in_dtype=np.dtype([("class", "<f4")]), cuda=src)(lambda s, b: b)
    assert e.value.field == "class"
    wgsl = "fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool { return true; }"
    with pytest.raises(resident.DtypeLayoutError, match="'type'"):
        resident.device_kernel(in_dtype=np.dtype([("type", "<u4")]), wgsl=wgsl)(lambda s, b: b)
    # A word only WGSL reserves is fine for a CUDA-only kernel.
    resident.device_kernel(
        kernel_id=fresh("cuda_only"), in_dtype=np.dtype([("type", "<u4")]), cuda=src
    )(lambda s, b: b)


def test_message_as_a_dataclass_base():
    @dataclasses.dataclass
    class Request(resident.Message):
        x: float = 0.0

    @dataclasses.dataclass
    class Response(resident.Message):
        y: float = 0.0

    a, b = Request(x=1.0), Request(x=2.0, priority=200)
    assert a.message_id is not None and a.message_id != b.message_id
    assert (a.priority, b.priority, a.correlation_id) == (128, 200, None)
    r = a.reply(Response, y=3.0)
    assert r.correlation_id == a.message_id and r.y == 3.0
    with pytest.raises(ValueError):
        Request(priority=300)

    async def doubler(ctx):
        while not ctx.should_terminate:
            try:
                m = await ctx.receive(timeout=0.1)
            except asyncio.TimeoutError:
                continue
            await ctx.send(m.reply(Response, y=m.x * 2))

    with resident.Runtime(backend="cpu") as rt:
        kid = fresh("dc")
        rt.launch(kid, doubler)
        rt.activate(kid)
        assert rt.call(kid, Request(x=21.0), timeout=10).y == 42.0


def test_failed_message_is_the_message_the_handler_failed_on(rt):
    async def picky(ctx):
        while not ctx.should_terminate:
            try:
                m = await ctx.receive(timeout=0.1)
            except asyncio.TimeoutError:
                continue
            if m == "bad":
                raise RuntimeError("cannot handle it")
            await ctx.send(m)

    kid = fresh("picky")
    rt.launch(kid, picky)
    rt.activate(kid)
    assert rt.call(kid, "good", timeout=10) == "good"
    bad = "bad"
    rt.send(kid, bad)
    deadline = time.monotonic() + 10
    while rt.state(kid) != "failed" and time.monotonic() < deadline:
        time.sleep(0.01)
    rep = rt.terminate(kid)
    assert rep.failure is not None and "cannot handle it" in rep.failure
    assert rep.failed_message is bad


def test_pool_tracks_buffers_by_weak_reference():
    import gc

    pool = resident.MemoryPool(backend="cpu")
    kept = pool.acquire((1000,), np.float32)
    lost = pool.acquire((1000,), np.float32)
    assert pool.stats().live_buffers == 2
    del lost
    gc.collect()
    st = pool.stats()
    assert (st.live_buffers, st.live_bytes) == (1, 4096), "a collected buffer is not live"
    pool.release(kept)
    assert pool.stats().live_buffers == 0 and pool.stats().pooled_buffers == 1
    with pytest.raises(ValueError):
        pool.release(kept)


# ---- 5: terminated kernels are freed ----------------------------------------------------------


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_kernel_churn_keeps_rss_flat():
    with resident.Runtime(backend="cpu", shutdown_timeout=1.0) as rt:
        def churn(n):
            for _ in range(n):
                kid = fresh("churn")
                rt.launch(kid, echo_body)
                rt.activate(kid)
                rt.terminate(kid)

        churn(100)  # warm-up: allocator pools, code paths
        base = rss_mb()
        churn(1000)
        grown = rss_mb() - base
        assert rt.kernel_ids == [], "terminated kernels are not listed"
        assert grown < 60, f"RSS grew by {grown:.0f} MB over 1000 kernels"
        # The last id is remembered as terminated: a late send is refused, message handed back.
        kid = fresh("churn")
        rt.launch(kid, echo_body)
        rt.terminate(kid)
        assert rt.state(kid) == "terminated"
        with pytest.raises(resident.KernelNotAcceptingError) as e:
            rt.send(kid, "late")
        assert e.value.message == "late"
        with pytest.raises(resident.KernelStateError):
            rt.activate(kid)
        rt.launch(kid, echo_body)  # the id can be launched again
        rt.activate(kid)
        assert rt.call(kid, 5, timeout=10) == ("echo", 5)


# ---- 6: expired calls release their requests ------------------------------------------------


def test_timed_out_calls_release_their_requests(rt):
    kid = fresh("idle")
    rt.launch(kid, echo_body)  # never activated: no request is taken
    payload = b"x" * 100_000
    for _ in range(200):
        with pytest.raises(resident.CallTimeoutError):
            rt.call(kid, payload, timeout=0.001)
    assert rt.get_telemetry(kid).objects_held == 0

    async def main():
        async with art() as a:
            k2 = fresh("idle")
            await a.launch(k2, echo_body)
            for _ in range(50):
                with pytest.raises(resident.CallTimeoutError):
                    await a.call(k2, payload, timeout=0.001)
            return a.get_telemetry(k2).objects_held

    assert asyncio.run(main()) == 0


def test_calls_given_up_on_a_busy_kernel_release_requests_and_late_replies(rt):
    kid = fresh("busy")
    rt.launch(kid, slow_echo(0.005))
    rt.activate(kid)
    payload = b"x" * 100_000
    timed_out = 0
    for _ in range(300):
        try:
            rt.call(kid, payload, timeout=0.001)  # a descheduled caller may still get it
        except resident.CallTimeoutError:
            timed_out += 1
    assert timed_out > 200
    deadline = time.monotonic() + 5
    while rt.get_telemetry(kid).objects_held and time.monotonic() < deadline:
        time.sleep(0.01)
    t = rt.get_telemetry(kid)
    assert t.messages_expired > 0 and t.messages_processed > 0
    assert t.objects_held == 0, "expired requests and late replies are released"


# ---- 7: idle kernels park -----------------------------------------------------------------------


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def test_idle_and_deactivated_kernels_use_no_cpu():
    with resident.Runtime(backend="cpu", shutdown_timeout=1.0) as rt:
        ids = [fresh("idle") for _ in range(60)]
        for kid in ids:
            rt.launch(kid, echo_body)
            rt.activate(kid)
            rt.deactivate(kid)  # its handler waits in ctx.wait_active()
        time.sleep(0.5)
        c0, t0 = cpu_seconds(), time.monotonic()
        time.sleep(2.0)
        used, wall = cpu_seconds() - c0, time.monotonic() - t0
        # Parked, 60 kernels use about 2% of a core (measured); polling, they used 25% or more.
        assert used < 0.1 * wall, f"60 parked kernels used {used:.2f} s of CPU in {wall:.1f} s"
        # Parked kernels still wake at once.
        rt.activate(ids[1])
        assert rt.call(ids[1], 1, timeout=5) == ("echo", 1)


# ---- 8: a clean exit with a stuck handler -----------------------------------------------------


@pytest.mark.parametrize("stuck", ["time.sleep(0.05)", "pass"])
def test_exit_after_an_abandoned_handler_does_not_abort(stuck):
    prog = textwrap.dedent(
        f"""
        import asyncio, time, resident

        async def stuck(ctx):
            await ctx.receive()
            while True:
                {stuck}

        rt = resident.Runtime(backend="cpu", shutdown_timeout=0.2, terminate_timeout=0.3)
        rt.launch("stuck", stuck)
        rt.activate("stuck")
        rt.send("stuck", 1)
        time.sleep(0.2)
        try:
            rt.terminate("stuck")
        except resident.ResidentError as e:
            print("terminate:", type(e).__name__)
        print("leaving")
        """
    )
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60)
    assert "leaving" in r.stdout, r.stderr
    assert "Fatal Python error" not in r.stderr, r.stderr
    assert r.returncode == 0, (r.returncode, r.stderr)


# ---- 11 and the liveness probe: nothing holds the loop ----------------------------------------


def test_the_loop_stays_live_across_the_api():
    dt = np.dtype([("v", "<i4")])
    bkid = fresh("probe_batch")
    resident.batch_kernel(kernel_id=bkid, in_dtype=dt, queue_size=64)(lambda s, b: b)

    async def main():
        async with art() as rt:
            async with Ticker() as tick:
                fast, slow = fresh("fast"), fresh("slow")
                await rt.launch(fast, plain_echo, queue_size=64)
                await rt.launch(slow, slow_echo(0.2))
                await rt.launch(bkid)
                for k in (fast, slow, bkid):
                    await rt.activate(k)

                async def producer():
                    for i in range(3000):
                        await rt.send(fast, i)

                task = asyncio.create_task(producer())
                for _ in range(3000):
                    await rt.receive(fast, timeout=30)
                await task
                assert await rt.call(slow, "s", timeout=10) == "s"
                with pytest.raises(resident.ReceiveTimeoutError):
                    await rt.receive(fast, timeout=0.2)
                # 1000 records into a queue of 64: sent as room comes, the loop going on.
                sender = asyncio.create_task(rt.send_batch(bkid, np.zeros(1000, dt)))
                got = 0
                while got < 1000:
                    got += len(await rt.receive_batch(bkid, 100, timeout=10))
                assert await sender == 1000
                await rt.send(slow, "pending")
                await rt.deactivate(slow)
                await rt.terminate(slow)
                await rt.terminate(fast)
                await rt.shutdown()
                await asyncio.sleep(0.05)
            return tick.worst

    worst = asyncio.run(main())
    # The issue asks for 50 ms; a shared 2-vCPU machine under another build needs slack.
    assert worst < 0.25, f"the loop was held for {worst * 1000:.0f} ms"


def test_launching_a_cudasim_device_kernel_does_not_hold_the_loop():
    dt = np.dtype([("v", "<i4")])
    src = (
        "__device__ bool handle(ResidentState* s, const ResidentIn* in, ResidentOut* out,"
        " const Envelope* e) { out->v = in->v + %d; return true; }" % (time.time_ns() % 100000)
    )
    kid = fresh("sim")
    resident.device_kernel(kernel_id=kid, in_dtype=dt, cuda=src)(lambda s, b: b)

    async def main():
        try:
            rt = RingKernelRuntime(backend="cudasim", shutdown_timeout=2.0, terminate_timeout=10.0)
        except resident.BackendNotAvailableError as e:
            pytest.skip(f"no CudaSim here: {e}")
        async with rt:
            async with Ticker() as tick:
                t0 = time.perf_counter()
                await rt.launch(kid)
                took = time.perf_counter() - t0
                await rt.activate(kid)
                await rt.send_batch(kid, np.zeros(3, dt))
                got = []
                while len(got) < 3:
                    got.extend((await rt.receive_batch(kid, 10, timeout=30)).tolist())
            return tick.worst, took

    worst, took = asyncio.run(main())
    assert worst < 0.25, f"launch ({took:.1f} s) held the loop for {worst * 1000:.0f} ms"

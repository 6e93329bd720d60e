"""Batch messaging for Python handlers (issue 30, part 4): ``ctx.receive_batch`` /
``ctx.send_batch`` in a ``@ring_kernel`` and ``send_batch`` / ``receive_batch`` of message
objects on both runtimes."""

import asyncio
import threading
import time
import zlib

import numpy as np
import pytest

import resident
from resident import (
    KernelNotAcceptingError,
    KernelNotFoundError,
    MessageTypeError,
    QueueFullError,
    SendTimeoutError,
)

from conftest import fresh


@resident.message
class Req:
    value: int = 0


@resident.message
class Resp:
    value: int = 0
    size: int = 0


def art(**kw):
    return resident.RingKernelRuntime(
        backend="cpu", shutdown_timeout=2.0, terminate_timeout=5.0, **kw
    )


def batch_doubler(max_batch, sizes=None):
    """A kernel that answers each message of each batch with its value * 2 (and the size of
    the batch it came in)."""

    async def body(ctx):
        while not ctx.should_terminate:
            if not ctx.is_active:
                await ctx.wait_active()
                continue
            batch = await ctx.receive_batch(max_batch, timeout=0.05)
            if not batch:
                continue
            if sizes is not None:
                sizes.append(len(batch))
            await ctx.send_batch(
                [Resp(value=m.value * 2, size=len(batch), correlation_id=m.message_id) for m in batch]
            )

    return body


# ---- every backend ------------------------------------------------------------------------

REQUIRE = {"cudasim": "RESIDENT_REQUIRE_CUDASIM", "wgpu": "RESIDENT_REQUIRE_WGPU"}


@pytest.mark.parametrize("backend", ["cpu", "cudasim", "wgpu"])
def test_batch_messaging_on_every_backend(backend):
    """A Python-handled kernel runs on the host whatever the runtime's backend (its handler is
    Python): the batch calls give the same answers on each. A backend that is not here is
    skipped, unless CI requires it (``RESIDENT_REQUIRE_*``)."""
    import os

    try:
        resident.Runtime(backend, shutdown_timeout=2.0, terminate_timeout=5.0).shutdown()
    except resident.BackendNotAvailableError as e:
        var = REQUIRE.get(backend)
        if var and os.environ.get(var):
            raise
        pytest.skip(f"backend {backend} is not available here: {e}")
    kid = fresh(f"bm_{backend}")
    sizes = []

    async def main():
        async with resident.RingKernelRuntime(
            backend=backend, shutdown_timeout=2.0, terminate_timeout=5.0
        ) as rt:
            await rt.launch(kid, batch_doubler(64, sizes))
            await rt.activate(kid)
            reqs = [Req(value=i) for i in range(1000)]
            sent = 0
            while sent < len(reqs):
                sent += await rt.send_batch(kid, reqs[sent : sent + 100])
            got = []
            while len(got) < 1000:
                got.extend(await rt.receive_batch(kid, 1000, timeout=10.0))
            return reqs, got

    reqs, got = asyncio.run(main())
    assert [r.value for r in got] == [2 * i for i in range(1000)]
    assert [r.correlation_id for r in got] == [r.message_id for r in reqs]
    assert max(sizes) <= 64 and sum(sizes) == 1000


# ---- order and max -----------------------------------------------------------------------


def test_order_preserved_and_max_respected():
    sizes = []
    kid = fresh("bm_order")

    async def main():
        async with art() as rt:
            await rt.launch(kid, batch_doubler(7, sizes))
            # Queued before activation: the kernel drains them in batches of at most 7.
            assert await rt.send_batch(kid, [Req(value=i) for i in range(100)]) == 100
            await rt.activate(kid)
            got = []
            while len(got) < 100:
                got.extend(await rt.receive_batch(kid, 1000, timeout=5.0))
            assert [r.value for r in got] == [2 * i for i in range(100)]
            assert max(sizes) <= 7 and sum(sizes) == 100
            assert sizes[0] == 7, sizes  # everything was queued: full batches
            # receive_batch's own max
            await rt.send_batch(kid, [Req(value=i) for i in range(10)])
            await asyncio.sleep(0.2)
            first = await rt.receive_batch(kid, 3, timeout=5.0)
            assert [r.value for r in first] == [0, 2, 4]
            rest = []
            while len(rest) < 7:
                rest.extend(await rt.receive_batch(kid, 100, timeout=5.0))
            assert [r.value for r in rest] == [2 * i for i in range(3, 10)]

    asyncio.run(main())


def test_blocking_runtime_batches(rt):
    kid = fresh("bm_sync")
    rt.launch(kid, batch_doubler(50))
    rt.activate(kid)
    assert rt.send_batch(kid, [Req(value=i) for i in range(300)]) == 300
    got = []
    while len(got) < 300:
        got.extend(rt.receive_batch(kid, 64, timeout=5.0))
    assert [r.value for r in got] == [2 * i for i in range(300)]
    assert rt.receive_batch(kid, 10) == []  # nothing left, no wait
    assert rt.receive_batch(kid, 0, timeout=1.0) == []


def test_priority_lanes_drain_highest_first(rt):
    kid = fresh("bm_prio")
    rt.launch(kid, batch_doubler(100))
    msgs = [Req(value=i, priority=0 if i < 5 else 255) for i in range(10)]
    assert rt.send_batch(kid, msgs) == 10
    rt.activate(kid)
    got = []
    while len(got) < 10:
        got.extend(rt.receive_batch(kid, 100, timeout=5.0))
    assert [r.value // 2 for r in got] == [5, 6, 7, 8, 9, 0, 1, 2, 3, 4]
    # an explicit priority for the whole batch
    assert rt.send_batch(kid, [Req(value=1)], priority=7) == 1
    with pytest.raises(ValueError):
        rt.send_batch(kid, [Req(value=1)], priority=300)


# ---- timeouts ----------------------------------------------------------------------------


def test_kernel_receive_batch_timeout_is_bounded():
    kid = fresh("bm_timeout")
    waits = []

    async def body(ctx):
        while not ctx.should_terminate:
            if not ctx.is_active:
                await ctx.wait_active()
                continue
            t0 = time.monotonic()
            batch = await ctx.receive_batch(10, timeout=0.05)
            waits.append((time.monotonic() - t0, len(batch)))
            if batch:
                await ctx.send_batch([("got", len(batch))])

    async def main():
        async with art() as rt:
            await rt.launch(kid, body)
            await rt.activate(kid)
            await asyncio.sleep(0.3)
            await rt.send_batch(kid, [Req(value=1), Req(value=2)])
            out = await rt.receive_batch(kid, 10, timeout=5.0)
            assert out and out[0][0] == "got"
            await rt.terminate(kid)
        empty = [w for w, n in waits if n == 0]
        assert len(empty) >= 3
        # each empty wait lasted about the timeout, never far past it
        assert all(0.04 <= w < 0.5 for w in empty), empty

    asyncio.run(main())


def test_runtime_receive_batch_timeout_returns_what_arrived():
    kid = fresh("bm_rtimeout")

    async def main():
        async with art() as rt:
            await rt.launch(kid, batch_doubler(10))
            await rt.activate(kid)
            t0 = time.monotonic()
            assert await rt.receive_batch(kid, 10, timeout=0.1) == []
            dt = time.monotonic() - t0
            assert 0.09 <= dt < 1.0, dt
            assert await rt.receive_batch(kid, 10) == []  # timeout 0: no wait
            await rt.send_batch(kid, [Req(value=3)])
            got = await rt.receive_batch(kid, 10, timeout=5.0)
            assert [r.value for r in got] == [6]

    asyncio.run(main())
    r = resident.Runtime(backend="cpu")
    try:
        k2 = fresh("bm_rtimeout_sync")
        r.launch(k2, batch_doubler(10))
        r.activate(k2)
        t0 = time.monotonic()
        assert r.receive_batch(k2, 10, timeout=0.1) == []
        assert 0.09 <= time.monotonic() - t0 < 1.0
    finally:
        r.shutdown()


# ---- empty batches and wrong types -----------------------------------------------------


def test_empty_send_batch_is_a_no_op():
    kid = fresh("bm_empty")
    seen = []

    async def body(ctx):
        while not ctx.should_terminate:
            if not ctx.is_active:
                await ctx.wait_active()
                continue
            batch = await ctx.receive_batch(10, timeout=0.05)
            await ctx.send_batch([])  # nothing, every time
            await ctx.send_batch(())
            if batch:
                seen.extend(batch)
                await ctx.send_batch(batch)

    async def main():
        async with art() as rt:
            await rt.launch(kid, body)
            await rt.activate(kid)
            assert await rt.send_batch(kid, []) == 0
            assert rt.sync.send_batch(kid, []) == 0
            await asyncio.sleep(0.2)
            t = rt.get_telemetry(kid)
            assert t.messages_received == 0 and t.output_depth == 0
            assert await rt.receive_batch(kid, 10, timeout=0.05) == []
            await rt.send_batch(kid, ["x"])
            assert await rt.receive_batch(kid, 10, timeout=5.0) == ["x"]

    asyncio.run(main())


def test_wrong_message_types_are_typed_errors(rt):
    kid = fresh("bm_types")
    rt.launch(kid, batch_doubler(10))
    rt.activate(kid)
    dt = np.dtype([("v", "<i4")])
    for bad in (np.zeros(3, dt), "abc", b"abc", {"a": 1}, 5):
        with pytest.raises(MessageTypeError):
            rt.send_batch(kid, bad)
    with pytest.raises(TypeError):  # MessageTypeError is a TypeError
        rt.send_batch(kid, np.arange(3))
    with pytest.raises(MessageTypeError):
        rt.receive_batch(kid, 10, out=np.zeros(10, dt))
    with pytest.raises(ValueError):
        rt.send_batch(kid, [Req(value=1), Req(value=2, priority=999)])
    assert rt.get_telemetry(kid).messages_received == 0  # checked before any was sent
    with pytest.raises(KernelNotFoundError):
        rt.send_batch(fresh("nobody"), [Req()])
    with pytest.raises(KernelNotFoundError):
        rt.send_batch(fresh("nobody"), np.zeros(2, dt))
    with pytest.raises(KernelNotFoundError):
        rt.receive_batch(fresh("nobody"), 10)
    # a generator is a batch too
    assert rt.send_batch(kid, (Req(value=i) for i in range(3))) == 3
    got = []
    while len(got) < 3:
        got.extend(rt.receive_batch(kid, 10, timeout=5.0))
    # a batch kernel still takes records only
    bkid = fresh("bm_types_records")
    resident.batch_kernel(kernel_id=bkid, in_dtype=dt)(lambda s, b: b)
    rt.launch(bkid)
    with pytest.raises(resident.DtypeLayoutError):
        rt.send_batch(bkid, [Req()])
    # a terminated kernel refuses and hands the batch back
    rep = rt.terminate(kid)
    assert rep.failure is None
    msgs = [Req(value=1), Req(value=2)]
    with pytest.raises(KernelNotAcceptingError) as e:
        rt.send_batch(kid, msgs)
    assert e.value.message == msgs


def test_handler_with_wrong_batch_types_fails_with_typed_error():
    kid = fresh("bm_ctx_types")
    errors = []

    async def body(ctx):
        while not ctx.should_terminate:
            if not ctx.is_active:
                await ctx.wait_active()
                continue
            batch = await ctx.receive_batch(10, timeout=0.05)
            if not batch:
                continue
            for bad in (np.zeros(2), "text", 7):
                try:
                    await ctx.send_batch(bad)
                except MessageTypeError as e:
                    errors.append(type(e).__name__)
            for bad_max in (0, -1, 1.5):
                try:
                    await ctx.receive_batch(bad_max)
                except ValueError:
                    errors.append("ValueError")
            try:
                await ctx.send_batch(batch, reply_to=batch[:-1] + [object()])
            except ValueError:
                errors.append("reply_to")
            await ctx.send_batch([m.value for m in reversed(batch)], reply_to=list(reversed(batch)))

    async def main():
        async with art() as rt:
            await rt.launch(kid, body)
            await rt.activate(kid)
            await rt.send_batch(kid, [Req(value=1), Req(value=2)])
            got = []
            while len(got) < 2:
                got.extend(await rt.receive_batch(kid, 10, timeout=5.0))
            assert sorted(got) == [1, 2]
            assert rt.state(kid) == "active"

    asyncio.run(main())
    assert errors[:3] == ["MessageTypeError"] * 3
    assert errors[3:7] == ["ValueError", "ValueError", "ValueError", "reply_to"]


# ---- replies -----------------------------------------------------------------------------


def test_calls_answered_through_a_batch():
    kid = fresh("bm_calls")

    async def main():
        async with art() as rt:
            await rt.launch(kid, batch_doubler(32))
            await rt.activate(kid)
            replies = await asyncio.gather(
                *(rt.call(kid, Req(value=i), timeout=5.0) for i in range(50))
            )
            assert [r.value for r in replies] == [2 * i for i in range(50)]
            assert rt.get_telemetry(kid).output_depth == 0

    asyncio.run(main())


# ---- backpressure ------------------------------------------------------------------------


def test_full_queue_waits_bounded_then_typed_error_with_messages_back():
    kid = fresh("bm_full")
    gate = threading.Event()

    async def stuck(ctx):
        while not ctx.should_terminate:
            if not ctx.is_active:
                await ctx.wait_active()
                continue
            if not gate.is_set():
                await asyncio.sleep(0.01)
                continue
            batch = await ctx.receive_batch(64, timeout=0.05)
            if batch:
                await ctx.send_batch(batch)

    async def main():
        async with art() as rt:
            await rt.launch(kid, stuck, queue_size=16, priority_lanes=1, block_timeout=0.2)
            await rt.activate(kid)
            assert await rt.send_batch(kid, [Req(value=i) for i in range(10)]) == 10
            # 6 fit, then the send waits the block timeout for room and says how many went
            t0 = time.monotonic()
            assert await rt.send_batch(kid, [Req(value=i) for i in range(10, 20)]) == 6
            assert 0.15 <= time.monotonic() - t0 < 2.0
            late = [Req(value=99), Req(value=100)]
            t0 = time.monotonic()
            with pytest.raises(SendTimeoutError) as e:
                await rt.send_batch(kid, late)
            assert 0.15 <= time.monotonic() - t0 < 2.0
            assert e.value.message == late  # nothing lost: handed back
            # the blocking runtime: same bound, same error
            with pytest.raises(SendTimeoutError) as e:
                rt.sync.send_batch(kid, late)
            assert e.value.message == late
            # a waiting send completes once the kernel makes room
            task = asyncio.create_task(rt.send_batch(kid, [Req(value=i) for i in range(16, 30)]))
            await asyncio.sleep(0.05)
            gate.set()
            assert await task == 14
            got = []
            while len(got) < 30:
                got.extend(await rt.receive_batch(kid, 100, timeout=5.0))
            assert [m.value for m in got] == list(range(30))

    asyncio.run(main())


def test_reject_policy_returns_count_and_raises_when_none_fit(rt):
    kid = fresh("bm_reject")
    rt.launch(kid, batch_doubler(8), queue_size=4, priority_lanes=1, backpressure="reject")
    msgs = [Req(value=i) for i in range(6)]
    assert rt.send_batch(kid, msgs) == 4  # msgs[4:] not sent
    with pytest.raises(QueueFullError) as e:
        rt.send_batch(kid, msgs[4:])
    assert e.value.message == msgs[4:]
    rt.activate(kid)
    got = []
    while len(got) < 4:
        got.extend(rt.receive_batch(kid, 10, timeout=5.0))
    assert [r.value for r in got] == [0, 2, 4, 6]


def test_stress_several_producers_nothing_lost():
    """Several producer tasks and a thread send batches into a small queue under ``block``;
    every message arrives once (count and checksum), none is lost on a timeout: what a send
    did not take is sent again."""
    kid = fresh("bm_stress")
    producers, per = 4, 3000

    async def main():
        async with art() as rt:
            await rt.launch(kid, batch_doubler(100), queue_size=64, block_timeout=0.05)
            await rt.activate(kid)
            timeouts = [0]

            async def produce(p):
                i = 0
                while i < per:
                    chunk = [Req(value=p * per + j) for j in range(i, min(i + 97, per))]
                    k = 0
                    while k < len(chunk):
                        try:
                            k += await rt.send_batch(kid, chunk[k:])
                        except SendTimeoutError as e:
                            timeouts[0] += 1
                            assert e.message == chunk[k:]
                    i += len(chunk)

            def thread_producer():
                base = producers * per
                i = 0
                while i < per:
                    chunk = [Req(value=base + j) for j in range(i, min(i + 50, per))]
                    k = 0
                    while k < len(chunk):
                        try:
                            k += rt.sync.send_batch(kid, chunk[k:])
                        except SendTimeoutError:
                            timeouts[0] += 1
                    i += len(chunk)

            th = threading.Thread(target=thread_producer)
            total = (producers + 1) * per
            tasks = [asyncio.create_task(produce(p)) for p in range(producers)]
            th.start()
            got = []
            while len(got) < total:
                got.extend(await rt.receive_batch(kid, 500, timeout=10.0))
            await asyncio.gather(*tasks)
            await asyncio.to_thread(th.join)
            assert await rt.receive_batch(kid, 10, timeout=0.1) == []
            values = sorted(r.value // 2 for r in got)
            assert values == list(range(total))
            crc = lambda xs: zlib.crc32(np.asarray(sorted(xs), np.int64).tobytes())
            assert crc(r.value // 2 for r in got) == crc(range(total))
            t = rt.get_telemetry(kid)
            assert t.messages_received == total and t.messages_dropped == 0
            assert t.objects_held == 0

    asyncio.run(main())


# ---- cancellation ------------------------------------------------------------------------


def test_cancelled_runtime_receive_batch_takes_nothing():
    kid = fresh("bm_cancel_rt")

    async def main():
        async with art() as rt:
            await rt.launch(kid, batch_doubler(10))
            await rt.activate(kid)
            got = []
            for i in range(20):
                task = asyncio.create_task(rt.receive_batch(kid, 10, timeout=10.0))
                await asyncio.sleep(0)
                await rt.send_batch(kid, [Req(value=i)])
                if i % 2:
                    task.cancel()
                    try:
                        got.extend(await task)  # it may have finished first
                    except asyncio.CancelledError:
                        pass
                else:
                    got.extend(await task)
            while len(got) < 20:
                got.extend(await rt.receive_batch(kid, 10, timeout=5.0))
            assert sorted(r.value // 2 for r in got) == list(range(20))

    asyncio.run(main())


def test_cancelled_kernel_receive_batch_loses_nothing():
    """Inside the handler, a ``receive_batch`` awaited by a task that is cancelled took
    nothing: every message is answered by the next one."""
    kid = fresh("bm_cancel_ctx")
    cancels = []

    async def body(ctx):
        while not ctx.should_terminate:
            if not ctx.is_active:
                await ctx.wait_active()
                continue
            t = asyncio.ensure_future(ctx.receive_batch(10, timeout=0.2))
            # A second task on the loop makes the wait yield to it every slice.
            await asyncio.sleep(0.003)
            if not t.done():
                t.cancel()
            try:
                batch = await t
            except asyncio.CancelledError:
                if ctx.should_terminate:
                    return
                cancels.append(1)
                continue
            if batch:
                await ctx.send_batch(batch)

    async def main():
        async with art() as rt:
            await rt.launch(kid, body)
            await rt.activate(kid)
            n = 0
            got = []
            for r in range(40):
                await rt.send_batch(kid, [n + j for j in range(3)])
                n += 3
                await asyncio.sleep(0.004 if r % 2 else 0.0)
                got.extend(await rt.receive_batch(kid, 100, timeout=0.01))
            while len(got) < n:
                got.extend(await rt.receive_batch(kid, 100, timeout=5.0))
            assert sorted(got) == list(range(n))
            await asyncio.sleep(0.1)
            assert await rt.receive_batch(kid, 100) == []

    asyncio.run(main())
    assert cancels, "no receive_batch was cancelled while waiting"


def test_replies_named_by_reply_to_carry_the_request_correlation_id():
    """``ctx.send_batch(replies, reply_to=requests)`` and ``ctx.send(reply, reply_to=req)``
    set each reply's ``correlation_id`` to its request's ``message_id`` (left as it is when
    the reply already names one); the callers get their own replies."""

    async def body(ctx):
        while not ctx.should_terminate:
            if not ctx.is_active:
                await ctx.wait_active()
                continue
            batch = await ctx.receive_batch(16, timeout=0.05)
            if not batch:
                continue
            # Answered out of order, each named by reply_to: the last one singly.
            head = list(reversed(batch[:-1]))
            await ctx.send_batch([Resp(value=m.value * 2) for m in head], reply_to=head)
            await ctx.send(Resp(value=batch[-1].value * 2), reply_to=batch[-1])

    async def main():
        async with art() as rt:
            kid = fresh("corr")
            await rt.launch(kid, body)
            await rt.activate(kid)
            reqs = [Req(value=i) for i in range(6)]
            sent = await rt.send_batch(kid, reqs)
            assert sent == 6
            got = []
            while len(got) < 6:
                got += await rt.receive_batch(kid, 6, timeout=5)
            calls = [Req(value=100 + i) for i in range(4)]
            replies = await asyncio.gather(*(rt.call(kid, r, timeout=5) for r in calls))
            return reqs, got, calls, replies

    reqs, got, calls, replies = asyncio.run(main())
    by_id = {r.message_id: r for r in reqs}
    assert all(g.correlation_id in by_id for g in got)
    assert sorted(by_id[g.correlation_id].value * 2 for g in got) == sorted(g.value for g in got)
    for c, r in zip(calls, replies):
        assert r.correlation_id == c.message_id and r.value == c.value * 2

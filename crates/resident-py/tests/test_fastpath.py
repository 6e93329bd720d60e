"""The handler's fast path (one engine call per received or sent message, envelopes kept by
the binding for replies), the GIL hand-offs between a kernel's thread and its waiters, and
the cheap message ids."""

import asyncio
import copy
import os
import pickle
import threading
import time
import uuid

import pytest

import resident
import resident._resident as _resident
from resident import RingKernelRuntime, message, ring_kernel
from resident.message import new_id
from conftest import fresh


@message
class Req:
    v: int = 0


def test_handler_that_suspends_replies_out_of_order_matched_by_correlation(rt):
    # Takes two requests (or one, when no second comes within 20 ms), suspends on its event
    # loop (a real await of the loop), then answers the second before the first: each call
    # still gets its own reply.
    async def swapper(ctx):
        while not ctx.should_terminate:
            try:
                a = await ctx.receive(timeout=0.05)
            except asyncio.TimeoutError:
                continue
            try:
                b = await ctx.receive(timeout=0.02)
            except asyncio.TimeoutError:
                b = None
            await asyncio.sleep(0.0005)
            if b is not None:
                await ctx.send(b.reply(v=b.v * 10))
                await asyncio.sleep(0)
            await ctx.send(a.reply(v=a.v * 10))

    kid = fresh("swap")
    rt.launch(kid, swapper)
    rt.activate(kid)
    errors = []

    def worker(base):
        try:
            for i in range(50):
                assert rt.call(kid, Req(v=base + i), timeout=10).v == 10 * (base + i)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(k * 1000,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    assert rt.get_telemetry(kid).messages_processed == 200


def test_none_is_a_message_on_the_asyncio_path():
    kid = fresh("none")

    @ring_kernel(kernel_id=kid)
    async def ident(ctx):
        while not ctx.should_terminate:
            try:
                m = await ctx.receive(timeout=0.05)
            except asyncio.TimeoutError:
                continue
            await ctx.send(m)

    async def main():
        async with RingKernelRuntime(backend="cpu") as runtime:
            await runtime.launch(kid)
            await runtime.activate(kid)
            objs = [None, 0, None, "", None]
            for o in objs:
                await runtime.send(kid, o)
            got = [await runtime.receive(kid, timeout=5) for _ in objs]
            assert got == objs
            with pytest.raises(asyncio.TimeoutError):
                await runtime.receive(kid, timeout=0.05)

    asyncio.run(main())


def test_unhashable_message_id_replies_to_the_last_message(rt):
    class Odd:
        def __init__(self, v):
            self.v = v
            self.message_id = [v]  # unhashable
            self.correlation_id = None

    async def answer(ctx):
        while not ctx.should_terminate:
            try:
                m = await ctx.receive(timeout=0.05)
            except asyncio.TimeoutError:
                continue
            out = Odd(m.v + 1)
            out.correlation_id = m.message_id
            await ctx.send(out)

    kid = fresh("odd")
    rt.launch(kid, answer)
    rt.activate(kid)
    for i in range(20):
        assert rt.call(kid, Odd(i), timeout=10).v == i + 1


def test_pending_envelopes_are_bounded_and_the_newest_kept(rt):
    # 5000 messages received before any reply: the binding keeps the newest 4096 envelopes;
    # a reply to an older one answers the last message received (as documented).
    n = 5000
    done = threading.Event()

    async def hoard(ctx):
        got = []
        while not ctx.should_terminate and len(got) < n:
            try:
                got.append(await ctx.receive(timeout=0.05))
            except asyncio.TimeoutError:
                continue
        for m in got:
            await ctx.send(m.reply(v=m.v))
        done.set()
        while not ctx.should_terminate:
            await asyncio.sleep(0.01)

    kid = fresh("hoard")
    rt.launch(kid, hoard, queue_size=8192, output_queue_size=8192)
    ids = [rt.send(kid, Req(v=i)) for i in range(n)]
    rt.activate(kid)
    # The binding's receive: (object, (message_id, correlation_id)).
    outs = [rt._rt.receive(kid, 10.0) for _ in range(n)]
    assert done.wait(10)
    assert [o[0].v for o in outs] == list(range(n)), "FIFO kept"
    corr = [o[1][1] for o in outs]
    evicted = n - 4096
    assert corr[:evicted] == [ids[-1]] * evicted
    assert corr[evicted:] == ids[evicted:]
    assert rt.get_telemetry(kid).objects_held == 0


def test_concurrent_callers_from_threads_and_asyncio_tasks_at_once():
    kid = fresh("mixed")

    @ring_kernel(kernel_id=kid, queue_size=1024)
    async def inc(ctx):
        while not ctx.should_terminate:
            try:
                m = await ctx.receive(timeout=0.05)
            except asyncio.TimeoutError:
                continue
            await ctx.send(m.reply(v=m.v + 1))

    errors = []

    async def main():
        async with RingKernelRuntime(backend="cpu") as runtime:
            await runtime.launch(kid)
            await runtime.activate(kid)

            def worker(base):
                try:
                    for i in range(150):
                        r = runtime.sync.call(kid, Req(v=base + i), timeout=10)
                        assert r.v == base + i + 1
                except Exception as e:  # pragma: no cover - reported below
                    errors.append(e)

            ts = [threading.Thread(target=worker, args=((k + 1) * 100_000,)) for k in range(3)]
            for t in ts:
                t.start()
            res = await asyncio.gather(*(runtime.call(kid, Req(v=i), timeout=10) for i in range(300)))
            # Sends and receives in order on the loop while the others call.
            for i in range(100):
                await runtime.send(kid, Req(v=-i))
            got = [(await runtime.receive(kid, timeout=10)).v for _ in range(100)]
            await asyncio.get_running_loop().run_in_executor(None, lambda: [t.join() for t in ts])
            assert [r.v for r in res] == [i + 1 for i in range(300)]
            assert got == [1 - i for i in range(100)]
            assert runtime.get_telemetry(kid).messages_processed == 300 + 450 + 100

    asyncio.run(main())
    assert not errors, errors


def test_a_waiter_is_not_held_by_a_handler_busy_in_python_after_replying(rt):
    # After its reply the handler computes in Python for 0.3 s without waiting: the waiter
    # spins only briefly for the kernel's thread to leave Python, then takes the GIL as any
    # thread does (the interpreter's switch interval), long before the handler is done.
    async def busy(ctx):
        while not ctx.should_terminate:
            try:
                m = await ctx.receive(timeout=0.05)
            except asyncio.TimeoutError:
                continue
            await ctx.send(m.reply(v=m.v + 1))
            end = time.monotonic() + 0.3
            x = 0
            while time.monotonic() < end:
                x += 1

    kid = fresh("busy")
    rt.launch(kid, busy)
    rt.activate(kid)
    t0 = time.monotonic()
    assert rt.call(kid, Req(v=1), timeout=10).v == 2
    assert time.monotonic() - t0 < 0.25


def test_message_ids_are_fresh_version_4_uuids():
    ids = [new_id() for _ in range(50_000)]
    assert len(set(ids)) == len(ids)
    for u in ids[:100]:
        assert isinstance(u, uuid.UUID) and u.version == 4 and u.variant == uuid.RFC_4122
        assert uuid.UUID(str(u)) == u and hash(uuid.UUID(str(u))) == hash(u)
    assert Req().message_id != Req().message_id
    # Made in the extension: a plain uuid.UUID in every way (pickle, copy, ordering, bits).
    u = ids[0]
    assert pickle.loads(pickle.dumps(u)) == u and copy.deepcopy(u) == u
    assert u.is_safe == uuid.SafeUUID.unknown and u.int < 1 << 128
    assert sorted(ids[:3]) == sorted(ids[:3], key=lambda v: v.int)
    # Every bit other than the version's and the variant's varies.
    ones = zeros = 0
    for v in ids[:2000]:
        ones |= v.int
        zeros |= ~v.int & ((1 << 128) - 1)
    fixed = (0xF000 << 64) | (0xC000 << 48)
    assert ones | fixed == (1 << 128) - 1 and zeros | fixed == (1 << 128) - 1


def test_message_id_seed_is_checked():
    with pytest.raises(ValueError, match="32 bytes"):
        _resident.seed_ids(b"short")
    _resident.seed_ids(bytes(32))  # the all-zero state is mended, not kept
    a, b = new_id(), new_id()
    assert a != b and a.int != 0
    _resident.seed_ids(os.urandom(32))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_forked_child_draws_other_message_ids():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        os.write(w, new_id().bytes)
        os._exit(0)
    os.close(w)
    child = os.read(r, 16)
    os.close(r)
    os.waitpid(pid, 0)
    mine = new_id().bytes
    assert len(child) == 16 and child != mine

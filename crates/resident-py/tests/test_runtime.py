"""Lifecycle, messages, priorities, call, errors, telemetry of Python kernels on the engine."""

import asyncio
import threading
import time

import pytest

import resident
from resident import (
    KernelFailedError,
    KernelNotFoundError,
    KernelStateError,
    QueueFullError,
    ReceiveTimeoutError,
    RingKernelRuntime,
    message,
    ring_kernel,
)
from conftest import echo_body, fresh


def launch_echo(rt, **kw):
    kid = fresh("echo")
    rt.launch(kid, echo_body, **kw)
    return kid


def test_lifecycle_and_invalid_transitions(rt):
    kid = launch_echo(rt)
    assert rt.state(kid) == "launched"
    with pytest.raises(KernelStateError) as e:
        rt.deactivate(kid)
    assert e.value.state == "launched" and e.value.kernel_id == kid
    rt.send(kid, 1)  # queues while launched
    rt.activate(kid)
    assert rt.state(kid) == "active"
    assert rt.receive(kid, timeout=5) == ("echo", 1)
    with pytest.raises(KernelStateError):
        rt.activate(kid)
    rt.deactivate(kid)
    assert rt.state(kid) == "inactive"
    rt.send(kid, 2)
    with pytest.raises(ReceiveTimeoutError):
        rt.receive(kid, timeout=0.2)  # inactive: nothing processed
    rt.activate(kid)
    assert rt.receive(kid, timeout=5) == ("echo", 2)
    rep = rt.terminate(kid)
    assert rt.state(kid) == "terminated"
    assert rep.processed == 2 and rep.failure is None
    with pytest.raises(KernelStateError):
        rt.activate(kid)
    with pytest.raises(resident.KernelNotAcceptingError) as e:
        rt.send(kid, "late")
    assert e.value.message == "late", "a refused send hands its message back"


def test_unknown_kernel_and_duplicate(rt):
    with pytest.raises(KernelNotFoundError):
        rt.send("nope", 1)
    with pytest.raises(KernelNotFoundError):
        rt.launch("not_registered_anywhere")
    kid = launch_echo(rt)
    with pytest.raises(resident.DuplicateKernelError):
        rt.launch(kid, echo_body)


def test_any_python_object_is_a_message(rt):
    kid = launch_echo(rt)
    rt.activate(kid)
    objs = [None, 3.5, "s", b"b", {"k": [1, 2]}, object(), (1, (2, 3))]
    for o in objs:
        rt.send(kid, o)
    got = [rt.receive(kid, timeout=5)[1] for _ in objs]
    assert all(a is b for a, b in zip(got, objs)), "the very objects come back"


def test_priorities_higher_first_fifo_within_lane(rt):
    kid = launch_echo(rt, priority_lanes=4)
    # Queued while launched, then drained: lane order (255 lane first), FIFO inside.
    order = [(0, "low0"), (255, "hi0"), (128, "mid0"), (255, "hi1"), (0, "low1"), (130, "mid1")]
    for p, v in order:
        rt.send(kid, v, priority=p)
    rt.activate(kid)
    got = [rt.receive(kid, timeout=5)[1] for _ in order]
    assert got == ["hi0", "hi1", "mid0", "mid1", "low0", "low1"]
    with pytest.raises(ValueError):
        rt.send(kid, 1, priority=256)


def test_message_dataclass_priority_and_reply(rt):
    @message
    class Req:
        x: float

    r = Req(x=1.0)
    assert r.priority == 128 and r.correlation_id is None and r.message_id is not None
    assert Req(x=1.0).message_id != r.message_id
    with pytest.raises(ValueError):
        Req(x=1.0, priority=300)
    rep = r.reply(x=2.0)
    assert rep.correlation_id == r.message_id

    kid = fresh("prio")
    rt.launch(kid, echo_body)
    rt.send(kid, Req(x=1.0, priority=0))
    rt.send(kid, Req(x=2.0, priority=255))
    rt.activate(kid)
    assert [rt.receive(kid, timeout=5)[1].x for _ in range(2)] == [2.0, 1.0]


def test_reject_policy_hands_back_the_message(rt):
    kid = launch_echo(rt, queue_size=2, priority_lanes=1, backpressure="reject")
    rt.send(kid, 0)
    rt.send(kid, 1)
    payload = {"id": 2}
    with pytest.raises(QueueFullError) as e:
        rt.send(kid, payload)
    assert e.value.message is payload
    t = rt.get_telemetry(kid)
    assert t.messages_refused == 1 and t.queue_depth == 2


def test_block_policy_times_out_with_message(rt):
    kid = launch_echo(rt, queue_size=1, priority_lanes=1, backpressure="block", block_timeout=0.1)
    rt.send(kid, 0)
    t0 = time.monotonic()
    with pytest.raises(resident.SendTimeoutError) as e:
        rt.send(kid, "x")
    assert 0.05 < time.monotonic() - t0 < 3
    assert e.value.message == "x"
    assert isinstance(e.value, TimeoutError) and isinstance(e.value, asyncio.TimeoutError)


@pytest.mark.parametrize("policy,expect", [("drop_oldest", [2, 3]), ("drop_newest", [0, 1])])
def test_drop_policies_count_and_release(rt, policy, expect):
    kid = launch_echo(rt, queue_size=2, priority_lanes=1, backpressure=policy)
    for i in range(4):
        rt.send(kid, i)
    t = rt.get_telemetry(kid)
    assert t.messages_dropped == 2
    assert t.messages_expired == 0, "dropped is not expired"
    assert t.objects_held == 2, "dropped messages are released, not leaked"
    rt.activate(kid)
    assert [rt.receive(kid, timeout=5)[1] for _ in range(2)] == expect


def test_call_matched_by_correlation_from_threads(rt):
    @message
    class Req:
        v: int = 0

    async def doubler(ctx):
        while not ctx.should_terminate:
            try:
                m = await ctx.receive(timeout=0.05)
            except asyncio.TimeoutError:
                continue
            await ctx.send(m.reply(v=m.v * 2))

    kid = fresh("dbl")
    rt.launch(kid, doubler)
    rt.activate(kid)
    errors = []

    def worker(base):
        try:
            for i in range(200):
                assert rt.call(kid, Req(v=base + i), timeout=10).v == 2 * (base + i)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(k * 10_000,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    assert rt.get_telemetry(kid).messages_processed == 800


def test_call_sends_its_deadline_so_stale_calls_expire_unhandled(rt):
    """A storm of calls that give up after 1 ms against a 50 ms handler: the requests carry
    their deadline, so the kernel skips the stale ones (counted as expired) and a fresh call is
    served at once instead of after every stale one (up to 40 x 50 ms = 2 s, past its 1 s
    timeout)."""

    @message
    class Req:
        v: int = 0

    handled = []

    async def slow(ctx):
        while not ctx.should_terminate:
            try:
                m = await ctx.receive(timeout=0.05)
            except asyncio.TimeoutError:
                continue
            handled.append(m.v)
            time.sleep(0.05)  # 50 ms of work on the kernel's thread
            await ctx.send(m.reply(v=m.v))

    kid = fresh("slow")
    rt.launch(kid, slow)
    rt.activate(kid)
    timed_out = 0
    for i in range(40):
        # On a loaded machine this thread may sleep past a reply: count, do not insist.
        try:
            rt.call(kid, Req(v=i), timeout=0.001)
        except resident.CallTimeoutError:
            timed_out += 1
    assert timed_out >= 30, timed_out
    assert rt.call(kid, Req(v=1000), timeout=1.0).v == 1000
    tel = rt.get_telemetry(kid)
    # Every storm call was handled or expired; a handled one takes 50 ms, in which the calls
    # sent meanwhile expire, so most of them do.
    assert tel.messages_expired + len(handled) == 41, (tel, handled)
    assert tel.messages_expired >= 20, (tel, handled)
    assert handled[-1] == 1000, handled
    # A call without a timeout carries no deadline: it waits its turn and is served.
    assert rt.call(kid, Req(v=7)).v == 7


def test_call_from_asyncio_tasks():
    @message
    class Req:
        v: int = 0

    kid = fresh("acall")

    @ring_kernel(kernel_id=kid, queue_size=1024)
    async def inc(ctx):
        while not ctx.should_terminate:
            if not ctx.is_active:
                await ctx.wait_active()
                continue
            try:
                m = await ctx.receive(timeout=0.05)
            except asyncio.TimeoutError:
                continue
            await asyncio.sleep(0.001 if m.v % 7 == 0 else 0)  # some replies are slow
            await ctx.send(m.reply(v=m.v + 1))

    async def main():
        async with RingKernelRuntime(backend="cpu") as runtime:
            await runtime.launch(kid)
            await runtime.activate(kid)
            loop_ticks = 0

            async def ticker():
                nonlocal loop_ticks
                while True:
                    loop_ticks += 1
                    await asyncio.sleep(0.001)

            tick = asyncio.ensure_future(ticker())
            res = await asyncio.gather(*(runtime.call(kid, Req(v=i), timeout=10) for i in range(300)))
            tick.cancel()
            assert [r.v for r in res] == [i + 1 for i in range(300)]
            assert loop_ticks > 0, "the event loop kept running during the calls"
            with pytest.raises(asyncio.TimeoutError):
                await runtime.receive(kid, timeout=0.05)

    asyncio.run(main())


def test_handler_that_raises_fails_kernel_and_tells_callers(rt):
    async def bad(ctx):
        while not ctx.should_terminate:
            try:
                m = await ctx.receive(timeout=0.05)
            except asyncio.TimeoutError:
                continue
            if m == "boom":
                raise ValueError("handler exploded")
            await ctx.send(m)

    kid = fresh("bad")
    rt.launch(kid, bad)
    rt.activate(kid)
    assert rt.call(kid, "ok", timeout=5) == "ok"
    t0 = time.monotonic()
    with pytest.raises(KernelFailedError) as e:
        rt.call(kid, "boom", timeout=30)
    assert time.monotonic() - t0 < 5, "the caller is told at once, not at its timeout"
    assert "handler exploded" in str(e.value) and "ValueError" in e.value.reason
    assert rt.state(kid) == "failed"
    with pytest.raises(resident.KernelNotAcceptingError):
        rt.send(kid, "after")
    rep = rt.terminate(kid)
    assert rep.failure is not None and "handler exploded" in rep.failure


def test_telemetry_is_real(rt):
    kid = launch_echo(rt)
    rt.activate(kid)
    for i in range(100):
        rt.send(kid, i)
    for _ in range(100):
        rt.receive(kid, timeout=5)
    t = rt.get_telemetry(kid)
    assert t.messages_received == 100 and t.messages_processed == 100
    assert t.latency_count == 100 and 0 < t.latency_p50_ns <= t.latency_p99_ns <= t.latency_max_ns
    assert t.throughput > 0 and t.queue_depth == 0 and t.uptime_seconds > 0
    assert t.objects_held == 0


def test_shutdown_hands_back_undelivered():
    r = resident.Runtime(backend="cpu", shutdown_timeout=0.5)
    kid = fresh("sd")
    r.launch(kid, echo_body)  # never activated: everything stays queued
    sent = [object() for _ in range(10)]
    for o in sent:
        r.send(kid, o)
    reps = r.shutdown()
    assert len(reps) == 1 and reps[0].kernel_id == kid
    assert all(a is b for a, b in zip(reps[0].undelivered, sent)) and len(reps[0].undelivered) == 10
    assert r.shutdown() is reps


def test_bad_arguments():
    with pytest.raises(ValueError):
        resident.Runtime(backend="quantum")
    with pytest.raises(ValueError):
        ring_kernel(kernel_id=fresh("x"), backpressure="sometimes")(echo_body)
    with pytest.raises(TypeError):
        ring_kernel(kernel_id=fresh("x"))(lambda ctx: None)
    with resident.Runtime(backend="cpu") as r:
        kid = launch_echo(r)
        with pytest.raises(ValueError):
            r.receive(kid, timeout=-1)


def test_telemetry_after_terminate_is_the_final_one(rt):
    """``get_telemetry`` of a terminated kernel returns its final figures (state
    ``terminated``), from the blocking and the asyncio runtime; a relaunch under the same id
    reads the new kernel's. An id never launched is still ``KernelNotFoundError``."""
    kid = launch_echo(rt)
    rt.activate(kid)
    for i in range(3):
        rt.send(kid, i)
    assert [rt.receive(kid, timeout=5) for _ in range(3)] == [("echo", i) for i in range(3)]
    rt.terminate(kid)
    t = rt.get_telemetry(kid)
    assert t.kernel_id == kid and t.state == "terminated"
    assert t.messages_received == 3 and t.messages_processed == 3
    rt.launch(kid, echo_body)
    t2 = rt.get_telemetry(kid)
    assert t2.state == "launched" and t2.messages_processed == 0
    with pytest.raises(KernelNotFoundError):
        rt.get_telemetry(fresh("never"))

    async def main():
        async with RingKernelRuntime(backend="cpu", shutdown_timeout=2.0) as art:
            k = fresh("echo")
            await art.launch(k, echo_body)
            await art.activate(k)
            assert await art.call(k, 7, timeout=5) == ("echo", 7)
            await art.terminate(k)
            return art.get_telemetry(k), art.get_all_telemetry()

    final, every = asyncio.run(main())
    assert final.state == "terminated" and final.messages_processed == 1
    assert every == {}  # only live kernels


def test_telemetry_off_when_enable_telemetry_is_false():
    """``enable_telemetry=False``: ``get_telemetry`` returns None, ``get_all_telemetry`` an
    empty dict and ``get_summary`` counts the kernels with zero totals; the kernels work."""

    async def main():
        async with RingKernelRuntime(enable_telemetry=False, backend="cpu") as art:
            k = fresh("echo")
            await art.launch(k, echo_body)
            await art.activate(k)
            assert await art.call(k, 1, timeout=5) == ("echo", 1)
            return art.get_telemetry(k), art.get_all_telemetry(), art.get_summary()

    one, every, summary = asyncio.run(main())
    assert one is None and every == {}
    assert summary["kernel_count"] == 1
    assert summary["total_messages_processed"] == 0 and summary["total_errors"] == 0
    with resident.Runtime("cpu", enable_telemetry=False) as r:
        k = launch_echo(r)
        assert r.get_telemetry(k) is None


def test_available_backends_lists_what_opens_here():
    """``resident.available_backends()`` names the backends a runtime can use here, in the
    engine's order (the CPU first); one it does not name raises ``BackendNotAvailableError``.
    ``backend_report()`` says why each other one is not available."""
    names = resident.available_backends()
    assert names[0] == "cpu" and len(set(names)) == len(names)
    assert set(names) <= {"cpu", "cuda", "wgpu", "cudasim"}
    report = {r["name"]: r for r in resident.backend_report()}
    assert list(report) == ["cpu", "cuda", "wgpu", "cudasim"]
    for name, r in report.items():
        assert r["available"] == (name in names)
        assert (r["reason"] is None) == r["available"]
        assert all(d["backend"] == name for d in r["devices"])
    for b in ("cpu", "cuda", "cudasim"):
        if b in names:
            resident.Runtime(b).shutdown()
        else:
            with pytest.raises(resident.BackendNotAvailableError):
                resident.Runtime(b)


def test_the_engine_s_telemetry_refusal_reads_well(rt):
    """Past the remembered final figures, the engine's refusal to read a freed kernel's
    telemetry names the kernel and the operation ("cannot read the telemetry while
    terminated"; it read "cannot read the telemetry of while terminated")."""
    kid = launch_echo(rt)
    rt.terminate(kid)
    with pytest.raises(KernelStateError) as e:
        rt._rt.telemetry(kid)  # the engine itself, under the Python layer's memory
    assert str(e.value) == f"kernel '{kid}': cannot read the telemetry while terminated"
    assert e.value.kernel_id == kid and e.value.state == "terminated"

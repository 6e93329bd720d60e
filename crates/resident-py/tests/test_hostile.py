"""Hostile inputs from Python (issue 31, part 4): messages of the wrong type or shape, huge
batches, handlers that raise or never return, Ctrl-C during a blocking call, and interpreter
exit with kernels running. Each ends in a typed exception or a clean stop, and nothing a send
accepted is lost. Every test runs under a timeout (no test may hang the suite)."""

import asyncio
import faulthandler
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import resident
from resident import (
    CallTimeoutError,
    DtypeLayoutError,
    KernelFailedError,
    KernelNotAcceptingError,
    MessageTypeError,
    QueueFullError,
    ResidentError,
    SendTimeoutError,
)
from conftest import echo_body, fresh

posix_only = pytest.mark.skipif(os.name != "posix", reason="signals and /proc")
TEST_TIMEOUT = 30.0


class HangError(Exception):
    pass


@pytest.fixture(autouse=True)
def _timeout():
    """A timeout per test: SIGALRM raises in the main thread (blocking waits check for
    signals every 20 ms); faulthandler ends the process if even that does not help."""
    if os.name != "posix":
        yield
        return

    def on_alarm(signum, frame):
        raise HangError(f"test ran past {TEST_TIMEOUT} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT)
    faulthandler.dump_traceback_later(TEST_TIMEOUT + 15, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, old)


def rss() -> int:
    """Resident memory now, bytes (``/proc``; else the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # pragma: no cover
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def sigint_after(delay: float) -> threading.Timer:
    t = threading.Timer(delay, lambda: os.kill(os.getpid(), signal.SIGINT))
    t.start()
    return t


async def never_returns(ctx):
    """Takes one message, then loops in Python forever (ignoring should_terminate)."""
    while not ctx.should_terminate:
        try:
            await ctx.receive(timeout=0.05)
        except asyncio.TimeoutError:
            continue
        while True:
            pass


async def silent(ctx):
    """Takes messages and never replies."""
    while not ctx.should_terminate:
        try:
            await ctx.receive(timeout=0.05)
        except asyncio.TimeoutError:
            continue


REC = np.dtype([("a", np.int32), ("b", np.float32)], align=True)


def summing_batch(state, batch):
    out = batch.copy()
    out["b"] = batch["a"] * 2
    return out


def launch_batch(rt, func=summing_batch, dtype=REC, **kw):
    kid = fresh("bk")
    resident.batch_kernel(kernel_id=kid, in_dtype=dtype, **kw)(func)
    rt.launch(kid)
    return kid


def drain(rt, kid, want, timeout=10.0):
    """Receives a batch kernel's outputs until ``want`` came (or the timeout)."""
    parts, n = [], 0
    end = time.monotonic() + timeout
    while n < want and time.monotonic() < end:
        r = rt.receive_batch(kid, 1 << 20, timeout=0.2)
        parts.append(r)
        n += len(r)
    return np.concatenate(parts) if parts else np.zeros(0)


# ---- wrong types and shapes ---------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [None, 5, 1.5, {"a": 1}, "abc", b"xy", np.zeros(3), np.zeros(0), np.array([object()]), object()],
    ids=["None", "int", "float", "dict", "str", "bytes", "array", "empty-array", "object-array", "object"],
)
def test_message_kernel_send_batch_refuses_non_batches(rt, bad):
    kid = fresh("mk")
    rt.launch(kid, echo_body)
    rt.activate(kid)
    for i in range(5):
        rt.send(kid, i)
    with pytest.raises(MessageTypeError):
        rt.send_batch(kid, bad)

    async def main():
        with pytest.raises(MessageTypeError):
            await resident.RingKernelRuntime.send_batch(aw, kid, bad)

    aw = resident.RingKernelRuntime.__new__(resident.RingKernelRuntime)
    aw.sync, aw._rt = rt, rt._rt
    asyncio.run(main())
    for i in range(5, 10):
        rt.send(kid, i)
    got = [rt.receive(kid, timeout=5) for _ in range(10)]
    assert got == [("echo", i) for i in range(10)], "nothing accepted before or after was lost"


def test_any_object_is_a_message_but_bad_priorities_and_ids_are_refused(rt):
    kid = fresh("mk")
    rt.launch(kid, echo_body)
    rt.activate(kid)
    big = b"x" * (64 << 20)  # an oversize payload is one reference, not a copy
    before = rt.get_telemetry(kid).messages_received
    for m in (None, 0, {"k": [1, 2]}, big):
        assert rt.call(kid, m, timeout=5)[1] is m
    for p in (-1, 256, "x", 1.5, None.__class__):
        with pytest.raises(ValueError):
            rt.send(kid, 1, priority=p)

    class BadPrio:
        priority = "high"

    with pytest.raises(ValueError):
        rt.send(kid, BadPrio())
    with pytest.raises(ValueError):
        rt.send_batch(kid, [1, BadPrio()])  # checked before any is sent
    with pytest.raises(TypeError):
        rt.send(None, 1)
    with pytest.raises(ValueError):
        rt.call(kid, 1, timeout=float("nan"))
    with pytest.raises(ValueError):
        rt.receive_batch(kid, -1)
    assert rt.receive_batch(kid, 10**30, timeout=0.01) == []
    assert rt.get_telemetry(kid).messages_received == before + 4, "refusals sent nothing"


def test_message_objects_to_a_batch_kernel_are_a_type_error(rt):
    kid = launch_batch(rt)
    rt.activate(kid)
    msg = object()
    for f in (lambda: rt.send(kid, msg), lambda: rt.call(kid, msg, timeout=1)):
        with pytest.raises(MessageTypeError) as e:
            f()
        assert e.value.message is msg and "batch kernel" in str(e.value)
    with pytest.raises(MessageTypeError):
        rt.receive(kid, timeout=0.1)

    async def main():
        async with resident.RingKernelRuntime(backend="cpu") as art:
            k2 = launch_batch(art.sync)
            with pytest.raises(MessageTypeError):
                await art.send(k2, msg)
            with pytest.raises(MessageTypeError):
                await art.call(k2, msg, timeout=1)
            with pytest.raises(MessageTypeError):
                await art.receive(k2, timeout=0.1)

    asyncio.run(main())
    # The unknown id is still a KernelNotFoundError.
    with pytest.raises(resident.KernelNotFoundError):
        rt.send(fresh("nobody"), msg)


BAD_RECORDS = {
    "None": None,
    "int": 5,
    "dict": {"a": 1},
    "str": "abc",
    "bytes": b"12345678",
    "float-array": np.zeros(3),
    "wrong-fields": np.zeros(3, [("x", np.int32), ("y", np.float32)]),
    "wrong-types": np.zeros(3, [("a", np.int64), ("b", np.float32)]),
    "reordered": np.zeros(3, [("b", np.float32), ("a", np.int32)]),
    "oversize-records": np.zeros(3, np.dtype({"names": ["a", "b"], "formats": [np.int32, np.float32], "offsets": [0, 4], "itemsize": 16})),
    "big-endian": np.zeros(3, REC.newbyteorder(">")),
    "2-D": np.zeros((2, 2), REC),
    "object-array": np.array([object(), object()]),
    "list-of-objects": [object()],
    "short-tuples": [(1,)],
    "string-tuples": [("x", "y")],
    "scalar-record": np.zeros(1, REC)[0],
}


@pytest.mark.parametrize("name", list(BAD_RECORDS))
def test_batch_kernel_refuses_wrong_records_typed(rt, name):
    kid = launch_batch(rt, backpressure="reject")
    rt.activate(kid)
    good = np.zeros(100, REC)
    good["a"] = np.arange(100)
    assert rt.send_batch(kid, good[:50]) == 50
    with pytest.raises(DtypeLayoutError):
        rt.send_batch(kid, BAD_RECORDS[name])
    assert rt.send_batch(kid, good[50:]) == 50
    out = drain(rt, kid, 100)
    assert len(out) == 100 and list(out["a"]) == list(range(100))
    assert rt.state(kid) == "active"


def test_batch_kernel_odd_but_valid_arrays(rt):
    kid = launch_batch(rt)
    rt.activate(kid)
    base = np.zeros(200, REC)
    base["a"] = np.arange(200)
    strided = base[::2]  # non-contiguous: copied, in order
    assert not strided.flags.c_contiguous
    assert rt.send_batch(kid, strided) == 100
    assert rt.send_batch(kid, np.zeros(0, REC)) == 0  # an empty batch does nothing
    assert rt.send_batch(kid, [(7, 0.0), (8, 0.0)]) == 2  # tuples in field order
    with pytest.raises(ValueError):
        rt.send_batch(kid, base, priority=1)
    with pytest.raises(ValueError):
        rt.receive_batch(kid, -1)
    out = drain(rt, kid, 102)
    assert list(out["a"]) == list(range(0, 200, 2)) + [7, 8]
    assert list(out["b"]) == [2.0 * a for a in out["a"]]


# ---- huge batches ---------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["reject", "block"])
def test_huge_message_batch_is_bounded_by_the_queue(policy):
    r = resident.Runtime(backend="cpu", shutdown_timeout=2.0)
    kid = fresh("huge")
    r.launch(kid, echo_body, queue_size=1024, priority_lanes=1, backpressure=policy, block_timeout=0.2)
    msgs = list(range(10**6))
    m0 = rss()
    t0 = time.monotonic()
    n = r.send_batch(kid, msgs)  # not active: only the queue's capacity fits
    assert time.monotonic() - t0 < 5
    assert 0 < n <= 1024
    with pytest.raises(QueueFullError if policy == "reject" else SendTimeoutError) as e:
        r.send_batch(kid, msgs[n:])
    assert len(e.value.message) == len(msgs) - n  # the refused rest handed back
    assert rss() - m0 < 32 << 20, "no copy of the batch beyond the queue"
    r.activate(kid)
    got = r.receive_batch(kid, 10**6, timeout=5)
    while len(got) < n:
        more = r.receive_batch(kid, 10**6, timeout=1)
        assert more, "every accepted message comes out"
        got += more
    assert sum(v for _, v in got) == sum(range(n))
    r.shutdown()


def test_huge_record_batch_is_bounded_by_the_queue(rt):
    kid = launch_batch(rt, func=lambda s, b: b, dtype=np.uint64, queue_size=4096, backpressure="reject")
    arr = np.arange(10**7, dtype=np.uint64)  # 80 MB, allocated before the measure
    m0 = rss()
    t0 = time.monotonic()
    n = rt.send_batch(kid, arr)
    assert time.monotonic() - t0 < 5 and 0 < n <= 4096
    with pytest.raises(QueueFullError):
        rt.send_batch(kid, arr[n:])
    assert rss() - m0 < 48 << 20, "memory bounded by the queue, not the batch"
    rt.activate(kid)
    out = drain(rt, kid, n)
    assert len(out) == n and int(out.sum()) == n * (n - 1) // 2


def test_huge_record_batch_under_block_is_taken_whole(rt):
    kid = launch_batch(rt, func=lambda s, b: b, dtype=np.uint64, queue_size=4096, max_batch=4096)
    rt.activate(kid)
    arr = np.arange(10**6, dtype=np.uint64)
    got = []

    def reader():
        n = 0
        while n < len(arr):
            r = rt.receive_batch(kid, 1 << 16, timeout=5)
            if not len(r):
                return
            got.append(r)
            n += len(r)

    t = threading.Thread(target=reader)
    t.start()
    m0 = rss()
    assert rt.send_batch(kid, arr) == len(arr)
    t.join(20)
    out = np.concatenate(got)
    assert len(out) == len(arr) and int(out.sum()) == int(arr.sum())
    assert rss() - m0 < 64 << 20


def test_async_huge_record_batch_under_block():
    async def main():
        async with resident.RingKernelRuntime(backend="cpu", shutdown_timeout=2.0) as art:
            kid = launch_batch(art.sync, func=lambda s, b: b, dtype=np.uint64, queue_size=1024, block_timeout=0.2)
            arr = np.arange(10**6, dtype=np.uint64)
            n = await art.send_batch(kid, arr)  # not active: what fits, then the block timeout
            assert 0 < n <= 1024
            with pytest.raises(SendTimeoutError):
                await art.send_batch(kid, arr[n:])
            await art.activate(kid)
            out = await art.receive_batch(kid, 10**6, timeout=5)
            while len(out) < n:
                out = np.concatenate([out, await art.receive_batch(kid, 10**6, timeout=1)])
            assert int(out.sum()) == n * (n - 1) // 2

    asyncio.run(main())


# ---- handlers that raise or never return ----------------------------------------------------


def test_handler_that_raises_fails_only_its_kernel(rt):
    async def bad(ctx):
        while not ctx.should_terminate:
            try:
                m = await ctx.receive(timeout=0.05)
            except asyncio.TimeoutError:
                continue
            if m == "boom":
                raise RuntimeError("handler exploded")
            await ctx.send(m)

    good = fresh("good")
    rt.launch(good, echo_body)
    rt.activate(good)
    kid = fresh("bad")
    rt.launch(kid, bad)
    rt.activate(kid)
    assert rt.call(kid, "ok", timeout=5) == "ok"
    boom = "boom"
    t0 = time.monotonic()
    with pytest.raises(KernelFailedError) as e:
        rt.call(kid, boom, timeout=20)
    assert time.monotonic() - t0 < 2
    assert "RuntimeError" in e.value.reason
    for f in (lambda: rt.send(kid, 1), lambda: rt.call(kid, 1, timeout=1), lambda: rt.send_batch(kid, [1, 2])):
        with pytest.raises(KernelNotAcceptingError):
            f()
    assert rt.call(good, 1, timeout=5) == ("echo", 1), "other kernels keep running"
    rep = rt.terminate(kid)
    assert "handler exploded" in rep.failure and rep.failed_message is boom


def test_handler_that_raises_again_and_again():
    """Relaunched after each failure, 20 times: each failure is typed, threads do not pile up."""

    async def always(ctx):
        await ctx.receive(timeout=5)
        raise ValueError("again")

    r = resident.Runtime(backend="cpu", shutdown_timeout=1.0, terminate_timeout=2.0)
    threads0 = threading.active_count()
    for i in range(20):
        r.launch("again", always)
        r.activate("again")
        with pytest.raises(KernelFailedError):
            r.call("again", i, timeout=5)
        rep = r.terminate("again")
        assert "ValueError" in rep.failure and rep.failed_message == i
    assert threading.active_count() <= threads0 + 1
    assert r.shutdown() == []


def test_handler_that_catches_its_own_errors_keeps_serving(rt):
    async def picky(ctx):
        while not ctx.should_terminate:
            try:
                m = await ctx.receive(timeout=0.05)
            except asyncio.TimeoutError:
                continue
            try:
                await ctx.send(10 // m)
            except ZeroDivisionError as e:
                await ctx.send(e)

    kid = fresh("picky")
    rt.launch(kid, picky)
    rt.activate(kid)
    for i in range(50):
        r = rt.call(kid, i % 3, timeout=5)
        assert isinstance(r, ZeroDivisionError) if i % 3 == 0 else r == 10 // (i % 3)
    assert rt.state(kid) == "active"


def test_batch_handler_that_raises_or_returns_junk(rt):
    def boom(state, batch):
        raise ValueError("batch boom")

    def junk(state, batch):
        return "not records"

    other = launch_batch(rt)
    rt.activate(other)
    for f in (boom, junk):
        kid = launch_batch(rt, func=f, dtype=np.int64)
        rt.activate(kid)
        rt.send_batch(kid, np.arange(10))
        t0 = time.monotonic()
        with pytest.raises(KernelFailedError):
            rt.receive_batch(kid, 10, timeout=10)
        assert time.monotonic() - t0 < 2
        with pytest.raises(KernelNotAcceptingError):
            rt.send_batch(kid, np.arange(3))
        assert rt.terminate(kid).failure
    assert rt.send_batch(other, np.zeros(3, REC)) == 3
    assert len(drain(rt, other, 3)) == 3


def test_handler_that_never_returns(rt):
    kid = fresh("stuck")
    rt.launch(kid, never_returns)
    rt.activate(kid)
    t0 = time.monotonic()
    with pytest.raises(CallTimeoutError):
        rt.call(kid, 1, timeout=0.3)
    assert time.monotonic() - t0 < 1.5
    with pytest.raises(CallTimeoutError):
        rt.call(kid, 2, timeout=0.3)  # queued behind the stuck one
    t0 = time.monotonic()
    rep = rt.terminate(kid, timeout=0.5)  # abandoned: its thread is told to stop
    assert time.monotonic() - t0 < 3
    assert rep.failure and "abandoned" in rep.failure
    assert rt.state(kid) == "failed"


def test_async_handler_that_never_returns():
    async def main():
        async with resident.RingKernelRuntime(backend="cpu", terminate_timeout=0.5) as art:
            kid = fresh("stuck")
            # A handler that never returns asks for a thread: on the caller's loop (the
            # default) it would hold the loop, as any coroutine that never awaits does.
            await art.launch(kid, never_returns, thread=True)
            await art.activate(kid)
            t0 = time.monotonic()
            with pytest.raises(CallTimeoutError):
                await art.call(kid, 1, timeout=0.3)
            assert time.monotonic() - t0 < 1.5
            rep = await art.terminate(kid, timeout=0.5)
            assert rep.failure

    asyncio.run(main())


# ---- Ctrl-C ---------------------------------------------------------------------------------


@posix_only
@pytest.mark.parametrize("op", ["call", "receive", "send-block", "send_batch-block", "records-block"])
def test_ctrl_c_interrupts_a_blocking_operation_promptly(rt, op):
    kid = fresh("ki")
    if op == "records-block":
        kid = launch_batch(rt, dtype=np.int64, queue_size=8, block_timeout=30)
        rt.send_batch(kid, np.arange(8))  # full, never activated
        f = lambda: rt.send_batch(kid, np.arange(10**5))  # noqa: E731
    else:
        rt.launch(kid, silent, queue_size=4, priority_lanes=1, block_timeout=30)
        if op in ("call", "receive"):
            rt.activate(kid)
        else:
            for i in range(4):
                rt.send(kid, i)  # full, never activated
        f = {
            "call": lambda: rt.call(kid, "q", timeout=30),
            "receive": lambda: rt.receive(kid, timeout=30),
            "send-block": lambda: rt.send(kid, "x"),
            "send_batch-block": lambda: rt.send_batch(kid, ["x", "y"]),
        }[op]
    sigint_after(0.2)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt) as e:
        f()
    assert time.monotonic() - t0 < 1.2, "interrupted within about a second"
    if op.endswith("batch-block") or op == "records-block":
        assert e.value.sent == 0
    # The runtime stays usable.
    e2 = fresh("after")
    rt.launch(e2, echo_body)
    rt.activate(e2)
    assert rt.call(e2, 5, timeout=5) == ("echo", 5)
    if op == "call":
        t = rt.get_telemetry(kid)
        assert t.objects_held == 0, "the interrupted call withdrew its request"
    rep = rt.terminate(kid)
    if op == "send-block":
        assert len(rep.undelivered) == 4  # nothing accepted was lost, nothing extra sent


def test_async_cancellation_loses_nothing():
    async def main():
        async with resident.RingKernelRuntime(backend="cpu") as art:
            kid = fresh("slow")
            await art.launch(kid, echo_body)
            # Not active: receives and calls wait; cancel them.
            rtask = asyncio.ensure_future(art.receive(kid, timeout=30))
            ctask = asyncio.ensure_future(art.call(kid, "cancelled", timeout=30))
            await asyncio.sleep(0.1)
            rtask.cancel()
            ctask.cancel()
            for t in (rtask, ctask):
                with pytest.raises(asyncio.CancelledError):
                    await t
            for i in range(3):
                await art.send(kid, i)
            await art.activate(kid)
            got = [await art.receive(kid, timeout=5) for _ in range(3)]
            assert got == [("echo", i) for i in range(3)], "the cancelled call was never handled"
            with pytest.raises(asyncio.TimeoutError):
                await art.receive(kid, timeout=0.1)
            assert art.get_telemetry(kid).objects_held == 0

    asyncio.run(main())


# ---- interpreter exit with kernels running --------------------------------------------------

PRELUDE = textwrap.dedent(
    """
    import asyncio, signal, sys, time, numpy as np, resident
    # Python's Ctrl-C handler even when this test was started with SIGINT ignored (see conftest).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    async def echo(ctx):
        while not ctx.should_terminate:
            try:
                m = await ctx.receive(timeout=0.05)
            except asyncio.TimeoutError:
                continue
            await ctx.send(m)
    async def spin(ctx):
        await ctx.receive(timeout=5)
        while True:
            pass
    async def exits(ctx):
        await ctx.receive(timeout=5)
        sys.exit(7)
    def batch(state, b):
        return b
    """
)

EXITS = {
    # name: (script, expected exit code, text expected in stderr)
    "sync-left-running": (
        "r = resident.Runtime(backend='cpu')\n"
        "r.launch('a', echo); r.activate('a'); assert r.call('a', 1, timeout=5) == 1\n"
        "r.launch('s', spin); r.activate('s'); r.send('s', 1); time.sleep(0.1)\n"
        "resident.batch_kernel(kernel_id='b', in_dtype=np.int64)(batch)\n"
        "r.launch('b'); r.activate('b'); r.send_batch('b', np.arange(10**5))\n",
        0,
        None,
    ),
    "async-left-running": (
        "async def main():\n"
        "    art = resident.RingKernelRuntime(backend='cpu')\n"
        "    await art.launch('a', echo); await art.activate('a')\n"
        "    assert await art.call('a', 2, timeout=5) == 2\n"
        "    await art.launch('s', spin, thread=True); await art.activate('s'); await art.send('s', 1)\n"
        "    return art\n"
        "keep = asyncio.run(main())\n",
        0,
        None,
    ),
    "sys-exit-in-main": (
        "r = resident.Runtime(backend='cpu')\n"
        "r.launch('a', echo); r.activate('a'); r.send('a', 1)\n"
        "r.launch('s', spin); r.activate('s'); r.send('s', 1); time.sleep(0.1)\n"
        "sys.exit(3)\n",
        3,
        None,
    ),
    "sys-exit-in-handler": (
        "r = resident.Runtime(backend='cpu')\n"
        "r.launch('x', exits); r.activate('x')\n"
        "try:\n"
        "    r.call('x', 1, timeout=5)\n"
        "except resident.KernelFailedError as e:\n"
        "    assert 'SystemExit' in e.reason\n"
        "    print('typed', flush=True)\n"
        "r.launch('a', echo); r.activate('a'); assert r.call('a', 1, timeout=5) == 1\n",
        0,
        None,
    ),
    "exception-at-top-level": (
        "r = resident.Runtime(backend='cpu')\n"
        "r.launch('a', echo); r.activate('a'); r.send('a', 1)\n"
        "r.launch('s', spin); r.activate('s'); r.send('s', 1); time.sleep(0.1)\n"
        "raise RuntimeError('top level')\n",
        1,
        "RuntimeError: top level",
    ),
    "ctrl-c-during-call": (
        "import os, signal, threading\n"
        "r = resident.Runtime(backend='cpu')\n"
        "r.launch('s', spin); r.activate('s')\n"
        "threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
        "r.call('s', 1, timeout=60)\n",
        -signal.SIGINT if os.name == "posix" else 1,
        "KeyboardInterrupt",
    ),
}


@posix_only
def test_interpreter_exit_with_kernels_running(tmp_path):
    """Each script exits without shutting its runtime down; all run at once."""
    procs = {}
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    for name, (body, _, _) in EXITS.items():
        p = tmp_path / f"{name}.py"
        p.write_text(PRELUDE + body)
        procs[name] = subprocess.Popen(
            [sys.executable, str(p)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
    t0 = time.monotonic()
    failures = []
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=max(1.0, 20 - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            failures.append(f"{name}: hung\n{err.decode()[-2000:]}")
            continue
        _, code, want = EXITS[name]
        text = err.decode()
        if proc.returncode == 0 and name == "ctrl-c-during-call":
            failures.append(f"{name}: not interrupted")
        if proc.returncode != code and not (name == "ctrl-c-during-call" and proc.returncode in (1, 130, -2)):
            failures.append(f"{name}: exit code {proc.returncode}, expected {code}\n{text[-2000:]}")
        for bad in ("Fatal Python error", "panicked", "Aborted", "Segmentation fault", "core dumped"):
            if bad in text:
                failures.append(f"{name}: '{bad}' in stderr\n{text[-2000:]}")
        if want is not None and want not in text:
            failures.append(f"{name}: '{want}' not in stderr\n{text[-2000:]}")
        if name == "sys-exit-in-handler" and b"typed" not in out:
            failures.append(f"{name}: no typed failure\n{text[-2000:]}")
    assert not failures, "\n".join(failures)
    assert time.monotonic() - t0 < 20

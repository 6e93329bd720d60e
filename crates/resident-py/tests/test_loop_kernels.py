"""Kernels on the caller's event loop (issue 40, item 1): a Python ring kernel with
``thread=False`` launched by ``RingKernelRuntime.launch`` runs as a task of that loop, with no
thread; its messages still pass through the engine's queues (order, priorities, backpressure,
terminate accounting), ``thread=True`` keeps a thread (``thread=False`` is the default, spelled out below), and a handler that raises
fails its kernel as before.
Timing bounds are generous: the machines that run this are shared."""

import asyncio
import os
import threading
import time

import pytest

import resident
from resident import RingKernelRuntime
from conftest import echo_body, fresh


def os_threads():
    """Threads of this process, as the OS counts them (the engine's threads are not Python's:
    ``threading.active_count`` does not see them)."""
    return len(os.listdir("/proc/self/task"))


def art():
    return RingKernelRuntime(backend="cpu", shutdown_timeout=2.0, terminate_timeout=5.0)


async def idle_body(ctx):
    """Waits for messages without a timeout (the seeds' shape, no periodic wake-up)."""
    while not ctx.should_terminate:
        if not ctx.is_active:
            await ctx.wait_active()
            continue
        try:
            msg = await ctx.receive()
        except asyncio.CancelledError:
            if ctx.should_terminate:
                return
            raise
        await ctx.send(msg)


def test_a_loop_kernel_starts_no_thread_and_answers():
    n = 100

    async def main():
        async with art() as rt:
            before, py_before = os_threads(), threading.active_count()
            ids = [fresh("onloop") for _ in range(n)]
            for k in ids:
                await rt.launch(k, idle_body, thread=False)
                await rt.activate(k)
            # (<=: a helper thread of an earlier test may end meanwhile)
            assert os_threads() <= before, "no thread per kernel"
            assert threading.active_count() <= py_before
            for i, k in enumerate(ids):
                assert await rt.call(k, i, timeout=5.0) == i
            assert os_threads() <= before
            names = {t.get_name() for t in asyncio.all_tasks()}
            assert f"resident:{ids[0]}" in names, "the kernel is a task of this loop"
            for k in ids:
                rep = await rt.terminate(k)
                assert rep.failure is None and rep.processed == 1

    asyncio.run(asyncio.wait_for(main(), 60))


def test_idle_loop_kernels_use_no_cpu():
    async def main():
        async with art() as rt:
            ids = [fresh("idle") for _ in range(100)]
            for k in ids:
                await rt.launch(k, idle_body, thread=False)
                await rt.activate(k)
            await asyncio.sleep(0.1)
            threads = os_threads()
            # The loop's thread runs the kernels: its CPU time (another test's leftover
            # threads, if any, do not count).
            t0 = time.thread_time()
            w0 = time.monotonic()
            await asyncio.sleep(1.0)
            cpu = time.thread_time() - t0
            wall = time.monotonic() - w0
            # No thread and no timer per kernel: the loop sleeps (bound for a shared box).
            assert cpu < 0.1 * wall, f"{cpu:.3f} CPU-s in {wall:.2f} s for 100 idle kernels"
            assert os_threads() <= threads

    asyncio.run(asyncio.wait_for(main(), 60))


def test_order_priority_and_terminate_report_on_the_loop():
    async def main():
        async with art() as rt:
            k = fresh("prio")
            await rt.launch(k, idle_body, priority_lanes=4, thread=False)
            # Inactive: messages queue in the engine's lanes.
            for i in range(6):
                await rt.send(k, ("low", i), priority=0)
            for i in range(3):
                await rt.send(k, ("high", i), priority=255)
            await rt.activate(k)
            got = [await rt.receive(k, timeout=5.0) for _ in range(9)]
            assert got == [("high", i) for i in range(3)] + [("low", i) for i in range(6)]
            await rt.deactivate(k)
            for i in range(4):
                await rt.send(k, ("left", i))
            rep = await rt.terminate(k)
            assert rep.undelivered == [("left", i) for i in range(4)], rep
            assert rep.processed == 9 and rep.failure is None
            assert rt.get_telemetry(k).messages_processed == 9

    asyncio.run(asyncio.wait_for(main(), 60))


def test_backpressure_on_the_loop():
    async def main():
        async with art() as rt:
            k = fresh("rej")
            await rt.launch(
                k, idle_body, queue_size=2, priority_lanes=1, backpressure="reject", thread=False
            )
            await rt.send(k, 1)
            await rt.send(k, 2)
            with pytest.raises(resident.QueueFullError) as e:
                await rt.send(k, 3)
            assert e.value.message == 3
            await rt.activate(k)
            assert [await rt.receive(k, timeout=5.0) for _ in range(2)] == [1, 2]

            b = fresh("blk")
            await rt.launch(
                b, idle_body, queue_size=2, priority_lanes=1, backpressure="block",
                block_timeout=0.2, thread=False,
            )
            await rt.send(b, 1)
            await rt.send(b, 2)
            with pytest.raises(resident.SendTimeoutError):
                await rt.send(b, 3)
            # A blocked send gets room once the kernel on this same loop takes inputs.
            sender = asyncio.ensure_future(rt.send(b, 3))
            await asyncio.sleep(0.05)
            assert not sender.done()
            await rt.activate(b)
            await asyncio.wait_for(sender, 5.0)
            assert [await rt.receive(b, timeout=5.0) for _ in range(3)] == [1, 2, 3]

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_send_from_another_thread_wakes_a_loop_kernel():
    async def main():
        async with art() as rt:
            k = fresh("xthread")
            await rt.launch(k, idle_body, thread=False)
            await rt.activate(k)
            await asyncio.sleep(0.05)  # the kernel parks, no timer
            t = threading.Thread(target=lambda: rt.sync.send(k, "from a thread"))
            t.start()
            assert await rt.receive(k, timeout=5.0) == "from a thread"
            t.join()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_the_default_is_the_loop_and_thread_true_keeps_a_thread():
    # Issue 40: on the caller's loop by default (it was a thread until the default flipped);
    # thread=True, at launch or on the decorator, keeps a thread.
    seen = {}

    async def where(ctx):
        seen["thread"] = threading.get_ident()
        await echo_body(ctx)

    async def main():
        async with art() as rt:
            k = fresh("default")
            await rt.launch(k, where)  # the default: the caller's loop
            await rt.activate(k)
            assert await rt.call(k, 7, timeout=5.0) == ("echo", 7)
            assert seen["thread"] == threading.get_ident(), "on the caller's loop"
            assert k in rt.sync._on_loop

            t = fresh("threaded")
            await rt.launch(t, where, thread=True)
            await rt.activate(t)
            assert await rt.call(t, 6, timeout=5.0) == ("echo", 6)
            assert seen["thread"] != threading.get_ident()
            assert t not in rt.sync._on_loop

            d = fresh("decorated")
            async def decorated(ctx):
                await where(ctx)

            resident.ring_kernel(kernel_id=d, thread=True)(decorated)
            await rt.launch(d)
            await rt.activate(d)
            assert await rt.call(d, 8, timeout=5.0) == ("echo", 8)
            assert seen["thread"] != threading.get_ident()

            here = fresh("here")
            await rt.launch(here, where, thread=False)
            await rt.activate(here)
            assert await rt.call(here, 9, timeout=5.0) == ("echo", 9)
            assert seen["thread"] == threading.get_ident(), "on the caller's loop"

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_handler_that_raises_fails_its_loop_kernel():
    async def bad(ctx):
        await ctx.wait_active()
        msg = await ctx.receive()
        raise ValueError(f"cannot handle {msg!r}")

    async def main():
        async with art() as rt:
            k = fresh("bad")
            await rt.launch(k, bad, thread=False)
            await rt.activate(k)
            with pytest.raises(resident.ResidentError):
                await rt.call(k, "poison", timeout=5.0)
            for _ in range(100):
                if rt.state(k) == "failed":
                    break
                await asyncio.sleep(0.01)
            assert rt.state(k) == "failed"
            assert "ValueError: cannot handle 'poison'" in rt.sync.failure(k)
            rep = await rt.terminate(k)
            assert rep.failed_message == "poison"
            assert "ValueError" in rep.failure

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_blocking_terminate_on_the_loop_thread_ends_the_kernel_at_once():
    async def main():
        rt = art()
        k = fresh("syncterm")
        await rt.launch(k, idle_body, thread=False)
        for i in range(3):
            await rt.send(k, i)
        t0 = time.monotonic()
        rep = rt.sync.terminate(k)  # the loop cannot run the kernel meanwhile
        assert time.monotonic() - t0 < 2.0
        assert rep.undelivered == [0, 1, 2] and rep.failure is None
        await asyncio.sleep(0.05)  # the kernel's task sees the end and leaves
        await rt.shutdown()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_loop_kernel_left_running_when_the_loop_ends():
    rt = art()

    async def main():
        k = fresh("orphan")
        await rt.launch(k, idle_body, thread=False)
        await rt.activate(k)
        assert await rt.call(k, 1, timeout=5.0) == 1
        return k

    k = asyncio.run(main())
    # asyncio.run cancelled the kernel's task: the kernel failed, saying so.
    assert rt.state(k) == "failed"
    assert "cancelled" in rt.sync.failure(k)
    t0 = time.monotonic()
    reps = rt.sync.shutdown()
    assert time.monotonic() - t0 < 2.0
    assert [r.kernel_id for r in reps] == [k]


def test_cancelled_waits_on_a_loop_kernel_lose_nothing():
    async def main():
        async with art() as rt:
            k = fresh("cancel")
            await rt.launch(k, idle_body, thread=False)
            # A receive cancelled while nothing came took nothing.
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(rt.receive(k), 0.05)
            # A call cancelled before the kernel ran (inactive) withdraws its request.
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(rt.call(k, "withdrawn"), 0.05)
            await rt.send(k, "kept")
            await rt.activate(k)
            assert await rt.receive(k, timeout=5.0) == "kept"
            assert await rt.call(k, "answered", timeout=5.0) == "answered"
            rep = await rt.terminate(k)
            assert rep.undelivered == [] and rep.unreceived == []

    asyncio.run(asyncio.wait_for(main(), 60))


def test_interpreter_exit_with_a_loop_kernel_running(tmp_path):
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "exit_on_loop.py"
    script.write_text(
        textwrap.dedent(
            """
            import asyncio, resident
            async def echo(ctx):
                while not ctx.should_terminate:
                    if not ctx.is_active:
                        await ctx.wait_active()
                        continue
                    m = await ctx.receive()
                    await ctx.send(m)
            async def main():
                art = resident.RingKernelRuntime(backend='cpu')
                await art.launch('a', echo, thread=False)
                await art.activate('a')
                assert await art.call('a', 2, timeout=5) == 2
                await art.send('a', 3)
                return art
            keep = asyncio.run(main())
            print('left running')
            """
        )
    )
    p = subprocess.run(
        [sys.executable, str(script)], capture_output=True, timeout=30,
        env=dict(os.environ, PYTHONFAULTHANDLER="1"),
    )
    err = p.stderr.decode()
    assert p.returncode == 0, err
    assert b"left running" in p.stdout
    for bad in ("Fatal Python error", "panicked", "Aborted", "Segmentation fault"):
        assert bad not in err, err

"""Cheaper messages (issue 40, item 2): the shortcuts a message takes on the caller's loop
answer as the full path does. A received message is kept aside from the reply books while it
is the only unanswered one; the waits of a loop share one timer for their deadlines. Timing
bounds are generous: the machines that run this are shared."""

import asyncio
import copy
import time

import resident
from resident import RingKernelRuntime
from conftest import fresh


@resident.message
class Req:
    value: int = 0


@resident.message
class Rep:
    value: int = 0


def art():
    return RingKernelRuntime(backend="cpu", shutdown_timeout=2.0, terminate_timeout=5.0)


def run(coro):
    return asyncio.run(coro)


def test_replies_by_correlation_answer_their_calls_in_any_order_on_the_loop():
    """Two calls taken, answered last first by correlation_id: each caller gets its own."""

    async def body(ctx):
        while not ctx.should_terminate:
            if not ctx.is_active:
                await ctx.wait_active()
                continue
            try:
                a = await ctx.receive(timeout=0.05)
                b = await ctx.receive(timeout=1.0)
            except asyncio.TimeoutError:
                continue
            await ctx.send(Rep(value=b.value * 10, correlation_id=b.message_id))
            await ctx.send(Rep(value=a.value * 10, correlation_id=a.message_id))

    async def main():
        async with art() as rt:
            k = fresh("order")
            await rt.launch(k, body)
            await rt.activate(k)
            for i in range(20):
                r1, r2 = await asyncio.gather(
                    rt.call(k, Req(value=2 * i), timeout=5.0),
                    rt.call(k, Req(value=2 * i + 1), timeout=5.0),
                )
                assert (r1.value, r2.value) == (20 * i, 20 * i + 10)

    run(main())


def test_a_reply_naming_an_equal_id_or_reply_to_answers_the_message_taken():
    """An id equal to the request's but another object, ``reply_to``, no correlation_id at
    all: each reply answers the one message taken (its call gets it)."""

    async def body(ctx):
        n = 0
        while not ctx.should_terminate:
            if not ctx.is_active:
                await ctx.wait_active()
                continue
            try:
                m = await ctx.receive(timeout=0.05)
            except asyncio.TimeoutError:
                continue
            kind = n % 3
            n += 1
            if kind == 0:
                await ctx.send(Rep(value=m.value, correlation_id=copy.copy(m.message_id)))
            elif kind == 1:
                await ctx.send(Rep(value=m.value), reply_to=m)
            else:
                await ctx.send(Rep(value=m.value))

    async def main():
        async with art() as rt:
            k = fresh("ids")
            await rt.launch(k, body)
            await rt.activate(k)
            for i in range(30):
                req = Req(value=i)
                r = await rt.call(k, req, timeout=5.0)
                assert r.value == i
                if i % 3 == 1:  # reply_to sets the reply's correlation_id
                    assert r.correlation_id == req.message_id

    run(main())


def test_reply_to_a_message_kept_aside_then_an_unknown_one_is_refused():
    async def body(ctx):
        while not ctx.should_terminate:
            if not ctx.is_active:
                await ctx.wait_active()
                continue
            try:
                m = await ctx.receive(timeout=0.05)
            except asyncio.TimeoutError:
                continue
            await ctx.send(Rep(value=m.value), reply_to=m)
            try:
                await ctx.send(Rep(value=-1), reply_to=m)  # answered already
            except ValueError:
                await ctx.send(Rep(value=-2))

    async def main():
        async with art() as rt:
            k = fresh("reply_to")
            await rt.launch(k, body)
            await rt.activate(k)
            await rt.send(k, Req(value=7))
            a = await rt.receive(k, timeout=5.0)
            b = await rt.receive(k, timeout=5.0)
            assert (a.value, b.value) == (7, -2)

    run(main())


def test_waits_with_different_deadlines_each_end_at_their_own():
    """Many receives on one loop, each with its own timeout, none answered: each raises
    ``ReceiveTimeoutError`` at its deadline, not before, and in the order of the deadlines;
    answered waits meanwhile leave no wait behind."""

    async def body(ctx):
        while not ctx.should_terminate:
            if not ctx.is_active:
                await ctx.wait_active()
                continue
            try:
                m = await ctx.receive(timeout=0.05)
            except asyncio.TimeoutError:
                continue
            await ctx.send(m)

    async def main():
        async with art() as rt:
            k = fresh("deadlines")
            await rt.launch(k, body)
            await rt.activate(k)
            for i in range(500):  # many waits answered: their deadline entries go
                await rt.send(k, i)
                assert await rt.receive(k, timeout=30.0) == i
            quiet = fresh("quiet")
            await rt.launch(quiet, body)  # never activated: no output ever
            loop = asyncio.get_running_loop()
            ended = []

            async def wait(t):
                t0 = loop.time()
                try:
                    await rt.receive(quiet, timeout=t)
                except resident.ReceiveTimeoutError:
                    ended.append((t, loop.time() - t0))

            ts = [0.30, 0.05, 0.20, 0.10, 0.40]
            await asyncio.gather(*(wait(t) for t in ts))
            assert [t for t, _ in ended] == sorted(ts)
            for t, took in ended:
                assert took >= t - 1e-3, (t, took)
                assert took < t + 2.0, (t, took)

    run(main())


def test_a_cancelled_wait_leaves_the_deadline_timer_working():
    async def main():
        async with art() as rt:
            k = fresh("cancel")

            async def body(ctx):
                while not ctx.should_terminate:
                    await ctx.wait_active()
                    await asyncio.sleep(0.01)

            await rt.launch(k, body)
            t = asyncio.ensure_future(rt.receive(k, timeout=0.05))
            await asyncio.sleep(0)
            t.cancel()
            try:
                await t
            except asyncio.CancelledError:
                pass
            t0 = time.monotonic()
            try:
                await rt.receive(k, timeout=0.1)
                raise AssertionError("no output was sent")
            except resident.ReceiveTimeoutError:
                pass
            assert 0.09 <= time.monotonic() - t0 < 2.0

    run(main())

"""Batch kernels: numpy records through the engine's queues, a vectorized handler per batch."""

import numpy as np
import pytest

import resident
from conftest import fresh

DT = np.dtype([("id", "<u4"), ("x", "<f4"), ("tag", "u1")])


def scale_kernel(kid, **kw):
    state = np.zeros(1, np.int64)

    def scale(state, batch):
        state[0] += len(batch)
        out = batch.copy()
        out["x"] *= 2
        return out

    resident.batch_kernel(kernel_id=kid, in_dtype=DT, state=state, **kw)(scale)
    return state


def records(n, start=0):
    a = np.zeros(n, DT)
    a["id"] = np.arange(start, start + n)
    a["x"] = np.arange(start, start + n, dtype=np.float32) * 0.5
    a["tag"] = 7
    return a


def test_batch_round_trip_equals_vectorized_form(rt):
    kid = fresh("scale")
    state = scale_kernel(kid, max_batch=256)
    rt.launch(kid)
    rt.activate(kid)
    a = records(20000)
    sent, got = 0, []
    while sent < len(a):
        sent += rt.send_batch(kid, a[sent : sent + 500])
        got.append(rt.receive_batch(kid, 1 << 20))
    n = sum(map(len, got))
    while n < len(a):
        g = rt.receive_batch(kid, 1 << 20, timeout=5)
        assert len(g), "outputs arrive"
        got.append(g)
        n += len(g)
    out = np.concatenate(got)
    expect = a.copy()
    expect["x"] *= 2
    np.testing.assert_array_equal(out, expect)
    assert state[0] == 20000, "the kernel's state saw every record"
    assert rt.get_telemetry(kid).messages_processed == 20000
    assert len(rt.receive_batch(kid, 10, timeout=0.05)) == 0


def test_batch_reject_and_report_hand_back_records(rt):
    kid = fresh("rej")
    scale_kernel(kid, queue_size=64, backpressure="reject")
    rt.launch(kid)  # not active: records stay queued
    assert rt.send_batch(kid, records(100)) == 64, "the rest were refused, still the caller's"
    with pytest.raises(resident.QueueFullError):
        rt.send_batch(kid, records(1, 100))
    rep = rt.terminate(kid)
    assert len(rep.undelivered) == 64
    assert [r["id"] for r in rep.undelivered] == list(range(64))


def test_batch_handler_raising_fails_kernel(rt):
    kid = fresh("bad")

    def bad(state, batch):
        raise RuntimeError("vectorized handler broke")

    resident.batch_kernel(kernel_id=kid, in_dtype=DT)(bad)
    rt.launch(kid)
    rt.activate(kid)
    rt.send_batch(kid, records(3))
    with pytest.raises(resident.KernelFailedError) as e:
        rt.receive_batch(kid, 10, timeout=10)
    assert "vectorized handler broke" in str(e.value)
    assert rt.state(kid) == "failed"


def test_batch_bad_input():
    with pytest.raises(ValueError):
        resident.batch_kernel(kernel_id=fresh("big"), in_dtype=np.dtype((np.uint8, 300)))(lambda s, b: b)
    with pytest.raises(TypeError):
        resident.batch_kernel(kernel_id=fresh("obj"), in_dtype=object)(lambda s, b: b)
    with resident.Runtime(backend="cpu") as r:
        kid = fresh("e")
        scale_kernel(kid)
        r.launch(kid)
        assert r.send_batch(kid, records(0)) == 0
        with pytest.raises(resident.KernelNotFoundError):
            r.receive_batch(fresh("none"), 1)
        obj = fresh("objk")

        async def echo(ctx):
            while not ctx.should_terminate:
                await ctx.wait_active(0.05)

        r.launch(obj, echo)
        with pytest.raises(TypeError):
            r.send_batch(obj, records(1))

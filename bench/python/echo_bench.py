"""Echo actor benchmark: resident (Python package over the Rust engine) beside PyDotCompute.

The same echo actor (``async def echo(ctx)``: receive, reply with the value + 1) runs on both
packages with only the import changed. Measured in one process run, alternating packages,
``--repeats`` times each:

* round trip: ``await runtime.send(...)`` then ``await runtime.receive(...)``, one message in
  flight, ``--n`` messages after ``--warmup``; p50/p99 in microseconds;
* throughput: ``--n`` messages with up to ``--window`` unanswered (send while fewer are in
  flight, then receive), messages per second.

Usage: python echo_bench.py --out ../results/python-echo.json   (PyDotCompute 0.2.0 must be
importable; the command line is recorded in the JSON.)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import platform
import statistics
import sys
import time


def make_actor(pkg):
    @pkg.message
    class Ping:
        value: int = 0

    async def echo(ctx):
        while not ctx.should_terminate:
            if not ctx.is_active:
                await ctx.wait_active()
                continue
            try:
                msg = await ctx.receive(timeout=0.1)
            except asyncio.TimeoutError:
                continue
            await ctx.send(Ping(value=msg.value + 1, correlation_id=msg.message_id))

    return Ping, echo


async def run_one(name: str, n: int, warmup: int, window: int, backend: str):
    pkg = importlib.import_module(name)
    Ping, echo = make_actor(pkg)
    kid = f"echo_{name}_{time.monotonic_ns()}"
    pkg.ring_kernel(kernel_id=kid, queue_size=4096)(echo)
    kwargs = {"enable_telemetry": True}
    if name == "resident":
        kwargs["backend"] = backend
    async with pkg.RingKernelRuntime(**kwargs) as rt:
        await rt.launch(kid)
        await rt.activate(kid)
        msgs = [Ping(value=i) for i in range(max(n, warmup))]
        for i in range(warmup):
            await rt.send(kid, msgs[i])
            r = await rt.receive(kid, timeout=5.0)
            assert r.value == i + 1
        lat = []
        pc = time.perf_counter_ns
        for i in range(n):
            t0 = pc()
            await rt.send(kid, msgs[i])
            r = await rt.receive(kid, timeout=5.0)
            lat.append(pc() - t0)
            assert r.value == i + 1
        lat.sort()
        # throughput with up to `window` unanswered
        sent = got = 0
        total = 0
        t0 = time.perf_counter()
        while got < n:
            while sent < n and sent - got < window:
                await rt.send(kid, msgs[sent])
                sent += 1
            r = await rt.receive(kid, timeout=5.0)
            total += r.value
            got += 1
        dt = time.perf_counter() - t0
        assert total == sum(m.value + 1 for m in msgs[:n])
        tel = rt.get_telemetry(kid)
        processed = tel.messages_processed
    return {
        "p50_us": lat[len(lat) // 2] / 1e3,
        "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1e3,
        "throughput_msg_s": n / dt,
        "telemetry_messages_processed": processed,
    }


async def run_batch(n: int, warmup: int, chunk: int, backend: str):
    """resident's batch kernel: the same echo (value + 1) as a vectorized handler over numpy
    records, driven with send_batch/receive_batch (no Python object per message)."""
    import numpy as np
    import resident

    dt = np.dtype([("value", "<i8")])
    kid = f"echo_batch_{time.monotonic_ns()}"

    def echo(state, batch):
        out = batch.copy()
        out["value"] += 1
        return out

    resident.batch_kernel(kernel_id=kid, in_dtype=dt, queue_size=4096, max_batch=1024)(echo)
    async with resident.RingKernelRuntime(backend=backend) as rt:
        await rt.launch(kid)
        await rt.activate(kid)
        one = np.zeros(1, dt)
        lat = []
        pc = time.perf_counter_ns
        for i in range(warmup + n):
            one["value"] = i
            t0 = pc()
            await rt.send_batch(kid, one)
            r = await rt.receive_batch(kid, 1, timeout=5.0)
            if i >= warmup:
                lat.append(pc() - t0)
            assert len(r) == 1 and r["value"][0] == i + 1
        lat.sort()
        total_n = n * 10
        data = np.zeros(total_n, dt)
        data["value"] = np.arange(total_n)
        sent = got = 0
        acc = 0
        t0 = time.perf_counter()
        while got < total_n:
            room = sent < total_n and sent - got < 4 * chunk
            if room:
                sent += await rt.send_batch(kid, data[sent : sent + chunk])
            # Look without waiting while there is room to send more; otherwise wait (with the
            # GIL released) for outputs, so the kernel's thread can run.
            r = await rt.receive_batch(kid, 1 << 20, timeout=0.0 if room else 5.0)
            got += len(r)
            acc += int(r["value"].sum())
        dt_s = time.perf_counter() - t0
        assert acc == int(data["value"].sum()) + total_n
        processed = rt.get_telemetry(kid).messages_processed
    return {
        "p50_us": lat[len(lat) // 2] / 1e3,
        "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1e3,
        "throughput_msg_s": total_n / dt_s,
        "throughput_messages": total_n,
        "telemetry_messages_processed": processed,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--chunk", type=int, default=1000)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    names = ["resident", "pydotcompute", "resident_batch"]
    runs = {k: [] for k in names}
    for rep in range(a.repeats):
        for name in names:
            if name == "resident_batch":
                r = asyncio.run(run_batch(a.n, a.warmup, a.chunk, a.backend))
            else:
                r = asyncio.run(run_one(name, a.n, a.warmup, a.window, a.backend))
            print(name, rep, r, flush=True)
            runs[name].append(r)

    def agg(name, key):
        v = [r[key] for r in runs[name]]
        return {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}

    summary = {}
    for name in names:
        summary[name] = {k: agg(name, k) for k in ("p50_us", "p99_us", "throughput_msg_s")}
    def ratio(a_, key):
        return [r[key] / p[key] for r, p in zip(runs[a_], runs["pydotcompute"])]
    out = {
        "command": "python bench/python/echo_bench.py " + " ".join(sys.argv[1:]),
        "machine": "shared 2-vCPU VM, no GPU",
        "python": platform.python_version(),
        "load": f"echo actor, {a.n} messages per measure after {a.warmup} warm-up; round trip = "
        f"send then receive, one in flight; throughput = up to {a.window} unanswered. "
        f"resident_batch: the same echo as a vectorized handler over numpy records (int64), "
        f"round trip = send_batch of 1 record then receive_batch; throughput = {10 * a.n} "
        f"records sent in chunks of {a.chunk}, at most 4 chunks unanswered",
        "packages": {
            "resident": importlib.import_module("resident").__version__,
            "pydotcompute": importlib.import_module("pydotcompute").__version__,
        },
        "resident_backend": a.backend,
        "repeats": a.repeats,
        "summary": summary,
        "ratios_per_repeat": {
            "throughput_resident_over_pydotcompute": ratio("resident", "throughput_msg_s"),
            "p50_resident_over_pydotcompute": ratio("resident", "p50_us"),
            "throughput_resident_batch_over_pydotcompute": ratio("resident_batch", "throughput_msg_s"),
            "p50_resident_batch_over_pydotcompute": ratio("resident_batch", "p50_us"),
        },
        "goal": "throughput >= 10x PyDotCompute, p50 <= 1/5 of PyDotCompute",
        "not_measured": "a device kernel (CUDA/CudaSim/wgpu) driven from Python: not built",
    }
    print(json.dumps(out["summary"], indent=1))
    print(json.dumps(out["ratios_per_repeat"], indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()

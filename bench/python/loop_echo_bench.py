"""Kernels on the caller's event loop (issue 40, item 1): echo round trip and idle cost.

Measured in one process run, alternating, ``--repeats`` times each, on the stdlib loop and on
uvloop (when installed):

* **floor**: two coroutines ping-ponging through two ``asyncio.Queue`` objects (``put`` then
  ``get``, one message in flight): what a round trip through the loop costs at least;
* **resident**: the seeds' echo kernel (``await ctx.receive()`` then ``await ctx.send``) with
  ``thread=False`` (the default since issue 40), launched by ``RingKernelRuntime.launch``, i.e. as a task of the caller's
  loop, driven by ``await rt.send`` then ``await rt.receive`` (one in flight), through the
  engine's queues;
* **resident_thread**: the same kernel with ``thread=True`` (its own thread and loop);
* **pydotcompute**: PyDotCompute 0.2.0's runtime with the same echo, when it is importable.

p50/p99 of ``--n`` round trips after ``--warmup``, in microseconds. Then **idle**: ``--idle``
kernels launched and activated, nothing sent, for ``--seconds``: the process's CPU seconds
meanwhile (``resource.getrusage``), for each package/mode, with the echo above (``receive()``
without a timeout) and with the seeds' echo (``receive(timeout=0.1)`` in a loop).

Usage: python bench/python/loop_echo_bench.py --out bench/results/python-loop-echo-<date>.json
(the command line is recorded in the JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import os
import platform
import resource
import statistics
import sys
import time


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def pct(lat, q):
    return lat[min(len(lat) - 1, int(len(lat) * q))] / 1e3


async def floor(n: int, warmup: int) -> dict:
    a: asyncio.Queue = asyncio.Queue()
    b: asyncio.Queue = asyncio.Queue()

    async def echo():
        while True:
            m = await a.get()
            if m is None:
                return
            await b.put(m + 1)

    t = asyncio.ensure_future(echo())
    pc = time.perf_counter_ns
    lat = []
    for i in range(warmup + n):
        t0 = pc()
        await a.put(i)
        r = await b.get()
        if i >= warmup:
            lat.append(pc() - t0)
        assert r == i + 1
    await a.put(None)
    await t
    lat.sort()
    return {"p50_us": pct(lat, 0.5), "p99_us": pct(lat, 0.99)}


def make_echo(pkg):
    async def echo(ctx):
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
            await ctx.send(msg + 1)

    return echo


async def kernel_echo(name: str, n: int, warmup: int, thread: bool) -> dict:
    pkg = importlib.import_module(name)
    echo = make_echo(pkg)
    kid = f"echo_{name}_{thread}_{time.monotonic_ns()}"
    kw = {"thread": thread} if name == "resident" else {}
    pkg.ring_kernel(kernel_id=kid, queue_size=4096, **kw)(echo)
    rt_kw = {"backend": "cpu"} if name == "resident" else {}
    async with pkg.RingKernelRuntime(**rt_kw) as rt:
        await rt.launch(kid)
        await rt.activate(kid)
        pc = time.perf_counter_ns
        lat = []
        for i in range(warmup + n):
            t0 = pc()
            await rt.send(kid, i)
            r = await rt.receive(kid, timeout=5.0)
            if i >= warmup:
                lat.append(pc() - t0)
            assert r == i + 1
        processed = rt.get_telemetry(kid).messages_processed
        await rt.terminate(kid)
    lat.sort()
    return {"p50_us": pct(lat, 0.5), "p99_us": pct(lat, 0.99), "processed": processed}


async def idle_cpu(name: str, kernels: int, seconds: float, thread: bool, seed: bool) -> dict:
    pkg = importlib.import_module(name)
    if seed:  # the seeds' echo: receive(timeout=0.1) in a loop (echo_bench.make_actor)
        from echo_bench import make_actor

        _, echo = make_actor(pkg)
    else:
        echo = make_echo(pkg)
    ids = [f"idle_{name}_{thread}_{i}_{time.monotonic_ns()}" for i in range(kernels)]
    kw = {"thread": thread} if name == "resident" else {}
    for kid in ids:
        pkg.ring_kernel(kernel_id=kid, queue_size=256, **kw)(echo)
    rt_kw = {"backend": "cpu"} if name == "resident" else {}
    async with pkg.RingKernelRuntime(**rt_kw) as rt:
        for kid in ids:
            await rt.launch(kid)
            await rt.activate(kid)
        await asyncio.sleep(0.5)  # settled
        threads = len(os.listdir("/proc/self/task"))  # the OS's count (the engine's included)
        c0, t0 = cpu_seconds(), time.perf_counter()
        await asyncio.sleep(seconds)
        c1, t1 = cpu_seconds(), time.perf_counter()
    return {"kernels": kernels, "seconds": t1 - t0, "cpu_seconds": c1 - c0, "threads": threads}


def run(loop_kind: str, coro):
    if loop_kind == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--idle", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    have_pdc = importlib.util.find_spec("pydotcompute") is not None
    loops = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") else [])
    names = ["floor", "resident", "resident_thread"] + (["pydotcompute"] if have_pdc else [])
    runs = {lk: {k: [] for k in names} for lk in loops}
    for rep in range(a.repeats):
        for lk in loops:
            for name in names:
                if name == "floor":
                    r = run(lk, floor(a.n, a.warmup))
                elif name == "pydotcompute":
                    r = run(lk, kernel_echo("pydotcompute", a.n, a.warmup, False))
                else:
                    r = run(lk, kernel_echo("resident", a.n, a.warmup, name == "resident_thread"))
                print(lk, name, rep, r, flush=True)
                runs[lk][name].append(r)
    summary = {}
    for lk in loops:
        summary[lk] = {}
        for name in names:
            v = [r["p50_us"] for r in runs[lk][name]]
            w = [r["p99_us"] for r in runs[lk][name]]
            summary[lk][name] = {"p50_us_median": statistics.median(v), "p99_us_median": statistics.median(w)}
        summary[lk]["resident_p50_over_floor_per_repeat"] = [
            r["p50_us"] / f["p50_us"] for r, f in zip(runs[lk]["resident"], runs[lk]["floor"])
        ]
    idle = {}
    modes = [("resident", False), ("resident_thread", True)] + ([("pydotcompute", False)] if have_pdc else [])
    for seed in (False, True):
        for label, thread in modes:
            name = "pydotcompute" if label == "pydotcompute" else "resident"
            key = label + ("_seed_echo_timeout_0.1" if seed else "_receive_no_timeout")
            idle[key] = asyncio.run(idle_cpu(name, a.idle, a.seconds, thread, seed))
            print("idle", key, idle[key], flush=True)
    doc = {
        "command": "python " + " ".join(["bench/python/loop_echo_bench.py"] + sys.argv[1:]),
        "machine": "shared 2-vCPU VM, no GPU",
        "python": platform.python_version(),
        "load_at_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "packages": {
            "resident": "0.1.0 (thread=False: kernel on the caller's loop)",
            **({"pydotcompute": importlib.import_module("pydotcompute").__version__} if have_pdc else {}),
            **({"uvloop": importlib.import_module("uvloop").__version__} if "uvloop" in loops else {}),
        },
        "what": f"echo round trip (send then receive, one in flight), {a.n} after {a.warmup} warm-up, "
        f"alternating floor/resident/resident_thread per loop type, {a.repeats} repeats; floor = two "
        f"coroutines through two asyncio.Queue; idle = {a.idle} kernels launched and activated, "
        f"nothing sent, CPU seconds of the process over {a.seconds} s",
        "targets": "resident p50 <= 2x floor on the same loop type; 100 idle kernels <= ~0.2 CPU-s per 10 s",
        "runs": runs,
        "summary": summary,
        "idle": idle,
    }
    print(json.dumps(summary, indent=1))
    print(json.dumps(idle, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()

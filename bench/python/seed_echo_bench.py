"""The seeds' echo program and idle kernels: resident beside PyDotCompute 0.2.0, same run.

* **seed echo**: the seeds' pattern, only the import changed: a producer task sends ``--n``
  messages (``await runtime.send``) while the main coroutine receives them
  (``await runtime.receive``), queue 4096; it must finish every run (resident before issue 29
  stopped with SendTimeoutError after 13 394 of 50 000). Messages per second.
* **idle CPU**: ``--idle`` echo kernels launched and activated, nothing sent, for ``--seconds``:
  the CPU seconds the process used meanwhile (``resource.getrusage``).

Usage: python seed_echo_bench.py --out ../results/python-seed-echo-<date>.json [--repeats 3]
(PyDotCompute 0.2.0 must be importable; the command line is recorded in the JSON.)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import platform
import resource
import sys
import time

from echo_bench import make_actor


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def seed_echo(name: str, n: int) -> dict:
    pkg = importlib.import_module(name)
    Ping, echo = make_actor(pkg)
    kid = f"seed_{name}_{time.monotonic_ns()}"
    pkg.ring_kernel(kernel_id=kid, queue_size=4096)(echo)
    async with pkg.RingKernelRuntime() as rt:
        await rt.launch(kid)
        await rt.activate(kid)

        async def producer():
            for i in range(n):
                await rt.send(kid, Ping(value=i))

        t0 = time.perf_counter()
        task = asyncio.create_task(producer())
        got = 0
        try:
            for _ in range(n):
                await rt.receive(kid, timeout=30.0)
                got += 1
            await task
            error = None
        except Exception as e:  # recorded: the run did not finish
            error = f"{type(e).__name__}: {e}"
            task.cancel()
        dt = time.perf_counter() - t0
    return {"received": got, "of": n, "finished": got == n and error is None,
            "msg_s": got / dt, "error": error}


async def idle_cpu(name: str, kernels: int, seconds: float) -> dict:
    pkg = importlib.import_module(name)
    _, echo = make_actor(pkg)
    ids = [f"idle_{name}_{i}_{time.monotonic_ns()}" for i in range(kernels)]
    for kid in ids:
        pkg.ring_kernel(kernel_id=kid, queue_size=256)(echo)
    async with pkg.RingKernelRuntime() as rt:
        for kid in ids:
            await rt.launch(kid)
            await rt.activate(kid)
        await asyncio.sleep(0.5)  # settled
        c0, t0 = cpu_seconds(), time.perf_counter()
        await asyncio.sleep(seconds)
        c1, t1 = cpu_seconds(), time.perf_counter()
    return {"kernels": kernels, "seconds": t1 - t0, "cpu_seconds": c1 - c0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--idle", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    names = ["resident", "pydotcompute"]
    runs = {k: [] for k in names}
    for _ in range(a.repeats):
        for name in names:
            runs[name].append(asyncio.run(seed_echo(name, a.n)))
            print(name, runs[name][-1], flush=True)
    idle = {}
    for name in names:
        idle[name] = asyncio.run(idle_cpu(name, a.idle, a.seconds))
        print(name, idle[name], flush=True)
    doc = {
        "command": "python " + " ".join(["bench/python/seed_echo_bench.py"] + sys.argv[1:]),
        "machine": "shared 2-vCPU VM, no GPU",
        "python": platform.python_version(),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "packages": {"resident": importlib.import_module("resident").__version__ if hasattr(importlib.import_module("resident"), "__version__") else "0.1.0",
                     "pydotcompute": importlib.import_module("pydotcompute").__version__},
        "what": f"seed echo: a producer task sends {a.n} messages while the main coroutine receives, queue 4096, "
                f"alternating packages, {a.repeats} repeats; idle: {a.idle} echo kernels launched and activated, "
                f"nothing sent, CPU seconds of the process over {a.seconds} s",
        "seed_echo": runs,
        "idle": idle,
    }
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()

"""The seeds' batch processor: resident's batch messaging beside PyDotCompute 0.2.0, same run.

The seeds' optimization guide ("Actor Optimization / Batch Processing") shows a ring kernel
that collects up to 100 messages (``await ctx.receive(timeout=0.01)`` each), processes them
together and sends one response per message. Both packages run it here:

* **pydotcompute (seed)**: the seed's kernel verbatim (only ``process_batch_gpu`` and the two
  message classes are defined, the same for every package), fed by a producer task that
  sends ``--n`` requests with ``await runtime.send`` while the main coroutine takes the
  responses with ``await runtime.receive`` (PyDotCompute has no batch calls).
* **resident (seed)**: the same seed kernel and client on resident (only the import changed).
* **resident (batch)**: the seed's kernel rewritten with resident's batch messaging
  (``await ctx.receive_batch(100, timeout=0.01)``, ``await ctx.send_batch(responses)``), fed
  by ``await runtime.send_batch`` of 100 requests at a time and drained by
  ``await runtime.receive_batch``: one engine call and one coroutine round per batch.

Every run creates its ``--n`` request objects inside the timed region (a real producer makes
its messages) and checks that every response arrived, matched to its request
(``correlation_id``) with the right result. Throughput: responses per second. The packages
alternate, ``--repeats`` times each; the ratio is resident (batch) over pydotcompute (seed)
per repeat.

Usage (from the repository root, a release build of the extension installed):
    python bench/python/batch_processor_bench.py --out bench/results/python-batch-processor-<date>.json
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

BATCH = 100


def make_seed(pkg):
    """The seed's program for package ``pkg``: its messages, its processing function and its
    kernel (the kernel's text is the seed's, unchanged)."""

    @pkg.message
    class Request:
        value: float = 0.0

    @pkg.message
    class Response:
        result: float = 0.0

    def process_batch_gpu(batch):
        return [msg.value * 2.0 + 1.0 for msg in batch]

    async def batch_processor(ctx):
        batch_size = 100

        while not ctx.should_terminate:
            if not ctx.is_active:
                await ctx.wait_active()
                continue

            try:
                # Collect batch
                batch = []
                for _ in range(batch_size):
                    try:
                        msg = await ctx.receive(timeout=0.01)
                        batch.append(msg)
                    except asyncio.TimeoutError:
                        break

                if batch:
                    # Process batch on GPU
                    results = process_batch_gpu(batch)

                    # Send responses
                    for msg, result in zip(batch, results):
                        await ctx.send(Response(
                            result=result,
                            correlation_id=msg.message_id,
                        ))

            except:  # noqa: E722 - the seed's own text
                continue

    return Request, Response, process_batch_gpu, batch_processor


def make_batched(pkg):
    """The seed's kernel rewritten with resident's batch messaging."""
    Request, Response, process_batch_gpu, _ = make_seed(pkg)

    async def batch_processor(ctx):
        while not ctx.should_terminate:
            if not ctx.is_active:
                await ctx.wait_active()
                continue
            batch = await ctx.receive_batch(100, timeout=0.01)
            if batch:
                results = process_batch_gpu(batch)
                await ctx.send_batch([
                    Response(result=result, correlation_id=msg.message_id)
                    for msg, result in zip(batch, results)
                ])

    return Request, Response, process_batch_gpu, batch_processor


def check(requests, responses) -> bool:
    want = {r.message_id: r.value * 2.0 + 1.0 for r in requests}
    return len(responses) == len(requests) and all(
        want.pop(r.correlation_id, None) == r.result for r in responses
    )


async def run_seed(name: str, n: int) -> dict:
    """The seed's kernel and a per-message client (what PyDotCompute offers)."""
    pkg = importlib.import_module(name)
    Request, Response, _, kernel = make_seed(pkg)
    kid = f"batch_processor_{name}_{time.monotonic_ns()}"
    pkg.ring_kernel(kernel_id=kid, queue_size=10000)(kernel)
    async with pkg.RingKernelRuntime() as rt:
        await rt.launch(kid)
        await rt.activate(kid)
        sent = []

        async def producer():
            for i in range(n):
                m = Request(value=float(i))
                sent.append(m)
                await rt.send(kid, m)

        t0 = time.perf_counter()
        task = asyncio.create_task(producer())
        got = []
        error = None
        try:
            for _ in range(n):
                got.append(await rt.receive(kid, timeout=30.0))
            await task
        except Exception as e:  # recorded: the run did not finish
            error = f"{type(e).__name__}: {e}"
            task.cancel()
        dt = time.perf_counter() - t0
    return {"received": len(got), "of": n, "correct": error is None and check(sent, got),
            "seconds": dt, "msg_s": len(got) / dt, "error": error}


async def run_batched(n: int) -> dict:
    """Resident's batch form: the rewritten kernel, send_batch/receive_batch of objects."""
    import resident as pkg

    Request, Response, _, kernel = make_batched(pkg)
    kid = f"batch_processor_batched_{time.monotonic_ns()}"
    pkg.ring_kernel(kernel_id=kid, queue_size=10000)(kernel)
    async with pkg.RingKernelRuntime() as rt:
        await rt.launch(kid)
        await rt.activate(kid)
        sent = []

        async def producer():
            for i in range(0, n, BATCH):
                chunk = [Request(value=float(j)) for j in range(i, min(i + BATCH, n))]
                sent.extend(chunk)
                k = 0
                while k < len(chunk):
                    k += await rt.send_batch(kid, chunk[k:])

        t0 = time.perf_counter()
        task = asyncio.create_task(producer())
        got = []
        error = None
        try:
            while len(got) < n:
                got.extend(await rt.receive_batch(kid, 10 * BATCH, timeout=30.0))
            await task
        except Exception as e:  # recorded: the run did not finish
            error = f"{type(e).__name__}: {e}"
            task.cancel()
        dt = time.perf_counter() - t0
    return {"received": len(got), "of": n, "correct": error is None and check(sent, got),
            "seconds": dt, "msg_s": len(got) / dt, "error": error}


def python_new_id_factory():
    """The pure-Python id generator resident used before its ids were made in the extension
    (``--compare-ids``): version-4 UUIDs from a ``random.Random`` seeded from ``os.urandom``."""
    import random
    import uuid

    bits = random.Random(os.urandom(32)).getrandbits
    new, setattr_ = object.__new__, object.__setattr__
    cls, safe = uuid.UUID, uuid.SafeUUID.unknown
    clear, set_ = ~((0xC000 << 48) | (0xF000 << 64)), (0x8000 << 48) | (4 << 76)

    def new_id():
        u = new(cls)
        setattr_(u, "int", (bits(128) & clear) | set_)
        setattr_(u, "is_safe", safe)
        return u

    return new_id


async def run_batched_python_ids(n: int) -> dict:
    """``run_batched`` with resident's message ids made by the former Python function."""
    importlib.import_module("resident")
    mod = sys.modules["resident.message"]
    was = mod.new_id
    mod.new_id = python_new_id_factory()
    try:
        return await run_batched(n)
    finally:
        mod.new_id = was


def spread(xs):
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--build", default="release (maturin develop --release)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip-resident-seed", action="store_true")
    ap.add_argument("--compare-ids", action="store_true",
                    help="also run resident (batch) with the former pure-Python message ids")
    ap.add_argument("--gc-threshold", type=int, default=None,
                    help="gc.set_threshold(N, 10, 10) for every run (CPython's default is 700)")
    a = ap.parse_args()
    if a.gc_threshold is not None:
        import gc

        gc.set_threshold(a.gc_threshold, 10, 10)
    runs = {"pydotcompute_seed": [], "resident_seed": [], "resident_batch": []}
    if a.compare_ids:
        runs["resident_batch_python_ids"] = []
    load_before = os.getloadavg()
    for _ in range(a.repeats):
        if a.compare_ids:
            runs["resident_batch_python_ids"].append(asyncio.run(run_batched_python_ids(a.n)))
            print("resident batch, Python ids", runs["resident_batch_python_ids"][-1], flush=True)
        runs["pydotcompute_seed"].append(asyncio.run(run_seed("pydotcompute", a.n)))
        print("pydotcompute seed", runs["pydotcompute_seed"][-1], flush=True)
        if not a.skip_resident_seed:
            runs["resident_seed"].append(asyncio.run(run_seed("resident", a.n)))
            print("resident seed", runs["resident_seed"][-1], flush=True)
        runs["resident_batch"].append(asyncio.run(run_batched(a.n)))
        print("resident batch", runs["resident_batch"][-1], flush=True)
    ratios = [b["msg_s"] / p["msg_s"] for b, p in zip(runs["resident_batch"], runs["pydotcompute_seed"])]
    summary = {k: spread([r["msg_s"] for r in v]) for k, v in runs.items() if v}
    summary["ratio_resident_batch_over_pydotcompute_seed"] = spread(ratios)
    summary["ratios_per_repeat"] = ratios
    if a.compare_ids:
        summary["ratio_extension_ids_over_python_ids"] = spread(
            [b["msg_s"] / p["msg_s"] for b, p in zip(runs["resident_batch"], runs["resident_batch_python_ids"])])
    summary["goal"] = ">= 10x"
    summary["goal_met_every_repeat"] = all(r >= 10 for r in ratios)
    res = importlib.import_module("resident")
    doc = {
        "command": "python " + " ".join(["bench/python/batch_processor_bench.py"] + sys.argv[1:]),
        "machine": "shared 2-vCPU VM, no GPU",
        "python": platform.python_version(),
        "build": a.build,
        "gc_threshold": __import__("gc").get_threshold(),
        "load_average_before": " ".join(f"{x:.2f}" for x in load_before),
        "load_average_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "packages": {"resident": getattr(res, "__version__", "0.1.0"),
                     "pydotcompute": importlib.import_module("pydotcompute").__version__},
        "what": f"the seeds' batch processor (collect up to 100 messages, process, send one response "
                f"each), {a.n} requests per run, queue_size 10000, responses per second; "
                f"pydotcompute and resident run the seed's kernel with per-message send/receive, "
                f"resident_batch the rewrite with ctx.receive_batch/ctx.send_batch and "
                f"runtime.send_batch/receive_batch (100 per send); packages alternate, "
                f"{a.repeats} repeats; every run checks each response against its request",
        "runs": runs,
        "summary": summary,
    }
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

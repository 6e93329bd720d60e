"""Issue 40's targets, each measurement in a fresh process, alternating, medians of ``--repeats``.

This driver reuses the other scripts' measurements (their methods unchanged) and runs each one
in a process of its own (``python issue40_bench.py --one KIND SIDE LOOP`` prints one JSON
result), alternating the sides within each repeat:

* ``floor``: two coroutines ping-ponging through two ``asyncio.Queue`` objects
  (``loop_echo_bench.floor``), on the stdlib loop and on uvloop;
* ``seed_rtt``: the seeds' echo actor (``echo_bench.make_actor``: ``@message`` objects,
  ``receive(timeout=0.1)``, a reply with ``correlation_id``) driven by ``await runtime.send``
  then ``await runtime.receive``, one in flight (``echo_bench.run_one``: p50/p99, and its
  windowed throughput, up to 256 unanswered), resident and PyDotCompute, on both loop types;
* ``int_rtt``: ``loop_echo_bench.kernel_echo`` (ints, ``receive()`` without timeout), resident
  on the caller's loop and PyDotCompute, on both loop types;
* ``seed_echo``: the seeds' echo throughput, a producer task sending while the main coroutine
  receives (``seed_echo_bench.seed_echo``), resident and PyDotCompute (stdlib loop);
* ``batch_processor``: the seed guide's batch processor (``batch_processor_bench``): the seed's
  kernel on PyDotCompute and on resident (only the import changed), and resident's batch form;
  every response checked.

``seed_echo`` and ``batch_processor`` also run on ``asyncio_floor``: the same programs over two
``deque`` queues per kernel on the caller's loop (a transport that costs next to nothing, no
runtime features, resident's message objects). What it reaches is the most any runtime can
reach with these programs on this loop, so (floor / PyDotCompute) bounds every ratio.

Usage (from the repository root, resident built with ``maturin develop --release``):
    python bench/python/issue40_bench.py --out bench/results/python-issue40-<date>.json
The command line, the load average before and after and every run are recorded in the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

LOOPS = ["asyncio", "uvloop"]


def run_loop(loop_kind: str, coro):
    if loop_kind == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


def one(kind: str, side: str, loop: str, a) -> dict:
    if kind == "floor":
        import loop_echo_bench as m

        return run_loop(loop, m.floor(a.n, a.warmup))
    if kind == "seed_rtt":
        import echo_bench as m

        return run_loop(loop, m.run_one(side, a.n, a.warmup, 256, "cpu"))
    if kind == "int_rtt":
        import loop_echo_bench as m

        return run_loop(loop, m.kernel_echo(side, a.n, a.warmup, False))
    if kind == "seed_echo":
        import seed_echo_bench as m

        return run_loop(loop, m.seed_echo(side, a.seed_n))
    if kind == "batch_processor":
        import batch_processor_bench as m

        if side == "resident_batch":
            return run_loop(loop, m.run_batched(a.batch_n))
        return run_loop(loop, m.run_seed(side, a.batch_n))
    raise ValueError(kind)


def plan():
    """(kind, loop, sides) in the order each repeat runs them."""
    out = []
    for loop in LOOPS:
        out.append(("floor", loop, ["floor"]))
        out.append(("seed_rtt", loop, ["resident", "pydotcompute"]))
        out.append(("int_rtt", loop, ["resident", "pydotcompute"]))
    out.append(("seed_echo", "asyncio", ["resident", "pydotcompute", "asyncio_floor"]))
    out.append(("batch_processor", "asyncio",
                ["pydotcompute", "resident", "resident_batch", "asyncio_floor"]))
    return out


def spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", nargs=3, metavar=("KIND", "SIDE", "LOOP"))
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--seed-n", type=int, default=50000)
    ap.add_argument("--batch-n", type=int, default=50000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default=None, help="comma-separated kinds to run")
    ap.add_argument("--out", default=None)
    ap.add_argument("--note", default="")
    ap.add_argument("--base-python", default=None,
                    help="also run every resident side with this interpreter (another build of "
                         "resident installed in it), as SIDE_base, in the same alternation")
    a = ap.parse_args()
    if a.one:
        kind, side, loop = a.one
        print(json.dumps(one(kind, side, loop, a)))
        return
    only = None if a.only is None else set(a.only.split(","))
    steps = [s for s in plan() if only is None or s[0] in only]
    if a.base_python:
        steps = [(k, lp, [x for side in sides for x in
                          ([side, side + "_base"] if side.startswith("resident") else [side])])
                 for k, lp, sides in steps]
    load_before = os.getloadavg()
    runs: dict = {}
    passthrough = ["--n", str(a.n), "--warmup", str(a.warmup), "--seed-n", str(a.seed_n),
                   "--batch-n", str(a.batch_n)]
    for rep in range(a.repeats):
        for kind, loop, sides in steps:
            for side in sides:
                exe, real = sys.executable, side
                if side.endswith("_base"):
                    exe, real = a.base_python, side[: -len("_base")]
                cmd = [exe, os.path.abspath(__file__), "--one", kind, real, loop] + passthrough
                p = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE)
                if p.returncode != 0:
                    r = {"error": p.stderr[-2000:]}
                else:
                    r = json.loads(p.stdout.strip().splitlines()[-1])
                r["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
                runs.setdefault(kind, {}).setdefault(loop, {}).setdefault(side, []).append(r)
                print(rep, kind, loop, side, r, flush=True)
    summary: dict = {}
    for kind, by_loop in runs.items():
        for loop, by_side in by_loop.items():
            for side, rs in by_side.items():
                s = summary.setdefault(kind, {}).setdefault(loop, {}).setdefault(side, {})
                for key in ("p50_us", "p99_us", "throughput_msg_s", "msg_s"):
                    v = [r[key] for r in rs if key in r]
                    if v:
                        s[key] = spread(v)
    ratios: dict = {}

    def per_repeat(kind, loop, num, den, key):
        try:
            xs = runs[kind][loop][num]
            ys = runs[kind][loop][den]
        except KeyError:
            return None
        v = [x[key] / y[key] for x, y in zip(xs, ys) if key in x and key in y]
        return spread(v) if v else None

    for loop in LOOPS:
        if "floor" in runs and "seed_rtt" in runs:
            fl = runs["floor"].get(loop, {}).get("floor")
            for kind in ("seed_rtt", "int_rtt"):
                rs = runs.get(kind, {}).get(loop, {}).get("resident")
                if fl and rs:
                    ratios[f"{kind}_resident_p50_over_floor_{loop}"] = spread(
                        [r["p50_us"] / f["p50_us"] for r, f in zip(rs, fl)])
        for kind in ("seed_rtt", "int_rtt"):
            r = per_repeat(kind, loop, "resident", "pydotcompute", "p50_us")
            if r:
                ratios[f"{kind}_p50_resident_over_pydotcompute_{loop}"] = r
        r = per_repeat("seed_rtt", loop, "resident", "pydotcompute", "throughput_msg_s")
        if r:
            ratios[f"seed_rtt_window_throughput_resident_over_pydotcompute_{loop}"] = r
    r = per_repeat("seed_echo", "asyncio", "resident", "pydotcompute", "msg_s")
    if r:
        ratios["seed_echo_throughput_resident_over_pydotcompute"] = r
    for side in ("resident", "resident_batch", "resident_base", "resident_batch_base"):
        r = per_repeat("batch_processor", "asyncio", side, "pydotcompute", "msg_s")
        if r:
            ratios[f"batch_processor_{side}_over_pydotcompute"] = r
    if a.base_python:
        for loop in LOOPS:
            for kind in ("seed_rtt", "int_rtt"):
                for key in ("p50_us", "throughput_msg_s"):
                    r = per_repeat(kind, loop, "resident", "resident_base", key)
                    if r:
                        ratios[f"{kind}_{key}_new_over_base_{loop}"] = r
                fl = runs.get("floor", {}).get(loop, {}).get("floor")
                rs = runs.get(kind, {}).get(loop, {}).get("resident_base")
                if fl and rs:
                    ratios[f"{kind}_resident_base_p50_over_floor_{loop}"] = spread(
                        [r["p50_us"] / f["p50_us"] for r, f in zip(rs, fl)])
        r = per_repeat("seed_echo", "asyncio", "resident_base", "pydotcompute", "msg_s")
        if r:
            ratios["seed_echo_throughput_resident_base_over_pydotcompute"] = r
        r = per_repeat("seed_echo", "asyncio", "resident", "resident_base", "msg_s")
        if r:
            ratios["seed_echo_throughput_new_over_base"] = r
        for side in ("resident", "resident_batch"):
            r = per_repeat("batch_processor", "asyncio", side, side + "_base", "msg_s")
            if r:
                ratios[f"batch_processor_{side}_new_over_base"] = r
    import importlib

    doc = {
        "command": "python " + " ".join(["bench/python/issue40_bench.py"] + sys.argv[1:]),
        "machine": "2-vCPU shared VM, no GPU",
        "python": platform.python_version(),
        "note": a.note,
        "load_average_before": " ".join(f"{x:.2f}" for x in load_before),
        "load_average_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "packages": {
            "pydotcompute": importlib.import_module("pydotcompute").__version__,
            "uvloop": importlib.import_module("uvloop").__version__,
        },
        "what": f"each measurement in a fresh process, sides alternating within each of "
                f"{a.repeats} repeats; round trips: {a.n} after {a.warmup} warm-up, one in "
                f"flight; seed_echo: {a.seed_n} messages; batch_processor: {a.batch_n} requests",
        "targets": "seed_rtt resident p50 <= 2x floor on the same loop type; seed_echo and "
                   "batch_processor throughput >= 3x PyDotCompute 0.2.0",
        "runs": runs,
        "summary": summary,
        "ratios_per_repeat": ratios,
    }
    print(json.dumps(ratios, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()

"""The cycle collector's share of the seeds' echo program (``seed_echo_bench.seed_echo``).

Runs the echo ``--repeats`` times in this process with a ``gc.callbacks`` hook that times every
collection by generation, and once more with the collector off (``gc.disable()``), and prints
one JSON document: messages per second with and without the collector, and each generation's
collections, total and mean time per 100,000 messages.

Usage (from the repository root, resident built with ``maturin develop --release``):
    python bench/python/gc_echo_bench.py --out bench/results/python-gc-echo-<date>.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seed_echo_bench  # noqa: E402


def one(name: str, n: int, collector: bool) -> dict:
    stats = collections.defaultdict(lambda: [0, 0.0])
    start = [0.0]

    def hook(phase: str, info: dict) -> None:
        if phase == "start":
            start[0] = time.perf_counter()
        else:
            s = stats[info["generation"]]
            s[0] += 1
            s[1] += time.perf_counter() - start[0]

    gc.collect()
    if collector:
        gc.callbacks.append(hook)
    else:
        gc.disable()
    try:
        r = asyncio.run(seed_echo_bench.seed_echo(name, n))
    finally:
        if collector:
            gc.callbacks.remove(hook)
        else:
            gc.enable()
    return {
        "msg_s": r["msg_s"],
        "finished": r["finished"],
        "collector": collector,
        "generations": {
            str(g): {"collections": c, "ms": t * 1e3, "mean_us": t / c * 1e6 if c else 0.0}
            for g, (c, t) in sorted(stats.items())
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--package", default="resident")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    load_before = os.getloadavg()
    runs = [one(a.package, a.n, True) for _ in range(a.repeats)]
    runs += [one(a.package, a.n, False) for _ in range(a.repeats)]
    doc = {
        "command": "python " + " ".join(["bench/python/gc_echo_bench.py"] + sys.argv[1:]),
        "machine": "shared 2-vCPU VM, no GPU",
        "python": platform.python_version(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "what": f"the seeds' echo ({a.n} messages, queue 4096, a producer task and the receiving "
                f"coroutine) on {a.package}, {a.repeats} runs with the collector timed by "
                f"generation, then {a.repeats} with it off",
        "runs": runs,
    }
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    for r in runs:
        print(json.dumps(r))


if __name__ == "__main__":
    main()

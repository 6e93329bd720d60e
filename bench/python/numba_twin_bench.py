"""numba= handlers against their CUDA C twins, same run, same machine.

Measures, for the seed anomaly detector (a keyed kernel of 16 sensors, 20,000 readings per
round) and the pipeline's two stages (10,000 records):
* throughput per form and backend, rounds alternating between the two forms (``--repeat``):
  on cpu the numba= detector against the same fold as a plain Python key handler (the pipeline
  stages have no Python twin: both rows run numba=), on cuda/cudasim against the CUDA C twin;
* the launch: cold (fresh processes, an empty kernel cache) and cached (the same cache, a
  second fresh process), for each form.

  python bench/python/numba_twin_bench.py --backends cpu cudasim --repeat 5 \
      --out bench/results/python-numba-twins-<date>.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

LAUNCH = r"""
import sys, time, json
t0 = time.perf_counter()
import numpy as np, resident
from resident import numba_workloads as W
t1 = time.perf_counter()
backend, lang = sys.argv[1], sys.argv[2]
rt = resident.Runtime(backend=backend)
W.declare_anomaly("det", 16, lang)
t2 = time.perf_counter()
rt.launch("det")
t3 = time.perf_counter()
rt.shutdown()
print(json.dumps({"import_s": t1 - t0, "launch_s": t3 - t2}))
"""


def readings(n: int, seed: int) -> np.ndarray:
    from resident import numba_workloads as W

    rng = np.random.default_rng(seed)
    a = np.zeros(n, W.READING_DTYPE)
    a["index"] = np.arange(n)
    a["slot"] = rng.integers(0, 16, n)
    a["value"] = rng.normal(10.0, 2.0, n)
    a["value"][rng.integers(n // 10, n, max(1, n // 500))] += 60.0
    return a


def declare_python_twin(kernel_id: str) -> None:
    """The detector as a plain Python key handler (what a user writes without ``numba=``): the
    baseline of the CPU engine's figures."""
    import math

    import resident
    from resident import numba_workloads as W

    def fold(key, ks, inp):
        if inp["flush"] != 0:
            return (inp["index"], 0.0, 0.0, W.FLUSH, 0)
        x, n = float(inp["value"]), int(ks["n"])
        if n == 0:
            ks["m"], ks["v"], ks["n"] = x, 0.0, 1
            return None
        m, v = float(ks["m"]), float(ks["v"])
        z = math.fabs(x - m) / math.sqrt(v) if v > 0.0 else 0.0
        d = x - m
        ks["m"], ks["v"], ks["n"] = m + W.ALPHA * d, (1.0 - W.ALPHA) * (v + W.ALPHA * d * d), n + 1
        if v > 0.0 and z > W.Z and n >= W.WARMUP:
            return (inp["index"], x, z, inp["slot"], 0)
        return None

    resident.keyed_kernel(fold, kernel_id=kernel_id, keys=16, in_dtype=W.READING_DTYPE,
                          out_dtype=W.ALERT_DTYPE, state_dtype=W.SENSOR_STATS_DTYPE,
                          key_field="slot")


def spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def throughput(backend: str, repeat: int, n: int) -> dict:
    import resident
    from resident import numba_workloads as W

    langs = ["numba", "cuda"] if backend in ("cuda", "cudasim") else ["numba", "python"]
    rt = resident.Runtime(backend=backend)
    out = {"anomaly_readings_per_s": {}, "pipeline_records_per_s": {}}
    try:
        for lang in langs:
            if lang == "python":
                declare_python_twin(f"det_{lang}")
                W.declare_normalize(f"norm_{lang}", "numba")  # no Python twin of the stages
                W.declare_score(f"score_{lang}", "numba")
            else:
                W.declare_anomaly(f"det_{lang}", 16, lang)
                W.declare_normalize(f"norm_{lang}", lang)
                W.declare_score(f"score_{lang}", lang)
            for k in (f"det_{lang}", f"norm_{lang}", f"score_{lang}"):
                rt.launch(k)
                rt.activate(k)
        rates = {lang: [] for lang in langs}
        prates = {lang: [] for lang in langs}
        answers = {}
        for r in range(repeat):
            a = readings(n, r)
            raw = np.zeros(n // 2, W.RAW_DTYPE)
            raw["seq"] = np.arange(n // 2)
            raw["value"] = np.random.default_rng(r).normal(50, 40, n // 2)
            for lang in (langs if r % 2 == 0 else langs[::-1]):
                # Each round folds new readings into the same sensors' states.
                t = time.perf_counter()
                alerts, states = W.run_anomaly(rt, f"det_{lang}", 16, a, timeout=600)
                rates[lang].append(n / (time.perf_counter() - t))
                t = time.perf_counter()
                scored = W.run_pipeline(rt, f"norm_{lang}", f"score_{lang}", raw, timeout=600)
                prates[lang].append(len(raw) / (time.perf_counter() - t))
                answers.setdefault(r, {})[lang] = (alerts, states, scored)
        other = langs[1] if len(langs) == 2 else None
        if other is not None:
            out["identical_answers"] = all(
                all(np.array_equal(x, y) for x, y in zip(v["numba"], v[other]))
                for v in answers.values()
            )
        for lang in langs:
            out["anomaly_readings_per_s"][lang] = spread(rates[lang])
            out["pipeline_records_per_s"][lang] = spread(prates[lang])
        if other == "cuda":
            out["ratio_numba_over_cuda_c"] = {
                "anomaly": statistics.median(
                    x / y for x, y in zip(rates["numba"], rates["cuda"])
                ),
                "pipeline": statistics.median(
                    x / y for x, y in zip(prates["numba"], prates["cuda"])
                ),
            }
        if other == "python":
            out["ratio_numba_over_python_handler"] = {
                "anomaly": statistics.median(
                    x / y for x, y in zip(rates["numba"], rates["python"])
                ),
            }
    finally:
        rt.shutdown()
    return out


def launches(backend: str, repeat: int) -> dict:
    langs = ["numba", "cuda"] if backend in ("cuda", "cudasim") else ["numba"]  # launch times
    got = {lang: {"cold_s": [], "cached_s": []} for lang in langs}
    for _ in range(repeat):
        for lang in langs:
            with tempfile.TemporaryDirectory() as d:
                env = dict(os.environ, RESIDENT_KERNEL_CACHE=d)
                for which in ("cold_s", "cached_s"):
                    p = subprocess.run([sys.executable, "-c", LAUNCH, backend, lang], env=env,
                                       capture_output=True, text=True, timeout=600)
                    if p.returncode != 0:
                        raise SystemExit(p.stderr)
                    got[lang][which].append(json.loads(p.stdout.strip().splitlines()[-1])["launch_s"])
    return {lang: {k: spread(v) for k, v in d.items()} for lang, d in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", nargs="+", default=["cpu", "cudasim"])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--readings", type=int, default=20000)
    ap.add_argument("--launch-repeat", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    import numba

    res = {
        "command": "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:]),
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()})",
        "load_before": os.getloadavg(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "numba": numba.__version__,
        "note": "CudaSim runs the CUDA template on host threads: its ratios compare the two "
                "handler forms on this CPU, not on a GPU.",
        "backends": {},
    }
    for b in args.backends:
        res["backends"][b] = {
            "throughput": throughput(b, args.repeat, args.readings),
            "launch": launches(b, args.launch_repeat),
        }
    res["load_after"] = os.getloadavg()
    text = json.dumps(res, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

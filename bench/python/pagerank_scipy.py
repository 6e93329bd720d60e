"""Full PageRank: resident's CPU backend against scipy's CSR power iteration, same graph, same run.

The graph: ``--nodes`` nodes, each drawing ``--edges-per-node`` targets uniformly (numpy's
PCG64 seeded with ``--seed``), duplicate edges once, self-loops kept. It is written to
``--graph`` (``src dst`` per line) and both sides read those edges: resident through
``resident demo pagerank --graph FILE`` (ids 0..N-1, every node is a source, so the dense ids
are the file's ids), scipy from the arrays the file was written from.

Both sides run networkx's iteration (damping 0.85, start 1/N, dangling mass spread uniformly,
stop at L1 change < N * tol): scipy as ``x = d * (M @ x) + (d * x[dangling].sum() + 1 - d) / N``
with ``M`` the transition matrix in CSR (row v: ``1 / out(u)`` for each in-edge ``u -> v``),
one sparse matrix-vector product per iteration (scipy's, single-threaded), the L1 change
computed as networkx does; resident as its full-PageRank kernel on the CPU backend (one step
message per iteration, split over the rayon pool). Seconds per iteration: scipy's loop time /
iterations; resident's kernel time (after the CSR is built and the kernel launched, as the demo
prints it) / iterations. resident also runs with ``RAYON_NUM_THREADS=1`` (the same kernel on
one core). Rounds alternate the three, ``--repeats`` rounds. The ranks of the first resident run
are compared with scipy's (same iteration count, L1 distance at most 1e-9).

Usage (from the repository root, after ``cargo build --release -p resident-cli``):
    python3 -m venv target/bench-venv && target/bench-venv/bin/pip install scipy numpy
    target/bench-venv/bin/python bench/python/pagerank_scipy.py \\
        --resident target/release/resident --out bench/results/pagerank-scipy-DATE.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np
import scipy
import scipy.sparse as sp

DAMPING = 0.85


def make_graph(n: int, k: int, seed: int):
    rng = np.random.Generator(np.random.PCG64(seed))
    src = np.repeat(np.arange(n, dtype=np.int64), k)
    dst = rng.integers(0, n, size=n * k, dtype=np.int64)
    key = np.unique(src * n + dst)  # sorted, duplicates once
    return (key // n).astype(np.int64), (key % n).astype(np.int64)


def write_graph(path: str, src, dst) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("# pagerank_scipy.py graph: src dst\n")
        chunk = 1 << 20
        for i in range(0, len(src), chunk):
            s, d = src[i : i + chunk], dst[i : i + chunk]
            f.write("\n".join(f"{a} {b}" for a, b in zip(s.tolist(), d.tolist())))
            f.write("\n")


def scipy_pagerank(n: int, src, dst, tol: float, max_iter: int):
    out = np.bincount(src, minlength=n).astype(np.float64)
    dangling = out == 0
    w = 1.0 / out[src]
    m = sp.csr_matrix((w, (dst, src)), shape=(n, n))
    x = np.full(n, 1.0 / n)
    t = time.perf_counter()
    for it in range(1, max_iter + 1):
        xlast = x
        x = DAMPING * (m @ xlast) + (DAMPING * xlast[dangling].sum() + (1.0 - DAMPING)) / n
        err = np.absolute(x - xlast).sum()
        if err < n * tol:
            return x, it, time.perf_counter() - t
    raise RuntimeError(f"scipy: no convergence in {max_iter} iterations (err {err})")


LINE = re.compile(r"kernel ([0-9.]+) s for ([0-9]+) iterations")


def resident_pagerank(exe: str, graph: str, tol: float, threads: int | None, ranks_out=None):
    cmd = [exe, "demo", "pagerank", "--backend", "cpu", "--graph", graph, "--tol", repr(tol)]
    if ranks_out:
        cmd += ["--ranks-out", ranks_out]
    env = dict(os.environ)
    env.pop("RAYON_NUM_THREADS", None)
    if threads:
        env["RAYON_NUM_THREADS"] = str(threads)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    m = LINE.search(p.stdout)
    if not m:
        raise RuntimeError(f"no kernel time in the output of {' '.join(cmd)}:\n{p.stdout}")
    return float(m.group(1)), int(m.group(2)), p.stdout


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def stats(xs):
    return {
        "runs": xs,
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "mean": statistics.fmean(xs),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--resident", default="target/release/resident")
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--edges-per-node", type=int, default=5)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--tol", type=float, default=1e-10, help="networkx's tol (stop at L1 change < N tol)")
    ap.add_argument("--max-iter", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--graph", default="target/bench-pagerank/graph.txt")
    ap.add_argument("--out", required=True)
    ap.add_argument("--note", default="", help="what else ran on the machine (recorded in the JSON)")
    a = ap.parse_args()
    if a.repeats < 3:
        ap.error("--repeats must be at least 3")

    t = time.perf_counter()
    src, dst = make_graph(a.nodes, a.edges_per_node, a.seed)
    if np.unique(src).size != a.nodes:
        raise RuntimeError("some node has no out-edge: the file's ids would not be dense")
    write_graph(a.graph, src, dst)
    print(f"graph: {a.nodes} nodes, {len(src)} edges, written to {a.graph} in {time.perf_counter() - t:.1f} s")

    load = []
    sc, rs, r1 = [], [], []
    iters = {}
    check = None
    ranks_file = os.path.splitext(a.graph)[0] + "-ranks.txt"
    for r in range(a.repeats):
        load.append(os.getloadavg()[0])
        x, it, secs = scipy_pagerank(a.nodes, src, dst, a.tol, a.max_iter)
        sc.append(secs / it)
        iters["scipy"] = it
        want_ranks = x
        ks, kit, _ = resident_pagerank(a.resident, a.graph, a.tol, None, ranks_file if r == 0 else None)
        rs.append(ks / kit)
        iters["resident"] = kit
        if r == 0:
            got = np.zeros(a.nodes)
            ids, vals = np.loadtxt(ranks_file, unpack=True)
            got[ids.astype(np.int64)] = vals
            l1 = float(np.absolute(got - want_ranks).sum())
            check = {"iterations_equal": kit == it, "l1_distance_resident_vs_scipy": l1}
            if kit != it or not l1 <= 1e-9:
                raise RuntimeError(f"resident and scipy disagree: {check}")
        ks1, kit1, _ = resident_pagerank(a.resident, a.graph, a.tol, 1, None)
        r1.append(ks1 / kit1)
        load.append(os.getloadavg()[0])
        print(
            f"round {r + 1}: scipy {sc[-1]:.4f} s/iter, resident cpu {rs[-1]:.4f} s/iter, "
            f"resident 1 thread {r1[-1]:.4f} s/iter ({it} iterations), load {load[-1]:.1f}"
        )

    ratios = [b / s for s, b in zip(sc, rs)]
    result = {
        "benchmark": "full PageRank seconds per iteration: resident CPU backend vs scipy CSR power iteration",
        "command": shlex.join([os.path.relpath(sys.executable)] + sys.argv),
        "graph": {
            "nodes": a.nodes,
            "edges": int(len(src)),
            "generator": f"numpy PCG64 seed {a.seed}, {a.edges_per_node} uniform targets per node, duplicates once",
            "file": a.graph,
        },
        "params": {"damping": DAMPING, "tol": a.tol, "max_iter": a.max_iter},
        "iterations": iters,
        "check": check,
        "scipy_s_per_iter": stats(sc),
        "resident_cpu_s_per_iter": stats(rs),
        "resident_cpu_1_thread_s_per_iter": stats(r1),
        "ratio_resident_over_scipy": stats(ratios),
        "ratio_of_medians_resident_over_scipy": statistics.median(rs) / statistics.median(sc),
        "speedup_all_cores_over_1_thread": statistics.median(r1) / statistics.median(rs),
        "goal": "resident at most 0.5x scipy's time per iteration",
        "goal_met": statistics.median(rs) / statistics.median(sc) <= 0.5,
        "load_average_1min_samples": load,
        "note": a.note,
        "machine": {
            "cores": os.cpu_count(),
            "arch": platform.machine(),
            "cpu": cpu_model(),
            "os": platform.system().lower(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "scipy": scipy.__version__,
        },
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps({k: result[k] for k in ("ratio_of_medians_resident_over_scipy", "speedup_all_cores_over_1_thread", "goal_met")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

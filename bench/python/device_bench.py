"""Echo through a device kernel driven from Python: ``@device_kernel`` with the handler in CUDA
C (run on CudaSim) and WGSL (run on wgpu), beside the same kernel's vectorized CPU form on
the CPU backend as the baseline, measured in one process run, alternating, ``--repeats``
times each.

* round trip: ``send_batch`` of one record, then ``receive_batch(1, timeout)``, one record in
  flight, ``--n`` records after ``--warmup``; p50/p99 in microseconds;
* throughput: ``10 * --n`` records sent in chunks of ``--chunk``, at most 4 chunks unanswered,
  records per second (every output checked).

Usage: python bench/python/device_bench.py --out bench/results/python-device-<date>.json
(the command line is recorded in the JSON).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np

import resident

REC = np.dtype([("value", "<i4"), ("tag", "<u4")])

CUDA = r"""
__device__ bool handle(ResidentState* state, const ResidentIn* in, ResidentOut* out,
                       const Envelope* env) {
    out->value = in->value + 1;
    out->tag = in->tag;
    return true;
}
"""

WGSL = r"""
fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    (*out).value = input.value + 1;
    (*out).tag = input.tag;
    return true;
}
"""


def echo(state, batch):
    out = batch.copy()
    out["value"] += 1
    return out


def run(backend: str, n: int, warmup: int, chunk: int, max_batch: int):
    kid = f"echo_{backend}_{time.monotonic_ns()}"
    resident.device_kernel(
        kernel_id=kid, in_dtype=REC, cuda=CUDA, wgsl=WGSL, queue_size=8192, max_batch=max_batch
    )(echo)
    with resident.Runtime(backend=backend) as rt:
        rt.launch(kid)
        rt.activate(kid)
        placement = rt.placement(kid)
        one = np.zeros(1, REC)
        lat = []
        pc = time.perf_counter_ns
        for i in range(warmup + n):
            one["value"] = i
            t0 = pc()
            rt.send_batch(kid, one)
            r = rt.receive_batch(kid, 1, timeout=5.0)
            if i >= warmup:
                lat.append(pc() - t0)
            assert len(r) == 1 and r["value"][0] == i + 1, (backend, i, r)
        lat.sort()
        total = n * 10
        data = np.zeros(total, REC)
        data["value"] = np.arange(total)
        data["tag"] = np.arange(total)
        sent = got = 0
        acc = 0
        t0 = time.perf_counter()
        while got < total:
            room = sent < total and sent - got < 4 * chunk
            if room:
                sent += rt.send_batch(kid, data[sent : sent + chunk])
            r = rt.receive_batch(kid, 1 << 20, timeout=0.0 if room else 5.0)
            assert len(r) or room, f"{backend}: no output within 5 s"
            got += len(r)
            acc += int(r["value"].sum(dtype=np.int64))
        dt = time.perf_counter() - t0
        assert acc == int(data["value"].sum(dtype=np.int64)) + total
        processed = rt.get_telemetry(kid).messages_processed
    return {
        "placement": placement,
        "p50_us": lat[len(lat) // 2] / 1e3,
        "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1e3,
        "throughput_msg_s": total / dt,
        "throughput_messages": total,
        "telemetry_messages_processed": processed,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--chunk", type=int, default=1024)
    # CudaSim runs a batch's block as that many host threads: keep it small on 2 cores.
    ap.add_argument("--max-batch", default="cpu=1024,cudasim=32,wgpu=1024")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backends", default="cpu,cudasim,wgpu")
    ap.add_argument("--build", default="dev profile (unoptimized) build of the extension, as CI builds it")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    names = a.backends.split(",")
    mb = dict(kv.split("=") for kv in a.max_batch.split(","))
    runs = {k: [] for k in names}
    for rep in range(a.repeats):
        for b in names:
            r = run(b, a.n, a.warmup, a.chunk, int(mb.get(b, 1024)))
            print(b, rep, r, flush=True)
            runs[b].append(r)

    def agg(name, key):
        v = [r[key] for r in runs[name]]
        return {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": v}

    summary = {
        b: {k: agg(b, k) for k in ("p50_us", "p99_us", "throughput_msg_s")} for b in names
    }
    summary = {b: dict(placement=runs[b][0]["placement"], **v) for b, v in summary.items()}
    ratios = {}
    if "cpu" in names:
        for b in names:
            if b == "cpu":
                continue
            ratios[b] = {
                "throughput_over_cpu_form": [
                    r["throughput_msg_s"] / c["throughput_msg_s"] for r, c in zip(runs[b], runs["cpu"])
                ],
                "p50_over_cpu_form": [r["p50_us"] / c["p50_us"] for r, c in zip(runs[b], runs["cpu"])],
            }
    out = {
        "command": "python bench/python/device_bench.py " + " ".join(sys.argv[1:]),
        "machine": "shared 2-vCPU VM, no GPU (wgpu = Mesa lavapipe on the CPU, CudaSim = the CUDA C "
        "on host threads)",
        "build": a.build,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "resident": resident.__version__,
        "load": f"echo (value + 1) of 8-byte records; round trip = send_batch of 1 record then "
        f"receive_batch, one in flight, {a.n} after {a.warmup} warm-up; throughput = "
        f"{10 * a.n} records in chunks of {a.chunk}, at most 4 chunks unanswered; "
        f"max_batch per backend {mb}. Baseline 'cpu': the same kernel's vectorized CPU form "
        f"(numpy) on the CPU backend, measured in the same run, alternating.",
        "repeats": a.repeats,
        "load_average_at_end": open("/proc/loadavg").read().split()[:3],
        "summary": summary,
        "ratios_per_repeat": ratios,
    }
    text = json.dumps(out, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

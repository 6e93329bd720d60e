#!/usr/bin/env bash
# Runs on the GPU machine, from the repo root, with ./.gpu carried (see gpu-pack.sh): every
# test binary with the GPU required, compute-sanitizer (memcheck and racecheck) on the CUDA
# tests, the residency probe (cuMemAlloc, cuMemFree, module load and a launch timed while a
# ring kernel is resident), and the GPU benchmarks. Each step runs under `timeout`, so a hang
# (e.g. a driver call waiting on a resident kernel) is recorded, not waited on forever.
# Everything goes under one folder: $OUT (default ./gpu-out/<UTC date-time>).
set -uo pipefail
OUT="${OUT:-gpu-out/$(date -u +%Y%m%dT%H%M%SZ)}"
T_TEST="${T_TEST:-600}"     # seconds per test binary
T_BENCH="${T_BENCH:-1800}"  # seconds per benchmark
mkdir -p "$OUT"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export RESIDENT_REQUIRE_GPU=1 RESIDENT_REQUIRE_NVRTC=1 RESIDENT_KERNEL_CACHE="$PWD/.gpu/kcache"

run() {  # run <seconds> <log> <cmd...>: records the exit status (124 = timed out)
  local t="$1" log="$2"; shift 2
  echo "== $* (timeout ${t}s)" | tee -a "$log"
  timeout --kill-after=30 "$t" "$@" >>"$log" 2>&1
  local rc=$?
  echo "exit $rc: $*" | tee -a "$log" "$OUT/status.txt"
}

{ nvidia-smi || true; .gpu/resident info || true; } >"$OUT/machine.txt" 2>&1
for t in .gpu/tests/*; do
  run "$T_TEST" "$OUT/gpu-tests.log" "$t" --test-threads=1 --nocapture
done
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    for t in .gpu/tests/gpu-* .gpu/tests/persistent_gpu-* .gpu/tests/memory_cuda-*; do
      [ -e "$t" ] && run "$T_TEST" "$OUT/sanitizer-$tool.log" compute-sanitizer --tool "$tool" "$t" --test-threads=1
    done
  done
else
  echo "compute-sanitizer not found: sanitizer runs skipped" | tee -a "$OUT/status.txt"
fi
# The residency probe: one JSON object per line.
for t in .gpu/tests/persistent_gpu-*; do
  run "$T_TEST" "$OUT/residency-probe.log" "$t" --exact \
    residency_probe_times_driver_calls_while_a_ring_kernel_is_resident --nocapture --test-threads=1
done
grep -h '^PROBE ' "$OUT/residency-probe.log" 2>/dev/null | sed 's/^PROBE //' >"$OUT/residency-probe.jsonl" || true
run "$T_BENCH" "$OUT/transfer.log" .gpu/resident bench-transfer --out-dir "$OUT"
run "$T_BENCH" "$OUT/ring.log" .gpu/resident bench-ring --out-dir "$OUT"
# The four workloads on the GPU, each checked against its f64 reference, then measured
# (1M-node PageRank, anomaly actor vs stateless batch); the CPU in the same run as the baseline.
for w in vector-add pipeline pagerank anomaly; do
  run "$T_TEST" "$OUT/workloads-demo.log" .gpu/resident demo "$w" --backend cuda
done
# Streaming PageRank on the GPU (edge changes in ticket order, parallel push rounds with f64
# atomics), checked against the recompute after every batch and the reference at the end.
run "$T_TEST" "$OUT/workloads-demo.log" .gpu/resident demo pagerank --stream --backend cuda \
  --nodes 1000000 --edges-per-node 5 --tol 1e-9 --batches 5
run "$T_BENCH" "$OUT/workloads.log" .gpu/resident bench workloads --backends cuda,cpu --out-dir "$OUT"
echo "everything is in $OUT (status.txt: one line per step)"

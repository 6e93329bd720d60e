#!/usr/bin/env bash
# One GPU lease in one call (the device tool: carry [".gpu"], command
# `bash scripts/gpu-probe/run4.sh`, timeout_s about 540): the whole of scripts/gpu-run.sh under a
# shorter budget, then what run3.sh added and never ran (the 1-in-flight sweep, the driver's
# ping-pong floor in the same run as the ring's round trip, 120 resident streams), then the
# tests that failed on the H100 (2026-11-27) three times each. Everything lands in $OUT:
# run/ (gpu-run.sh's files), extra.log, probe.jsonl and the sweep's JSON.
set -uo pipefail
O="${OUT:-gpu-out/run4-$(date -u +%Y%m%dT%H%M%SZ)}"; mkdir -p "$O"
START=$SECONDS
OUT="$O/run" BUDGET="${RUN_BUDGET:-280}" HARD="${RUN_HARD:-300}" bash scripts/gpu-run.sh
L="$O/extra.log" J="$O/probe.jsonl"; : >"$J"
. scripts/gpu-env.sh
W=/tmp/resident-gpu   # unpacked by gpu-run.sh
LIMIT="${EXTRA_LIMIT:-190}"   # this part's own budget, after gpu-run.sh
T() {
  local t=$1; shift
  local left=$((LIMIT - (SECONDS - X0)))
  if (( left < 5 )); then echo "=== SKIP (budget): $*" | tee -a "$L"; return; fi
  (( t > left )) && t=$left
  echo "=== $* (timeout ${t}s)" >>"$L"; local s=$SECONDS
  timeout -k 2 "$t" "$@" >>"$L" 2>&1
  echo "=== exit $? in $((SECONDS - s))s: $*" | tee -a "$L"
}
X0=$SECONDS
T 70 "$W/resident" bench-ring --sweep --iters 3000 --out-dir "$O"
{
  nvcc -ptx -arch=sm_90 scripts/gpu-probe/kern.cu -o /tmp/kern.ptx &&
  g++ -O2 -std=c++17 scripts/gpu-probe/probe.cpp -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda -o /tmp/probe
} >>"$L" 2>&1
if [ -x /tmp/probe ]; then
  for m in 0 1; do T 15 sh -c "/tmp/probe /tmp/kern.ptx pingpong $m 0 >>'$J'"; done
  T 20 sh -c "/tmp/probe /tmp/kern.ptx streams 120 >>'$J'"
fi
for i in 1 2 3; do
  T 25 "$W/tests/conformance" --exact gpu::forwarding_chain --nocapture
  T 25 "$W/tests/device_gpu" --exact device_faults_fail_every_kernel_on_the_device_and_fresh_ones_launch_after --nocapture
done
T 40 "$W/tests/persistent_gpu" --exact residency_probe_times_driver_calls_while_a_ring_kernel_is_resident --nocapture
echo "done in $((SECONDS - START))s" | tee -a "$L"

#!/usr/bin/env bash
# The second GPU run of 2026-11-28 (the device tool: carry [".gpu"], command
# `bash scripts/gpu-probe/run5.sh`, timeout_s about 420): where a volume round trip goes and
# whether the fixes from the first run's failures hold.
#   1. bench-ring twice in one run: as built, and with the poll's LL fast path off
#      (RESIDENT_CUDA_DEFINES=RESIDENT_FAST_POLL=0: tails alone, as before the LL lanes), each
#      row with the host's send time per message;
#   2. the driver probe (probe.jsonl): zero-copy read bandwidth by grid size (one block, as the
#      ring kernel, up to one per SM) beside device memory and the copy engine; and 120 streams
#      with a spinning kernel each, every cuStreamCreate timed (does creating a stream wait for
#      the kernels already running?);
#      then the first run's failing tests, each alone (memcheck on the round trip included);
#   3. gpu-run.sh's tests, demos and short benchmarks in what time is left (SKIP_RING).
# The device tool brings back at most 8 files: everything goes into one archive, all.tar.gz,
# beside status.txt (one line per step), probe.jsonl and the two ring JSONs.
set -uo pipefail
O="${OUT:-gpu-out/run5-$(date -u +%Y%m%dT%H%M%SZ)}"; mkdir -p "$O"
K=/tmp/run5; rm -rf "$K"; mkdir -p "$K/fp1" "$K/fp0"
S="$O/status.txt" L="$K/run5.log"; : >"$S"
TOTAL="${TOTAL:-380}"   # seconds for the whole script
. scripts/gpu-env.sh
W=/tmp/resident-gpu; rm -rf "$W"; mkdir -p "$W"
tar -xJf .gpu/pack.tar.xz -C "$W" || { echo "FAIL pack unpack" | tee -a "$S"; exit 1; }
{ head -3 "$W/MANIFEST"; nvidia-smi -L; } >>"$L" 2>&1
T() {
  local t=$1 name=$2; shift 2
  local left=$((TOTAL - 150 - SECONDS))   # keep 150 s for part 3
  if (( left < 5 )); then echo "SKIP $name budget" | tee -a "$S"; return; fi
  (( t > left )) && t=$left
  echo "=== $name (at ${SECONDS}s, timeout ${t}s): $*" >>"$L"; local s=$SECONDS
  timeout -k 2 "$t" "$@" >>"$L" 2>&1; local rc=$?
  local v=PASS; case $rc in 0) ;; 124|137) v=TIMEOUT ;; *) v=FAIL ;; esac
  echo "$v $name $((SECONDS - s))s" | tee -a "$S"; echo "=== $v (exit $rc)" >>"$L"
}
T 60 bench-ring "$W/resident" bench-ring --no-model --iters 2000 --out-dir "$K/fp1"
T 60 bench-ring-fast-poll-0 env RESIDENT_CUDA_DEFINES=RESIDENT_FAST_POLL=0 "$W/resident" bench-ring --no-model --iters 2000 --out-dir "$K/fp0"
{
  nvcc -ptx -arch=sm_90 scripts/gpu-probe/kern.cu -o /tmp/kern.ptx &&
  g++ -O2 -std=c++17 scripts/gpu-probe/probe.cpp -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda -o /tmp/probe
} >>"$L" 2>&1
if [ -x /tmp/probe ]; then
  T 30 zcread sh -c "/tmp/probe /tmp/kern.ptx zcread >>'$O/probe.jsonl'"
  T 20 streams-120 sh -c "/tmp/probe /tmp/kern.ptx streams 120 >>'$O/probe.jsonl'"
fi
T 25 device_faults "$W/tests/device_gpu" --exact device_faults_fail_every_kernel_on_the_device_and_fresh_ones_launch_after --nocapture
T 40 memcheck-round-trip compute-sanitizer --tool memcheck --error-exitcode 1 "$W/tests/persistent_gpu" --exact persistent_kernel_round_trip --test-threads=1
T 20 dropped-while-parked "$W/tests/persistent_gpu" --exact a_kernel_dropped_while_parked_is_not_relaunched --nocapture
T 30 residency-probe "$W/tests/persistent_gpu" --exact residency_probe_times_driver_calls_while_a_ring_kernel_is_resident --nocapture
T 40 residency-budget "$W/tests/persistent_gpu" --exact residency_budget_holds_every_admitted_kernel_resident_and_refuses_one_more --nocapture
left=$((TOTAL - SECONDS - 10))
if (( left > 20 )); then
  SKIP_TESTS='^(device_faults_fail_every|a_kernel_dropped_while_parked|residency_probe_times|residency_budget_holds)' \
  OUT="$K/run" SKIP_RING=1 BUDGET=$((left - 20)) HARD=$left bash scripts/gpu-run.sh >>"$L" 2>&1
  sed 's/^/gpu-run: /' "$K/run/status.txt" >>"$S"
fi
cp "$K"/fp1/ring-*.json "$O/" 2>/dev/null
for f in "$K"/fp0/ring-*.json; do [ -e "$f" ] && cp "$f" "$O/fast-poll-0-$(basename "$f")"; done
tar -czf "$O/all.tar.gz" -C "$K" .
echo "done in ${SECONDS}s" | tee -a "$S"

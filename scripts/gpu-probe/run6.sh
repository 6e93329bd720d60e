#!/usr/bin/env bash
# The bulk input lanes' first GPU run (issue 39), after run5.sh in the same session (the device
# tool: carry [".gpu"], command `bash scripts/gpu-probe/run6.sh`, timeout_s about 360; the pack
# from scripts/gpu-pack.sh at the commit to test):
#   1. bench-ring with the bus model beside it: persistent (auto), persistent_ll and
#      persistent_bulk at 1, 64, 1024, 4096 and 65536 in flight, 16/64/256 B, beside launch per
#      batch and graph replay, every row with the host's send time and the model's estimate;
#   2. the bulk lanes' GPU test (on, then auto) alone and under compute-sanitizer memcheck, and
#      the residency probe, which times cuMemcpyHtoDAsync and cuStreamWriteValue64 beside a
#      resident kernel and says whether the device takes 64-bit stream memory operations;
#   3. the conformance cases on the GPU with RESIDENT_BULK_LANE=on and off;
#   4. (issue 43) a kernel whose handler calls an external function, linked by nvJitLink from
#      LTO-IR into the device's CUBIN (what a numba= handler is), alone and under memcheck.
# The device tool brings back at most 8 files: status.txt, the ring JSON, and all.tar.gz with
# the log.
set -uo pipefail
O="${OUT:-gpu-out/run6-$(date -u +%Y%m%dT%H%M%SZ)}"; mkdir -p "$O"
K=/tmp/run6; rm -rf "$K"; mkdir -p "$K/ring"
S="$O/status.txt" L="$K/run6.log"; : >"$S"
TOTAL="${TOTAL:-330}"   # seconds for the whole script
. scripts/gpu-env.sh
W=/tmp/resident-gpu; rm -rf "$W"; mkdir -p "$W"
tar -xJf .gpu/pack.tar.xz -C "$W" || { echo "FAIL pack unpack" | tee -a "$S"; exit 1; }
{ head -3 "$W/MANIFEST"; nvidia-smi -L; } >>"$L" 2>&1
T() {
  local t=$1 name=$2; shift 2
  local left=$((TOTAL - 10 - SECONDS))
  if (( left < 5 )); then echo "SKIP $name budget" | tee -a "$S"; return; fi
  (( t > left )) && t=$left
  echo "=== $name (at ${SECONDS}s, timeout ${t}s): $*" >>"$L"; local s=$SECONDS
  timeout -k 2 "$t" "$@" >>"$L" 2>&1; local rc=$?
  local v=PASS; case $rc in 0) ;; 124|137) v=TIMEOUT ;; *) v=FAIL ;; esac
  echo "$v $name $((SECONDS - s))s" | tee -a "$S"; echo "=== $v (exit $rc)" >>"$L"
}
T 40 bulk-gpu "$W/tests/persistent_gpu" --exact bulk_lanes_round_trip_on_a_gpu --nocapture
T 30 residency-probe "$W/tests/persistent_gpu" --exact residency_probe_times_driver_calls_while_a_ring_kernel_is_resident --nocapture
T 60 memcheck-bulk compute-sanitizer --tool memcheck --error-exitcode 1 "$W/tests/persistent_gpu" --exact bulk_lanes_round_trip_on_a_gpu --test-threads=1
T 30 external-gpu "$W/tests/persistent_gpu" --exact a_kernel_with_an_external_function_runs_linked_on_a_gpu --nocapture
T 45 memcheck-external compute-sanitizer --tool memcheck --error-exitcode 1 "$W/tests/persistent_gpu" --exact a_kernel_with_an_external_function_runs_linked_on_a_gpu --test-threads=1
T 150 bench-ring "$W/resident" bench-ring --iters 2000 --in-flight 64,1024,4096,65536 --out-dir "$K/ring"
for m in on off; do
  T 45 "conformance-gpu-bulk-$m" env RESIDENT_BULK_LANE=$m "$W/tests/conformance" gpu:: --test-threads=1
done
cp "$K"/ring/ring-*.json "$O/" 2>/dev/null
grep '^PROBE' "$L" >"$O/probe.jsonl" 2>/dev/null
tar -czf "$O/all.tar.gz" -C "$K" .
echo "done in ${SECONDS}s" | tee -a "$S"

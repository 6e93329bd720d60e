#!/usr/bin/env bash
# Runs on a GPU machine, from the repository root, with ./.gpu/pack.tar.xz carried (built here by
# scripts/gpu-pack.sh; the device tool: carry [".gpu"], command `bash scripts/gpu-run.sh`).
# Sized for a short lease: at most 8 minutes on a 16-core machine (give the device tool a
# timeout_s of about 540, so a slow start of the run still leaves what is under $OUT).
#
#   0. `resident bench-ring` (persistent vs launch per batch vs graph, and the bus model;
#      SKIP_RING=1 leaves it out, for a caller that runs it itself);
#   1. every GPU (CUDA) test alone, each with its own timeout;
#   2. the demos on --backend cuda (each checked against its f64 reference) and short benchmarks;
#   3. wgpu on the GPU's own Vulkan driver (Debian's libvulkan1 from the pack, unpacked into /):
#      `resident info`, then every wgpu test alone, if a hardware adapter is there;
#   4. compute-sanitizer memcheck on the round trip, if time is left.
#
# One line per test or step in $OUT/status.txt: `PASS|FAIL|TIMEOUT <binary> <test> <seconds>s`,
# `SKIP <binary> <test> <why>` for those not started. No step starts once BUDGET seconds (450:
# 7.5 minutes) have passed since the start, and every step is killed by HARD seconds (470).
# Everything is in one folder, $OUT (the device tool's; else gpu-out/<UTC date-time>), in at most
# 8 files: status.txt, machine.txt, tests.log, wgpu.log, run.log (demos, benchmarks, sanitizer),
# results.tar.gz (every JSON and picture) and, as far as the 8 allow, the JSON files themselves.
set -uo pipefail
O="${OUT:-gpu-out/$(date -u +%Y%m%dT%H%M%SZ)}"
BUDGET="${BUDGET:-450}"   # no new step after this many seconds
HARD="${HARD:-470}"       # every step is over by then
T_SIMPLE="${T_SIMPLE:-20}" T_TEST="${T_TEST:-30}" T_HEAVY="${T_HEAVY:-60}"
PACK="${PACK:-.gpu/pack.tar.xz}"
W=/tmp/resident-gpu      # the unpacked binaries
R=/tmp/resident-gpu-res  # JSON and pictures, tarred into $O at the end
mkdir -p "$O"
S="$O/status.txt" TL="$O/tests.log" WL="$O/wgpu.log" RL="$O/run.log"
: >"$S"

finish() {
  # A file over 16 MiB does not come back: keep a log's first 4 and last 10 MiB.
  local log
  for log in "$TL" "$WL" "$RL"; do
    if [ -f "$log" ] && (( $(stat -c %s "$log") > 15 * 1024 * 1024 )); then
      { head -c 4M "$log"; printf '\n[... cut to fit: 16 MiB a file ...]\n'; tail -c 10M "$log"; } >"$log.cut"
      mv "$log.cut" "$log"
    fi
  done
  grep -h '^PROBE ' "$TL" 2>/dev/null | sed 's/^PROBE //' >"$R/residency-probe.jsonl"
  [ -s "$R/residency-probe.jsonl" ] || rm -f "$R/residency-probe.jsonl"
  tar -czf "$O/results.tar.gz" -C "$R" . 2>/dev/null
  # The JSON files themselves too, while the 8 files that come back allow.
  local n f
  n=$(find "$O" -maxdepth 1 -type f | wc -l)
  for f in "$R"/*.json; do
    [ -e "$f" ] || continue
    (( n < 8 )) || break
    cp "$f" "$O/" && n=$((n + 1))
  done
  echo "done in ${SECONDS}s: $(grep -c '^PASS' "$S") passed, $(grep -c '^FAIL' "$S") failed, \
$(grep -c '^TIMEOUT' "$S") timed out, $(grep -c '^SKIP' "$S") skipped; everything is in $O" | tee -a "$S"
}

rm -rf "$W" "$R"; mkdir -p "$W" "$R"
if ! tar -xJf "$PACK" -C "$W"; then
  echo "FAIL pack unpack 0s ($PACK missing or broken: run scripts/gpu-pack.sh, carry .gpu)" | tee -a "$S"
  finish; exit 1
fi

. scripts/gpu-env.sh

# The Vulkan loader for wgpu, and the NVIDIA ICD if the loader's own search does not find it.
for deb in "$W"/deb/*.deb; do [ -e "$deb" ] && dpkg -x "$deb" /; done
ldconfig 2>/dev/null || true
if ! ls /usr/share/vulkan/icd.d/nvidia* /usr/local/share/vulkan/icd.d/nvidia* \
  /etc/vulkan/icd.d/nvidia* >/dev/null 2>&1; then
  for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/local/nvidia/icd.d/nvidia_icd.json; do
    [ -f "$icd" ] && { export VK_DRIVER_FILES="$icd"; break; }
  done
fi

{
  echo "== started $(date -u +%Y-%m-%dT%H:%M:%SZ); budget ${BUDGET}s, hard ${HARD}s"
  cat "$W/MANIFEST" 2>/dev/null
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  echo "nproc $(nproc); $(uname -srm)"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-} libvulkan: $(ldconfig -p | grep -c 'libvulkan.so')"
  command -v compute-sanitizer g++ nvcc
  echo "== resident info"
  "$W/resident" info
  echo "== resident info --json"
  "$W/resident" info --json
} >"$O/machine.txt" 2>&1

# step <seconds> <log> <binary> <name> <cmd...>: one status line.
step() {
  local t=$1 log=$2 bin=$3 name=$4 t0=$SECONDS rc v
  shift 4
  if (( SECONDS >= BUDGET )); then echo "SKIP $bin $name budget" >>"$S"; return; fi
  (( t > HARD - SECONDS )) && t=$((HARD - SECONDS))
  (( t < 1 )) && t=1
  echo "=== $bin $name (at ${SECONDS}s, timeout ${t}s): $*" >>"$log"
  timeout -k 3 "$t" "$@" >>"$log" 2>&1
  rc=$?
  case $rc in 0) v=PASS ;; 124 | 137) v=TIMEOUT ;; *) v=FAIL ;; esac
  echo "$v $bin $name $((SECONDS - t0))s" | tee -a "$S"
  echo "=== $v (exit $rc)" >>"$log"
}

# The timeout of one test.
limit() {
  case "$1:$2" in
    gpu:* | memory_cuda:* | bind_gpu:* | ring_gpu:without_* | ring_gpu:bad_* | persistent_gpu:without_* \
      | persistent_gpu:launch_rejects_*) echo "$T_SIMPLE" ;;
    *terminate_race* | *backpressure* | *stuck_handler* | *residency_* | *quiesce* | *:workloads_on_* \
      | ring_gpu:bench_ring_* | *a_million_keys* | *device_faults* | device_wgpu:*) echo "$T_HEAVY" ;;
    *) echo "$T_TEST" ;;
  esac
}

# tests <log> <binary> <regex>: every test of the binary whose name matches, each alone.
tests() {
  local log=$1 bin=$2 re=$3 b="$W/tests/$2" names n
  if [ ! -x "$b" ]; then echo "SKIP $bin - not in the pack" | tee -a "$S"; return; fi
  names=$("$b" --list --format terse 2>>"$log" | sed -n 's/: test$//p' | grep -E "$re")
  # SKIP_TESTS: a regex of test names a caller runs itself (each SKIP-ped here).
  if [ -n "${SKIP_TESTS:-}" ]; then
    for n in $(printf '%s\n' $names | grep -E "$SKIP_TESTS"); do echo "SKIP $bin $n SKIP_TESTS" >>"$S"; done
    names=$(printf '%s\n' $names | grep -vE "$SKIP_TESTS")
  fi
  if [ -z "$names" ]; then echo "FAIL $bin - no test matches $re" | tee -a "$S"; return; fi
  for n in $names; do
    step "$(limit "$bin" "$n")" "$log" "$bin" "$n" "$b" --exact "$n" --nocapture --test-threads=1
  done
}

# ---- 0. the ring benchmark first: issue 28's figures (GPU times, then CudaSim's bus model of the
# same kernel, which compiles the simulator with g++: T_RING covers both) -----------------------
if [ -z "${SKIP_RING:-}" ]; then
  step "${T_RING:-150}" "$RL" resident bench-ring "$W/resident" bench-ring --iters "${RING_ITERS:-2000}" --out-dir "$R"
else
  echo "SKIP resident bench-ring SKIP_RING" >>"$S"
fi

# ---- 1. the GPU tests ----------------------------------------------------------------------
tests "$TL" gpu .
tests "$TL" memory_cuda .
tests "$TL" bind_gpu .
tests "$TL" persistent_gpu .
tests "$TL" device_gpu .
tests "$TL" conformance '(^|::)gpu::'
tests "$TL" backends '^workloads_on_a_gpu$'
tests "$TL" ring_gpu .

# ---- 2. demos on the GPU and short benchmarks ------------------------------------------------
for w in vector-add pipeline pagerank anomaly; do
  step "$T_TEST" "$RL" resident "demo-$w" "$W/resident" demo "$w" --backend cuda
done
step "$T_HEAVY" "$RL" resident demo-pagerank-stream "$W/resident" demo pagerank --stream \
  --backend cuda --nodes 200000 --tol 1e-9 --batches 5
step "$T_SIMPLE" "$RL" resident bench-transfer "$W/resident" bench-transfer --iterations 5 --out-dir "$R"
step "$T_HEAVY" "$RL" resident bench-workloads "$W/resident" bench workloads --quick --repeats 1 \
  --backends cuda --out-dir "$R" --prefix workloads-gpu

# ---- 3. wgpu on the GPU's Vulkan driver -----------------------------------------------------
hw=$("$W/resident" info --json 2>/dev/null | python3 -c 'import json, sys
for b in json.load(sys.stdin).get("backends", []):
    if b.get("backend") == "wgpu":
        a = [x for x in b.get("adapters") or [] if not x.get("software")]
        print(a[0]["name"] if a else "")' 2>/dev/null)
if [ -n "$hw" ]; then
  echo "wgpu adapter: $hw" | tee -a "$WL"
  export RESIDENT_REQUIRE_WGPU=1
  tests "$WL" conformance '(^|::)wgpu::'
  tests "$WL" forward_wgpu .
  tests "$WL" bind_wgpu .
  tests "$WL" backends '^workloads_on_wgpu$'
  tests "$WL" device_wgpu .
  tests "$WL" ring_wgpu .
  tests "$WL" keyed_wgpu .
  tests "$WL" memory_wgpu .
  step "$T_TEST" "$RL" resident demo-pagerank-wgpu "$W/resident" demo pagerank --backend wgpu
else
  echo "SKIP wgpu - no hardware wgpu adapter (see machine.txt: resident info)" | tee -a "$S"
fi

# ---- 4. compute-sanitizer, if time is left ---------------------------------------------------
if command -v compute-sanitizer >/dev/null; then
  step "$T_HEAVY" "$RL" compute-sanitizer memcheck-persistent_kernel_round_trip \
    compute-sanitizer --tool memcheck --error-exitcode 1 "$W/tests/persistent_gpu" --exact \
    persistent_kernel_round_trip --test-threads=1
else
  echo "SKIP compute-sanitizer - not installed" >>"$S"
fi

finish

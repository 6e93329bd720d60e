#!/usr/bin/env bash
# The third GPU run of 2026-11-27 (the device tool: carry [".gpu"], command
# `bash scripts/gpu-probe/run3.sh`): the fixed device-fault contract, where one message's round
# trip goes (bench-ring --sweep), the residency budget with progress, and the driver probe at
# 120 streams. Everything lands in $OUT (run.log, probe.jsonl, the sweep's JSON).
set -uo pipefail
O="${OUT:-gpu-out/run3-$(date -u +%Y%m%dT%H%M%SZ)}"; mkdir -p "$O"
L="$O/run.log" J="$O/probe.jsonl"; : >"$J"
export PATH=/usr/local/cuda/bin:$PATH
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
W=/tmp/resident-gpu; rm -rf "$W"; mkdir -p "$W"
tar -xJf .gpu/pack.tar.xz -C "$W" || { echo "no pack" | tee -a "$L"; exit 1; }
nv=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null)
for d in "$nv"/cu13/lib "$nv"/cuda_nvrtc/lib; do
  [ -n "$nv" ] && [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export RESIDENT_REQUIRE_GPU=1 RESIDENT_REQUIRE_NVRTC=1 RESIDENT_KERNEL_CACHE=/tmp/resident-kcache RUST_BACKTRACE=1
head -3 "$W/MANIFEST" >>"$L"; nvidia-smi -L >>"$L" 2>&1
T() { local t=$1; shift; echo "=== $* (timeout ${t}s)" >>"$L"; local s=$SECONDS; timeout -k 2 "$t" "$@" >>"$L" 2>&1; echo "=== exit $? in $((SECONDS - s))s: $*" | tee -a "$L"; }
T 30 "$W/tests/device_gpu" --exact device_faults_fail_every_kernel_on_the_device_and_fresh_ones_launch_after --nocapture
T 60 "$W/resident" bench-ring --sweep --iters 3000 --out-dir "$O"
T 30 "$W/tests/persistent_gpu" --exact residency_budget_holds_every_admitted_kernel_resident_and_refuses_one_more --nocapture
{
  nvcc -ptx -arch=sm_90 scripts/gpu-probe/kern.cu -o /tmp/kern.ptx &&
  g++ -O2 -std=c++17 scripts/gpu-probe/probe.cpp -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda -o /tmp/probe
} >>"$L" 2>&1
[ -x /tmp/probe ] && T 20 sh -c "/tmp/probe /tmp/kern.ptx streams 120 >>'$J' 2>>'$L'"
T 40 "$W/resident" bench-ring --iters 2000 --no-model --out-dir "$O"
cat "$J"; echo "done in ${SECONDS}s" | tee -a "$L"

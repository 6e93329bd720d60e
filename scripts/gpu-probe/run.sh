#!/usr/bin/env bash
# Runs on a GPU machine from the repository root (the device tool: carry [".gpu"], command
# `bash scripts/gpu-probe/run.sh`): builds the driver probe with nvcc/g++ there and records what
# the driver does (streams beyond CUDA_DEVICE_MAX_CONNECTIONS, sticky-fault recovery, the
# host<->GPU ping-pong floor with one and two dependent reads), then reruns the GPU tests that
# failed in the run before, each with a timeout. Everything lands in $OUT (probe.jsonl, run.log).
set -uo pipefail
O="${OUT:-gpu-out/probe-$(date -u +%Y%m%dT%H%M%SZ)}"; mkdir -p "$O"
L="$O/run.log" J="$O/probe.jsonl"; : >"$J"
export PATH=/usr/local/cuda/bin:$PATH
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
{
  nvidia-smi -L
  nvcc -ptx -arch=sm_90 scripts/gpu-probe/kern.cu -o /tmp/kern.ptx && echo "ptx ok"
  g++ -O2 -std=c++17 scripts/gpu-probe/probe.cpp -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda -o /tmp/probe && echo "probe ok"
} >>"$L" 2>&1
P() { echo "== probe $*" >>"$L"; timeout -k 2 "${PT:-20}" "$@" >>"$J" 2>>"$L"; echo "   exit $?" >>"$L"; }
if [ -x /tmp/probe ]; then
  P /tmp/probe /tmp/kern.ptx streams 40
  P env CUDA_DEVICE_MAX_CONNECTIONS=8 /tmp/probe /tmp/kern.ptx streams 40
  P env CUDA_DEVICE_MAX_CONNECTIONS=32 /tmp/probe /tmp/kern.ptx streams 40
  P /tmp/probe /tmp/kern.ptx sticky 0
  P /tmp/probe /tmp/kern.ptx sticky 1
  for m in 0 1; do for s in 0 100 1000; do P /tmp/probe /tmp/kern.ptx pingpong $m $s; done; done
fi
cat "$J"
# The failing tests again, from the pack of the run before.
W=/tmp/resident-gpu; rm -rf "$W"; mkdir -p "$W"
if tar -xJf .gpu/pack.tar.xz -C "$W"; then
  nv=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null)
  for d in "$nv"/cu13/lib "$nv"/cuda_nvrtc/lib; do
    [ -n "$nv" ] && [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
  done
  export RESIDENT_REQUIRE_GPU=1 RESIDENT_REQUIRE_NVRTC=1 RESIDENT_KERNEL_CACHE=/tmp/resident-kcache RUST_BACKTRACE=1
  T() { local t=$1; shift; echo "=== $* (timeout ${t}s)" >>"$L"; local s=$SECONDS; timeout -k 2 "$t" "$@" >>"$L" 2>&1; echo "=== exit $? in $((SECONDS - s))s" | tee -a "$L"; }
  T 40 env CUDA_DEVICE_MAX_CONNECTIONS=32 "$W/tests/persistent_gpu" --exact residency_probe_times_driver_calls_while_a_ring_kernel_is_resident --nocapture
  T 20 "$W/tests/device_gpu" --exact device_faults_fail_every_kernel_on_the_device_and_fresh_ones_launch_after --nocapture
  for i in 1 2 3; do T 20 "$W/tests/conformance" --exact gpu::forwarding_chain --nocapture; done
  T 30 env CUDA_DEVICE_MAX_CONNECTIONS=32 "$W/tests/persistent_gpu" --exact residency_budget_holds_every_admitted_kernel_resident_and_refuses_one_more --nocapture
fi
echo "done in ${SECONDS}s" | tee -a "$L"

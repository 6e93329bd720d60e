#!/usr/bin/env bash
# Runs on the GPU machine, from the repo root, with ./.gpu carried (see gpu-pack.sh): every
# test binary with the GPU required, compute-sanitizer on the CUDA tests, and the GPU
# benchmarks. Raw output goes to $OUT (or ./gpu-out) for committing under bench/results/.
set -uo pipefail
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export RESIDENT_REQUIRE_GPU=1 RESIDENT_REQUIRE_NVRTC=1 RESIDENT_KERNEL_CACHE="$PWD/.gpu/kcache"
{
  nvidia-smi || true
  .gpu/resident info
  for t in .gpu/tests/*; do
    echo "== $t"; "$t" --test-threads=1 2>&1 || echo "FAILED: $t"
  done
  if command -v compute-sanitizer >/dev/null; then
    for t in .gpu/tests/gpu-* .gpu/tests/persistent_gpu-* .gpu/tests/memory_cuda-*; do
      [ -e "$t" ] && { echo "== memcheck $t"; compute-sanitizer --tool memcheck "$t" --test-threads=1 2>&1 | tail -20; }
    done
  fi
} 2>&1 | tee "$OUT/gpu-tests.log"
.gpu/resident bench-transfer --out-dir "$OUT" 2>&1 | tee "$OUT/transfer.log"
.gpu/resident bench-ring --out-dir "$OUT" 2>&1 | tee "$OUT/ring.log"

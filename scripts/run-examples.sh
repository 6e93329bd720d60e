#!/usr/bin/env bash
# Builds and runs the guide's examples (crates/resident/examples/) on the CPU, CudaSim and
# wgpu (lavapipe in CI), or on the backends named as arguments:
#   scripts/run-examples.sh                # cpu cuda-sim wgpu (what CI runs)
#   scripts/run-examples.sh cpu            # only the CPU backend: needs nothing installed
# Every example checks its own results and exits non-zero on a wrong one; a backend that
# cannot open is an error naming the reason (scripts/setup.sh installs what they need).
set -euo pipefail
cd "$(dirname "$0")/.."

backends=("$@")
[ ${#backends[@]} -eq 0 ] && backends=(cpu cuda-sim wgpu)

# Which examples exercise a backend's own handlers; every example runs on the CPU.
examples_for() {
    case "$1" in
        cpu) echo intro ring_kernels lifecycle backpressure backends memory workloads profiling serving performance troubleshooting ;;
        cuda-sim|cuda) echo intro backends cuda_handlers memory workloads ;;
        wgpu) echo intro backends wgsl_handlers memory workloads ;;
        *) echo "unknown backend $1: expected cpu, cuda-sim, wgpu or cuda" >&2; exit 2 ;;
    esac
}

cargo build -q -p resident --examples
failed=()
for b in "${backends[@]}"; do
    for ex in $(examples_for "$b"); do
        echo "== example $ex on $b"
        start=$(date +%s)
        if cargo run -q -p resident --example "$ex" -- "$b"; then
            echo "-- $ex on $b: ok ($(( $(date +%s) - start )) s)"
        else
            echo "-- $ex on $b: FAILED"
            failed+=("$ex/$b")
        fi
    done
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "examples failed: ${failed[*]}"
    exit 1
fi
echo "every example ran and checked its results on: ${backends[*]}"

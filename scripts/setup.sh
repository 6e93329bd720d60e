#!/usr/bin/env bash
# Installs what resident's optional backends and its tests need, from the package registries,
# on Debian or Ubuntu. Nothing here is needed to build or to run on the CPU backend.
#
#   scripts/setup.sh                  # install what is missing (uses sudo when not root)
#   eval "$(scripts/setup.sh --env)"  # also export NVRTC's LD_LIBRARY_PATH into this shell
#
# What and why:
#   mesa-vulkan-drivers libvulkan1   wgpu on Mesa's lavapipe (Vulkan on the CPU) when no GPU
#   NVRTC (scripts/setup-nvrtc.sh)   compiles CUDA C to PTX and sm_90 code without a GPU (PyPI)
#   g++ libtsan2                     CudaSim (CUDA C on host threads) and its ThreadSanitizer runs
#   nats-server                      the NATS serving tests run against a real server
# Already-present pieces are left alone. Progress goes to stderr; with --env, stdout carries
# only the export line.
set -euo pipefail
cd "$(dirname "$0")/.."

want_env=0
[[ "${1:-}" == "--env" ]] && want_env=1
log() { echo "setup: $*" >&2; }

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null; then SUDO="sudo"; else
        log "not root and no sudo: install the packages below yourself"; fi
fi

need=()
# lavapipe: the Vulkan loader plus Mesa's ICD files.
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || ! ldconfig -p 2>/dev/null | grep -q libvulkan.so.1; then
    need+=(mesa-vulkan-drivers libvulkan1)
fi
# g++ that links a ThreadSanitizer program (libtsan2 comes with g++'s libgcc-12-dev on Debian 12).
probe=$(mktemp -d)
if ! command -v g++ >/dev/null || ! echo 'int main(){}' | g++ -fsanitize=thread -x c++ - -o "$probe/t" 2>/dev/null; then
    need+=(g++ libtsan2)
fi
rm -rf "$probe"
if ! command -v nats-server >/dev/null && [[ ! -x /usr/sbin/nats-server ]]; then
    need+=(nats-server)
fi

if [[ ${#need[@]} -gt 0 ]]; then
    log "installing ${need[*]}"
    $SUDO apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >&2
else
    log "lavapipe, g++ with libtsan and nats-server are present"
fi

log "NVRTC from PyPI"
nvrtc_env="$(bash scripts/setup-nvrtc.sh --env)"
if [[ $want_env -eq 1 ]]; then
    echo "$nvrtc_env"
else
    log "for NVRTC in this shell: eval \"\$(scripts/setup.sh --env)\""
fi

#!/usr/bin/env bash
# Fetches NVRTC 13.0 and nvJitLink 13.0 from PyPI into ./.nvrtc/ so CUDA C sources can be
# compiled to PTX and machine code, and LTO-IR linked (the Python package's numba= handlers), on
# a machine with no GPU and no CUDA toolkit (CI, laptops). Prints the LD_LIBRARY_PATH to use.
#
# Usage:  scripts/setup-nvrtc.sh            # installs into ./.nvrtc (idempotent)
#         eval "$(scripts/setup-nvrtc.sh --env)"   # also exports LD_LIBRARY_PATH here
#
# Why the symlinks: cudarc 0.19.10 (feature cuda-13000) dlopens names such as `libnvrtc.so`,
# `libnvrtc.so.13` and `libnvrtc.so.1`; the wheel ships `libnvrtc.so.13` only (plus
# `libnvrtc-builtins.so.13.0`, which NVRTC itself dlopens by that exact name). We add the
# unversioned name so every loader finds it.
set -euo pipefail

VERSION="13.0.88"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${RESIDENT_NVRTC_DIR:-$ROOT/.nvrtc}"
LIB="$DEST/nvidia/cu13/lib"
PYTHON="${PYTHON:-python3}"

want_env=0
if [[ "${1:-}" == "--env" ]]; then want_env=1; fi

log() { echo "setup-nvrtc: $*" >&2; }

if [[ ! -e "$LIB/libnvrtc.so.13" ]]; then
    mkdir -p "$DEST/wheels"
    log "downloading nvidia-cuda-nvrtc==$VERSION (about 90 MB) into $DEST/wheels"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
        --python-version 3.11 \
        --dest "$DEST/wheels" "nvidia-cuda-nvrtc==$VERSION"
    wheel="$(ls "$DEST"/wheels/nvidia_cuda_nvrtc-"$VERSION"-*.whl | head -n1)"
    log "unpacking $(basename "$wheel")"
    if command -v unzip >/dev/null; then
        unzip -q -o "$wheel" 'nvidia/*' -d "$DEST"
    else
        "$PYTHON" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$DEST"
    fi
fi

if [[ ! -e "$LIB/libnvJitLink.so.13" ]]; then
    mkdir -p "$DEST/wheels"
    log "downloading nvidia-nvjitlink==$VERSION (about 40 MB) into $DEST/wheels"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_12_x86_64 --python-version 3.11 \
        --dest "$DEST/wheels" "nvidia-nvjitlink==$VERSION"
    wheel="$(ls "$DEST"/wheels/nvidia_nvjitlink-"$VERSION"-*.whl | head -n1)"
    log "unpacking $(basename "$wheel")"
    if command -v unzip >/dev/null; then
        unzip -q -o "$wheel" 'nvidia/*' -d "$DEST"
    else
        "$PYTHON" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$DEST"
    fi
fi

if [[ ! -e "$LIB/libnvrtc.so.13" ]]; then
    log "error: $LIB/libnvrtc.so.13 not found after unpacking"
    exit 1
fi
if [[ ! -e "$LIB/libnvrtc-builtins.so.13.0" ]]; then
    log "error: $LIB/libnvrtc-builtins.so.13.0 not found (NVRTC dlopens it by this name)"
    exit 1
fi
ln -sf libnvrtc.so.13 "$LIB/libnvrtc.so"
if [[ ! -e "$LIB/libnvJitLink.so.13" ]]; then
    log "error: $LIB/libnvJitLink.so.13 not found after unpacking"
    exit 1
fi

log "NVRTC $VERSION ready in $LIB"
if [[ $want_env == 1 ]]; then
    echo "export LD_LIBRARY_PATH=\"$LIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
else
    echo "LD_LIBRARY_PATH=$LIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    log "use: export LD_LIBRARY_PATH=$LIB:\$LD_LIBRARY_PATH"
fi

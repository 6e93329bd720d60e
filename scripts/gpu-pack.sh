#!/usr/bin/env bash
# Builds, here, what scripts/gpu-run.sh needs on a GPU machine (which has no Rust toolchain),
# and nothing else, into ./.gpu/ (ignored by git; the device tool carries it: carry [".gpu"]):
#
#   .gpu/pack.tar.xz   resident          the release CLI
#                      tests/<name>      the release test binaries that hold GPU (CUDA) tests,
#                                        then those that hold wgpu tests, under their target names
#                      deb/*.deb         Debian's libvulkan1 (the GPU machine has the NVIDIA driver
#                                        and its Vulkan ICD but no Vulkan loader)
#                      MANIFEST          commit, date, what is in the pack
#
# Stripped and compressed (xz); refused over PACK_LIMIT_MIB (60 MiB), or over what the working
# tree leaves of the 64 MiB that travel to the device machine if that is less. Over the limit, the
# optional wgpu binaries are left out one by one (last first) before giving up.
#
#   scripts/gpu-pack.sh            build (cargo, release) and pack (2026-11-27, shared 2-vCPU VM:
#                                  17 min from a warm debug target, a pack of 11.3 MiB)
#   PACK_FROM=DIR scripts/gpu-pack.sh
#                                  pack DIR/resident and DIR/tests/* as they are (no build; for
#                                  testing this script, or a build made elsewhere)
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT_MIB="${PACK_LIMIT_MIB:-60}"
DEST="${PACK_DEST:-.gpu}"

# package:test-target, in the order gpu-run.sh runs them. GPU ones are required.
GPU_TESTS="resident-cuda:gpu resident-engine-cuda:persistent_gpu resident:conformance resident:device_gpu
  resident:bind_gpu resident:memory_cuda resident-workloads:backends resident-bench:ring_gpu"
# wgpu on the GPU's own Vulkan driver; left out (last first) if the pack would be too large.
# (conformance and backends, above, hold wgpu tests too.)
WGPU_TESTS="resident:forward_wgpu resident:bind_wgpu resident-workloads:device_wgpu resident:ring_wgpu
  resident:keyed_wgpu resident:memory_wgpu"

case "$DEST" in /*|..*|*/..*|"") echo "PACK_DEST must be a relative folder inside the repository" >&2; exit 2;; esac
if git rev-parse --git-dir >/dev/null 2>&1 && ! git check-ignore -q "$DEST/x"; then
  echo "$DEST is not ignored by git (add /$DEST/ to .git/info/exclude): refusing to pack into it" >&2
  exit 2
fi

STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/tests" "$STAGE/deb"

# ---- the binaries --------------------------------------------------------------------------
if [ -n "${PACK_FROM:-}" ]; then
  cp "$PACK_FROM/resident" "$STAGE/resident"
  cp "$PACK_FROM"/tests/* "$STAGE/tests/"
else
  export CARGO_TERM_COLOR=never
  cargo build --release -p resident-cli --bin resident
  cp target/release/resident "$STAGE/resident"
  # One cargo call per package: the test targets it names, their executables from cargo's JSON.
  for pkg in $(for s in $GPU_TESTS $WGPU_TESTS; do echo "${s%%:*}"; done | awk '!seen[$0]++'); do
    args=()
    for s in $GPU_TESTS $WGPU_TESTS; do
      [ "${s%%:*}" = "$pkg" ] && args+=(--test "${s#*:}")
    done
    # The CUDA engine's launchers are features its dependents turn on; built alone, ask for them.
    [ "$pkg" = resident-engine-cuda ] && args+=(--features cuda)
    echo "== cargo test --release --no-run -p $pkg ${args[*]}"
    cargo test --release --no-run -p "$pkg" "${args[@]}" --message-format=json-render-diagnostics \
      | python3 -c 'import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m.get("profile", {}).get("test"):
        print(m["target"]["name"], m["executable"])' \
      | while read -r name exe; do cp "$exe" "$STAGE/tests/$name"; done
  done
fi
for s in $GPU_TESTS; do
  [ -f "$STAGE/tests/${s#*:}" ] || { echo "missing GPU test binary: ${s#*:} (${s%%:*})" >&2; exit 1; }
done
# Only what the run needs: anything else that came along goes.
keep=" $(for s in $GPU_TESTS $WGPU_TESTS; do printf '%s ' "${s#*:}"; done)"
for f in "$STAGE"/tests/*; do
  case "$keep" in *" $(basename "$f") "*) ;; *) rm -f "$f";; esac
done
strip "$STAGE/resident" "$STAGE"/tests/* 2>/dev/null || echo "note: strip failed on some file; packing as is"
chmod 755 "$STAGE/resident" "$STAGE"/tests/*

# ---- libvulkan1 ----------------------------------------------------------------------------
if ! (cd "$STAGE/deb" && apt-get download libvulkan1 >/dev/null 2>&1); then
  echo "apt-get download libvulkan1 failed; trying once after apt-get update"
  apt-get update >/dev/null 2>&1 || true
  (cd "$STAGE/deb" && apt-get download libvulkan1) \
    || echo "WARNING: no libvulkan1 in the pack: the run will skip wgpu on the GPU"
fi

# ---- pack, within the limit ----------------------------------------------------------------
pack() {
  {
    echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (working tree differs)')"
    echo "packed $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm)"
    echo "from ${PACK_FROM:-cargo build --release}"
    (cd "$STAGE" && ls -l resident tests deb)
  } >"$STAGE/MANIFEST"
  mkdir -p "$DEST"
  rm -f "$DEST/pack.tar.xz.tmp"
  tar -C "$STAGE" -cf - MANIFEST resident tests deb | xz -T0 -9 >"$DEST/pack.tar.xz.tmp"
  mv "$DEST/pack.tar.xz.tmp" "$DEST/pack.tar.xz"
  size=$(stat -c %s "$DEST/pack.tar.xz")
}
# The device tool sends the working tree (tracked and untracked-not-ignored files) with the
# pack, 64 MiB in all: the pack gets what the tree leaves, less 1 MiB, if that is under the limit.
limit=$((LIMIT_MIB * 1024 * 1024))
tree=$(git ls-files -z -co --exclude-standard 2>/dev/null | du -cb --files0-from=- 2>/dev/null \
  | tail -1 | cut -f1)
room=$((64 * 1024 * 1024 - ${tree:-0} - 1024 * 1024))
if (( room < limit )); then
  echo "the working tree that travels with the pack is $((tree / 1024 / 1024)) MiB: the pack gets $((room / 1024 / 1024)) MiB"
  limit=$room
fi
optional=($(for s in $WGPU_TESTS; do echo "${s#*:}"; done))
pack
while (( size > limit )); do
  n=${#optional[@]}
  if (( n == 0 )); then
    echo "pack is $((size / 1024 / 1024)) MiB, over $((limit / 1024 / 1024)) MiB even without the wgpu binaries:" >&2
    ls -l "$STAGE/resident" "$STAGE"/tests >&2
    rm -f "$DEST/pack.tar.xz"
    exit 1
  fi
  drop=${optional[$((n - 1))]}
  unset "optional[$((n - 1))]"
  echo "pack is $((size / 1024 / 1024)) MiB, over $((limit / 1024 / 1024)) MiB: leaving out tests/$drop"
  rm -f "$STAGE/tests/$drop"
  pack
done
# Nothing else of an earlier pack stays beside it (the folder travels whole).
find "$DEST" -mindepth 1 -maxdepth 1 ! -name pack.tar.xz -exec rm -rf {} +
echo "$DEST/pack.tar.xz: $size bytes, $(awk -v s="$size" 'BEGIN { printf "%.1f", s / 1048576 }') MiB (limit $((limit / 1024 / 1024)) MiB)"
cat "$STAGE/MANIFEST"
echo "run it: device tool run, carry [\"$DEST\"], command: bash scripts/gpu-run.sh"

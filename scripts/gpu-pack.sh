#!/usr/bin/env bash
# Builds, here, everything a GPU machine (no Rust toolchain there) needs, into ./.gpu/:
# the release `resident` binary and every test binary of the workspace. Carry `.gpu` to the
# device machine and run scripts/gpu-run.sh there (it writes everything under gpu-out/<date>/).
# CudaSim tests need g++ there too; without it they fail with a typed "no host C++ compiler" error.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu && mkdir -p .gpu/tests
cargo build --release -p resident-cli
cp target/release/resident .gpu/
cargo test --workspace --release --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m.get("profile", {}).get("test"):
        print(m["executable"])' \
  | while read -r exe; do cp "$exe" .gpu/tests/; done
strip .gpu/resident .gpu/tests/* 2>/dev/null || true
du -sh .gpu

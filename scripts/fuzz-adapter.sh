#!/usr/bin/env bash
# Fuzz the adapter validator's safetensors header reader (adapter-check/fuzz, outside the workspace).
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`); the toolchain is stable, so libFuzzer's
# nightly flags are unlocked with RUSTC_BOOTSTRAP. Single process (the machine is shared).
# Usage: scripts/fuzz-adapter.sh [seconds]   (default 600)
set -euo pipefail
cd "$(dirname "$0")/../adapter-check"
secs=${1:-600}
RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none safetensors_header -- \
  -max_total_time="$secs" -jobs=1 -workers=1 -max_len=65536

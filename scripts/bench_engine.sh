#!/usr/bin/env bash
# Engine benchmark behind docs/PERFORMANCE.md: the `small` preset (~100M
# parameters) in f32 and q8_0, with 1 and 2 threads. Models are generated into
# the cache directory on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${BIN_DIR:-build/bin}/exaserve"  # BIN_DIR: where exaserve is (make passes $(BUILD_DIR)/bin)
[ -x "$bin" ] || { echo "bench_engine.sh: no exaserve at $bin (build it first: make build)" >&2; exit 1; }
cache="${EXASERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/exaserve}/models"
mkdir -p "$cache"
for type in f32 q8_0; do
  # -a64: written since gen-model aligns tensors to 64 bytes; an older cached
  # file (32) would run the f32 tiles on straddling loads.
  model="$cache/small-$type-seed1-a64.gguf"
  [ -f "$model" ] || "$bin" gen-model --preset small --type "$type" --out "$model"
  for threads in 1 2; do
    echo "== small $type, $threads thread(s)"
    "$bin" bench-engine --model "$model" --threads "$threads" "$@" 2>/dev/null
  done
done

#!/usr/bin/env bash
# Speculative decoding behind docs/PERFORMANCE.md ("Speculative decoding"):
# greedy batch-1 decode of the small q8_0 preset with 1 thread, alone and with
# a 2-block draft cut from it (gen-model --draft-of) proposing k tokens per
# step. Targets are generated with --deep-block-scale S from block 2 on: the
# smaller S, the less the deep blocks change the first blocks' prediction and
# the more often the draft agrees, so the sweep spans acceptance rates from
# ~0 to ~0.9. Prints, per (S, k): acceptance, tok/s, and speedup over the
# target alone (best of --repeat runs each, the target alone measured next to
# every draft configuration). alpha: per-token acceptance (accepted over
# judged draft tokens); E: tokens emitted per target step, 1 + k x
# accepted/proposed. alpha and E are deterministic; tok/s depends on the
# machine's load (see docs/PERFORMANCE.md for the cost model that separates them).
#   usage: scripts/bench_speculative.sh [scales] [ks]   e.g. "1 0.15 0.05" "1 2 4 8"
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${BIN_DIR:-build/bin}/exaserve"  # BIN_DIR: where exaserve is (make passes $(BUILD_DIR)/bin)
[ -x "$bin" ] || { echo "bench_speculative.sh: no exaserve at $bin (build it first: make build)" >&2; exit 1; }
dir="${EXASERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/exaserve}/models/speculative"
mkdir -p "$dir"
scales="${1:-1 0.3 0.15 0.05 0.02}"
ks="${2:-1 2 4 8}"
steps="${STEPS:-32}"
repeat="${REPEAT:-3}"
common=(--threads 1 --batches 1 --decode-steps "$steps" --prefill-tokens 16 --repeat "$repeat" --no-copy-bandwidth --json)
tok_s() { sed -n 's/.*"decode":\[{"batch":1,"tok_s":\([0-9.]*\).*/\1/p'; }
printf "%-6s %-3s %7s %6s %10s %8s\n" scale k alpha E tok/s speedup
for s in $scales; do
  target="$dir/small-q8_0-deep$s.gguf"
  draft="$dir/small-q8_0-deep$s-draft2.gguf"
  [ -f "$target" ] || "$bin" gen-model --preset small --type q8_0 --deep-block-scale "$s" --deep-block-from 2 \
    --out "$target" 2>/dev/null
  [ -f "$draft" ] || "$bin" gen-model --draft-of "$target" --layers 2 --out "$draft" 2>/dev/null
  for k in $ks; do
    alone=$("$bin" bench-engine --model "$target" "${common[@]}" 2>/dev/null | tok_s)
    out=$("$bin" bench-engine --model "$target" --draft-model "$draft" --draft-tokens "$k" "${common[@]}" 2>&1)
    spec=$(echo "$out" | tok_s)
    line=$(echo "$out" | grep event=bench_speculation | tail -1)
    alpha=$(echo "$line" | sed -n 's/.*token_acceptance=\([0-9.]*\).*/\1/p')
    ratio=$(echo "$line" | sed -n 's/.* acceptance=\([0-9.]*\).*/\1/p')
    e=$(awk -v k="$k" -v r="$ratio" 'BEGIN { printf "%.2f", 1 + k * r }')
    printf "%-6s %-3s %7s %6s %10s %8s   (alone %s tok/s)\n" "$s" "$k" "$alpha" "$e" "$spec" \
      "$(awk -v a="$spec" -v b="$alone" 'BEGIN { printf "%.2f", a / b }')" "$alone"
  done
done

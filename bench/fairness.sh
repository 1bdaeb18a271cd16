#!/usr/bin/env bash
# Fairness across tenants, in the simulator (virtual time: the numbers do not
# depend on the machine). bench/scenarios/fairness.json runs five ways:
#   alone  - the quiet tenant by itself
#   fair   - quiet beside a tenant flooding at ten times its share, with the
#            router's fair queue and per-tenant place limits
#   fifo   - the same two tenants, first come first served
#   yield  - as fair, with engines that stop a decode step or a prefill
#            chunk at a layer boundary for the quiet tenant's prompt, as the
#            CPU engine does ("layer_yield": "cpu")
#   cuda   - as fair, with engines that stop as the CUDA engine does
#            ("layer_yield": "cuda": prefill chunks, and decode steps long
#            enough to run layer by layer, a stage later)
# and prints each tenant's TTFT p50/p99 and the quiet tenant's p99 against
# its quiet value. Usage: bench/fairness.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build}/bin/exaserve
[ -x "$bin" ] || { echo "fairness: $bin not found; run make build first" >&2; exit 1; }
scenario=$root/bench/scenarios/fairness.json
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

sed 's/, { "name": "flood", "rate_per_s": 100 }//' "$scenario" > "$work/alone.json"
cp "$scenario" "$work/fair.json"
sed 's/"fair_admission": true/"fair_admission": false/' "$scenario" > "$work/fifo.json"
sed 's/"gpu": "h100-80gb" }/"gpu": "h100-80gb", "layer_yield": "cpu" }/' "$scenario" > "$work/yield.json"
sed 's/"gpu": "h100-80gb" }/"gpu": "h100-80gb", "layer_yield": "cuda" }/' "$scenario" > "$work/cuda.json"
for v in yield cuda; do
  grep -q '"layer_yield": "' "$work/$v.json" || { echo "fairness: could not set layer_yield in $scenario" >&2; exit 1; }
done

field() {  # field $3 of tenant $2 in the "tenants" section of report $1
  sed -n '/"tenants"/,/^  }/p' "$1" | grep -A5 "\"$2\": {" | sed -n "s/.*\"$3\": \([0-9.]*\).*/\1/p" | head -1 || true
}
p99() { field "$1" "$2" ttft_p99_ms; }
p50() { field "$1" "$2" ttft_p50_ms; }
for v in alone fair fifo yield cuda; do
  echo "fairness: running $v" >&2
  "$bin" sim "$work/$v.json" --report-json "$work/$v.report.json" > /dev/null 2> "$work/$v.log"
done
quiet_alone=$(p99 "$work/alone.report.json" quiet)
printf '%-6s %-6s %14s %14s %18s\n' run tenant "ttft p50 ms" "ttft p99 ms" "p99 / quiet alone"
for v in alone fair fifo yield cuda; do
  for t in quiet flood; do
    p=$(p99 "$work/$v.report.json" $t)
    [ -n "$p" ] || continue
    ratio=$(awk -v a="$p" -v b="$quiet_alone" 'BEGIN { printf "%.2f", a / b }')
    [ "$t" = quiet ] || ratio=-
    printf '%-6s %-6s %14s %14s %18s\n' "$v" "$t" "$(p50 "$work/$v.report.json" $t)" "$p" "$ratio"
  done
done

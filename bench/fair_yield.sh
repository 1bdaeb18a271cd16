#!/usr/bin/env bash
# A light tenant's TTFT beside a heavy tenant flooding one CPU engine, in real
# time: alone, beside the flood with arrivals waiting for the step in flight,
# and beside it with the engine stopping a step at a layer boundary for them
# (bench/fair_yield.cpp). The small q8_0 preset, generated on first use.
# Usage: bench/fair_yield.sh [fair_yield flags], e.g. --rounds 3 --threads 1
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/bin/fair_yield ] && [ -x build/bin/exaserve ] || { echo "fair_yield: run make build first" >&2; exit 1; }
cache="${EXASERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/exaserve}/models"
mkdir -p "$cache"
model="$cache/small-q8_0-seed1-a64.gguf"
[ -f "$model" ] || build/bin/exaserve gen-model --preset small --type q8_0 --out "$model"
isa=avx2-or-less
grep -qw avx512f /proc/cpuinfo && isa=avx512f
echo "fair_yield: widest vector ISA on this CPU: $isa (/proc/cpuinfo)"
exec build/bin/fair_yield --model "$model" "$@"

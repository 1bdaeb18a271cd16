#!/usr/bin/env bash
# Load time of a ~1 GB GGUF file in ExaServe and in llama.cpp (node-llama-cpp
# 3.22.1's prebuilt CPU build, bench/llamacpp), cold (the file dropped from the
# page cache first) and warm, in the same run.
#
#   scripts/load_time.sh [FILE] [ROUNDS]
#
# FILE defaults to /tmp/exa-load/llama-1g-q8_0.gguf, generated if missing
# (llama, 16 layers, dim 2048, ff 5632, vocab 32000, q8_0: 0.9 GB).
# ExaServe's load_ms is llama_model::load (open, mmap, parse, bind: no weight
# is read); first token adds the engine, KV pool and one forward pass, which
# pages in every weight. llama.cpp's load_ms is loadModel (mmap with
# MAP_POPULATE: it reads the whole file), first token its context + one decode.
set -euo pipefail
cd "$(dirname "$0")/.."
exaserve=${EXASERVE:-build/bin/exaserve}
file=${1:-/tmp/exa-load/llama-1g-q8_0.gguf}
rounds=${2:-3}

if [[ ! -f $file ]]; then
  mkdir -p "$(dirname "$file")"
  "$exaserve" gen-model --out "$file" --type q8_0 --layers 16 --dim 2048 --heads 16 --kv-heads 4 \
    --ff 5632 --vocab 32000 --context 2048 --name load-test 2>/dev/null
fi
bytes=$(stat -c %s "$file")
echo "# file $file: $bytes bytes; $(nproc) cores"

# Drops the file's pages from the page cache (no root needed for clean pages).
evict() { dd if="$file" iflag=nocache count=0 status=none; }

ours() {
  local log t0 t1
  t0=$(date +%s.%N)
  log=$("$exaserve" generate --model "$file" --prompt-ids 1 --max-tokens 1 --ignore-eos --ids --threads 2 2>&1 >/dev/null)
  t1=$(date +%s.%N)
  local load_ms
  load_ms=$(grep -o 'load_ms=[0-9.]*' <<<"$log" | cut -d= -f2)
  printf 'exaserve  load_ms=%s process_to_first_token_ms=%.0f\n' "$load_ms" "$(echo "($t1 - $t0) * 1000" | bc -l)"
}

theirs() {
  local t0 t1 out
  t0=$(date +%s.%N)
  out=$(node bench/llamacpp/load_time.mjs "$file" --threads 2)
  t1=$(date +%s.%N)
  printf 'llama.cpp %s process_to_first_token_ms=%.0f\n' "$out" "$(echo "($t1 - $t0) * 1000" | bc -l)"
}

for round in $(seq "$rounds"); do
  echo "# round $round: cold"
  evict; ours
  evict; theirs
  echo "# round $round: warm"
  ours
  theirs
done

#!/usr/bin/env bash
# Tokenization throughput (MB of text per second) of ExaServe and llama.cpp
# (node-llama-cpp 3.22.1's prebuilt CPU build, bench/llamacpp) on the same
# files and the same text, measured alternately in one run.
#
#   scripts/tokenize_speed.sh [ROUNDS]     (default 5)
#
# Models: the committed SentencePiece and BPE (llama-bpe) test vocabularies
# under the tiny preset's weights (only the vocabulary matters). Text: the
# repo's docs and README repeated to about 1 MB. Both sides tokenize the text
# 3 times per process, plain (no special tokens, no BOS), and time only that
# (ExaServe: encode() in C++; llama.cpp: model.tokenize() from node, which
# includes passing the string to native code). Prints each round and the
# medians with the ratio ours/llama.cpp.
set -euo pipefail
cd "$(dirname "$0")/.."
exaserve=${EXASERVE:-build/bin/exaserve}
rounds=${1:-5}
work=$(mktemp -d /tmp/exa-tokspeed.XXXXXX)
trap 'rm -rf "$work"' EXIT

[[ -d bench/llamacpp/node_modules/node-llama-cpp ]] || {
  echo "tokenize_speed: install llama.cpp first: (cd bench/llamacpp && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install)" >&2
  exit 2
}

: >"$work/text.txt"
while [[ $(stat -c %s "$work/text.txt") -lt 1000000 ]]; do cat docs/*.md README.md >>"$work/text.txt"; done
echo "# text: $(stat -c %s "$work/text.txt") bytes; cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(nproc) cores"

for v in spm bpe; do
  "$exaserve" gen-model --preset tiny --vocab "tests/fixtures/tokenizer/$v-vocab.json" --out "$work/$v.gguf" 2>/dev/null
done

ours() { "$exaserve" tokenize --model "$1" --text-file "$work/text.txt" --repeat 3 2>&1 >/dev/null |
  sed -n 's/.*= \([0-9.]*\) MB\/s.*/\1/p'; }
theirs() { node bench/llamacpp/ref.mjs tokenize-speed "$1" --text-file "$work/text.txt" --repeat 3 |
  sed -n 's/.*"mb_per_s":\([0-9.]*\).*/\1/p'; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

for v in spm bpe; do
  : >"$work/$v.ours"; : >"$work/$v.theirs"
  for r in $(seq "$rounds"); do
    o=$(ours "$work/$v.gguf"); t=$(theirs "$work/$v.gguf")
    echo "$o" >>"$work/$v.ours"; echo "$t" >>"$work/$v.theirs"
    printf '%s round %d: exaserve %6.2f MB/s  llama.cpp %6.2f MB/s\n' "$v" "$r" "$o" "$t"
  done
  mo=$(median <"$work/$v.ours"); mt=$(median <"$work/$v.theirs")
  printf '%s median: exaserve %.2f MB/s, llama.cpp %.2f MB/s, ratio %.2f\n' "$v" "$mo" "$mt" "$(echo "$mo / $mt" | bc -l)"
done

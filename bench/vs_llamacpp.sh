#!/usr/bin/env bash
# Batch-1 decode and prefill tokens/s of ExaServe against llama.cpp on the same
# GGUF file, in one run, alternating the two so that drift in the machine's
# speed hits both alike. llama.cpp is node-llama-cpp's prebuilt CPU build
# (bench/llamacpp, never built from source).
#
#   bench/vs_llamacpp.sh [--rounds N] [--threads 1,2] [--types q8_0,f16]
#                        [--isa native|avx2] [--prefill-tokens 512]
#                        [--decode-prompt 8] [--decode-steps 128]
#                        [--flash-attention auto|on|off] [--cache-dir DIR]
#                        [--llama-cpu VARIANT]
#                        [--exaserve BIN] [--raw FILE]
#
# The model is llama.cpp's benchmark shape (16 layers, dim 1024, 16 heads of
# 64, 4 KV heads, ff 2816, vocab 32000; 262 MB as q8_0), written once per type
# by `exaserve gen-model` into the cache dir and reused.
#
# Per (type, threads) and round: ExaServe (`exaserve bench-engine --batches 1
# --repeat 1`) then llama.cpp (bench/llamacpp/bench.mjs), or the other way
# round on odd rounds; each process measures
#   prefill: one prompt of --prefill-tokens tokens and its first greedy token;
#   decode:  a --decode-prompt prompt and its first token (not timed), then
#            --decode-steps greedy steps of one token each;
# timing only the evaluation, never the load. One warm-up round per pair is
# not counted (it pages the file in). The table gives the median and min-max
# of each side's tokens/s and the ratio of the medians, ours / llama.cpp; for
# decode also the read bandwidth our process measured just before (its
# roofline probe, engine/roofline.hpp) and each side's matrices read per
# second as a share of it, which tells a slow phase of the host (both near
# 100 %) from one where memory was not the limit.
#
# --isa avx2 runs both sides on their AVX2 kernels on an AVX-512 host:
# ExaServe through EXA_ENGINE_ISA=avx2, llama.cpp by loading a copy of the
# prebuilt bundle (in the cache dir) whose only CPU backend is
# libggml-cpu-haswell.so (ggml picks the best variant the CPU supports among
# those in the bundle's directory, so offering only haswell forces it).
# --llama-cpu VARIANT offers llama.cpp only libggml-cpu-VARIANT.so the same
# way (e.g. icelake on a Sapphire Rapids host: AVX-512 with VNNI, no AMX),
# keeping ours on its best path unless --isa avx2 says otherwise.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rounds=5
threads_list="1,2"
types="q8_0,f16"
isa="native"
prefill_tokens=512
decode_prompt=8
decode_steps=128
flash_attention="auto"
llama_cpu=""
cache_dir="${XDG_CACHE_HOME:-$HOME/.cache}/exaserve-bench"
exaserve="$root/build/bin/exaserve"
raw=""

usage() { sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --threads) threads_list="$2"; shift 2 ;;
    --types) types="$2"; shift 2 ;;
    --isa) isa="$2"; shift 2 ;;
    --prefill-tokens) prefill_tokens="$2"; shift 2 ;;
    --decode-prompt) decode_prompt="$2"; shift 2 ;;
    --decode-steps) decode_steps="$2"; shift 2 ;;
    --flash-attention) flash_attention="$2"; shift 2 ;;
    --cache-dir) cache_dir="$2"; shift 2 ;;
    --llama-cpu) llama_cpu="$2"; shift 2 ;;
    --exaserve) exaserve="$2"; shift 2 ;;
    --raw) raw="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "vs_llamacpp.sh: unknown option '$1'" >&2; usage ;;
  esac
done
case "$isa" in native|avx2) ;; *) echo "vs_llamacpp.sh: --isa must be native or avx2" >&2; exit 2 ;; esac
[[ "$isa" == avx2 && -z "$llama_cpu" ]] && llama_cpu=haswell
[[ -z "$llama_cpu" || "$llama_cpu" =~ ^[a-z0-9_]+$ ]] || { echo "vs_llamacpp.sh: --llama-cpu takes a variant name such as haswell or icelake" >&2; exit 2; }
for n in "$rounds" "$prefill_tokens" "$decode_prompt" "$decode_steps"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "vs_llamacpp.sh: counts must be positive integers" >&2; exit 2; }
done
[[ -x "$exaserve" ]] || { echo "vs_llamacpp.sh: $exaserve not built (cmake --build build --target exaserve)" >&2; exit 1; }
# One binary for the whole run, even if the build tree is relinked meanwhile.
snapshot="$(mktemp "${TMPDIR:-/tmp}/exaserve-bench.XXXXXX")"
trap 'rm -f "$snapshot"' EXIT
cp "$exaserve" "$snapshot" && chmod +x "$snapshot"
exaserve="$snapshot"
command -v node >/dev/null || { echo "vs_llamacpp.sh: node is required for llama.cpp (node-llama-cpp)" >&2; exit 1; }

llama_dir="$root/bench/llamacpp"
if [[ ! -d "$llama_dir/node_modules/node-llama-cpp" ]]; then
  echo "installing node-llama-cpp (prebuilt binaries only)..." >&2
  (cd "$llama_dir" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --no-audit --no-fund >&2)
fi
mkdir -p "$cache_dir"
[[ -n "$raw" ]] || raw="$cache_dir/vs_llamacpp-$(date +%Y%m%d-%H%M%S).jsonl"
: > "$raw"

# A copy of the llama.cpp bundle with one CPU variant (--isa avx2: haswell;
# --llama-cpu NAME): node-llama-cpp and its x64 binaries copied (every CPU
# variant but that one left out), every other package linked to the real
# install. bench.mjs is copied too, since Node resolves imports from a
# script's real path.
llama_run_dir="$llama_dir"
if [[ -n "$llama_cpu" ]]; then
  bins="node_modules/@node-llama-cpp/linux-x64"
  lib="libggml-cpu-$llama_cpu.so"
  [[ -f "$llama_dir/$bins/bins/linux-x64/$lib" ]] || {
    echo "vs_llamacpp.sh: llama.cpp's bundle has no $lib; it has: $(cd "$llama_dir/$bins/bins/linux-x64" && ls libggml-cpu-*.so | sed 's/libggml-cpu-//; s/\.so$//' | tr '\n' ' ')" >&2
    exit 2
  }
  shadow="$cache_dir/llamacpp-$llama_cpu"
  if [[ ! -f "$shadow/$bins/bins/linux-x64/$lib" || "$llama_dir/bench.mjs" -nt "$shadow/bench.mjs" ]]; then
    rm -rf "$shadow"
    mkdir -p "$shadow/node_modules/@node-llama-cpp" "$shadow/$bins/bins/linux-x64"
    for p in "$llama_dir"/node_modules/* "$llama_dir"/node_modules/.bin; do
      case "$(basename "$p")" in node-llama-cpp|@node-llama-cpp) ;; *) ln -s "$p" "$shadow/node_modules/" ;; esac
    done
    cp -a "$llama_dir/node_modules/node-llama-cpp" "$shadow/node_modules/"
    for f in "$llama_dir/$bins"/*; do [[ "$(basename "$f")" == bins ]] || cp -a "$f" "$shadow/$bins/"; done
    for f in "$llama_dir/$bins/bins/linux-x64"/*; do
      case "$(basename "$f")" in libggml-cpu-*) ;; *) cp -a "$f" "$shadow/$bins/bins/linux-x64/" ;; esac
    done
    cp -a "$llama_dir/$bins/bins/linux-x64/$lib" "$shadow/$bins/bins/linux-x64/"
    cp "$llama_dir/bench.mjs" "$shadow/"
  fi
  llama_run_dir="$shadow"
fi
if [[ "$isa" == avx2 ]]; then
  export EXA_ENGINE_ISA=avx2
else
  unset EXA_ENGINE_ISA
fi

model_for() {  # type -> path, generated once
  local f="$cache_dir/llamacpp-bench-shape-$1.gguf"
  if [[ ! -s "$f" ]]; then
    echo "generating $f..." >&2
    "$exaserve" gen-model --preset small --type "$1" --layers 16 --dim 1024 --heads 16 --kv-heads 4 \
      --ff 2816 --vocab 32000 --context 2048 --out "$f.tmp" >&2
    mv "$f.tmp" "$f"
  fi
  echo "$f"
}

run_ours() {  # model threads -> one JSON line (with the read and compute peaks of that moment)
  "$exaserve" bench-engine --model "$1" --threads "$2" --batches 1 --repeat 1 \
    --prefill-tokens "$prefill_tokens" --decode-prompt "$decode_prompt" --decode-steps "$decode_steps" \
    --json 2>/dev/null | tail -n 1
}
run_theirs() {
  node "$llama_run_dir/bench.mjs" "$1" --threads "$2" --prefill-tokens "$prefill_tokens" \
    --decode-prompt "$decode_prompt" --decode-steps "$decode_steps" --flash-attention "$flash_attention" | tail -n 1
}
record() {  # side type threads round json
  [[ "$5" == \{* ]] || { echo "vs_llamacpp.sh: $1 failed (type $2, $3 threads): $5" >&2; exit 1; }
  printf '{"side":"%s","type":"%s","threads":%s,"round":%s,"result":%s}\n' "$1" "$2" "$3" "$4" "$5" >> "$raw"
}

cpu_model="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
cpu_flags="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni|avx512_bf16|avx_vnni' | tr '\n' ' ')"
echo "CPU: $cpu_model ($(nproc) cores online)"
echo "ISA flags: $cpu_flags"
echo "llama.cpp CPU variants offered: ${llama_cpu:-all in the bundle (ggml loads the best this CPU supports)}"
echo "isa: $isa; rounds: $rounds (+1 warm-up); prefill $prefill_tokens tokens; decode $decode_steps steps after a $decode_prompt-token prompt; greedy; load not timed"
echo "ExaServe commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD -- runtime apps 2>/dev/null || echo ' (+ uncommitted changes)')"

IFS=, read -r -a type_arr <<< "$types"
IFS=, read -r -a thread_arr <<< "$threads_list"
for type in "${type_arr[@]}"; do
  model="$(model_for "$type")"
  for t in "${thread_arr[@]}"; do
    echo "-- $type, $t thread(s)" >&2
    for ((r = 0; r <= rounds; ++r)); do
      if (( r % 2 == 0 )); then
        o="$(run_ours "$model" "$t")"; l="$(run_theirs "$model" "$t")"
      else
        l="$(run_theirs "$model" "$t")"; o="$(run_ours "$model" "$t")"
      fi
      (( r == 0 )) && continue  # warm-up
      record ours "$type" "$t" "$r" "$o"
      record llamacpp "$type" "$t" "$r" "$l"
    done
  done
done

# Medians, ranges and ratios from the raw lines.
node - "$raw" "$isa" "$flash_attention" <<'EOF'
const fs = require("fs");
const [raw, isa, fa] = process.argv.slice(2);
const rows = fs.readFileSync(raw, "utf8").trim().split("\n").map((l) => JSON.parse(l));
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
const groups = new Map();
for (const r of rows) {
  const k = `${r.type}|${r.threads}`;
  if (!groups.has(k)) groups.set(k, { type: r.type, threads: r.threads, ours: [], llamacpp: [] });
  groups.get(k)[r.side].push(r.result);
}
const ourIsa = [...new Set(rows.filter((r) => r.side === "ours").map((r) => r.result.isa ?? "n/a (bench-engine does not report it)"))];
const variants = [...new Set(rows.filter((r) => r.side === "llamacpp").map((r) => r.result.cpu_variant))];
const faUsed = [...new Set(rows.filter((r) => r.side === "llamacpp").map((r) => r.result.flash_attention))];
console.log(`ExaServe kernel path: ${ourIsa.join(", ")}`);
console.log(`llama.cpp CPU backend: ${variants.join(", ")}; flash attention option '${fa}' -> ${faUsed.join(", ")}`);
const fmt = (x) => x.toFixed(1);
const cell = (xs) => `${fmt(median(xs))} (${fmt(Math.min(...xs))}-${fmt(Math.max(...xs))})`;
console.log("");
// Decode rows also say how fast memory was: the read bandwidth our runs
// measured just before decoding (bench-engine's roofline probe, on as many
// threads), and each side's matrices read per second as a share of it (both
// sides read the same matrices once per token). A slow phase of the host puts
// both near 100 %; where one side falls short of it, memory was not its limit.
console.log("| type | threads | metric | ExaServe tok/s median (min-max) | llama.cpp tok/s median (min-max) | ours / llama.cpp | read GB/s median (min-max) | of read roof: ours / llama.cpp |");
console.log("|---|---|---|---|---|---|---|---|");
for (const g of groups.values()) {
  for (const [metric, key] of [["decode b=1", null], ["prefill", "prefill_tok_s"]]) {
    const o = g.ours.map((r) => (key ? r[key] : r.decode[0].tok_s));
    const l = g.llamacpp.map((r) => (key ? r[key] : r.decode_tok_s));
    let roof = "| |";
    const read = g.ours.map((r) => r.roofline?.read_gbps ?? 0).filter((x) => x > 0);
    const bytes = g.ours.map((r) => r.roofline?.matmul_bytes ?? 0).find((x) => x > 0);
    if (!key && read.length && bytes) {
      const share = (tok) => `${((100 * median(tok) * bytes) / 1e9 / median(read)).toFixed(0)} %`;
      roof = `| ${cell(read)} | ${share(o)} / ${share(l)} |`;
    }
    console.log(`| ${g.type} | ${g.threads} | ${metric} | ${cell(o)} | ${cell(l)} | ${(median(o) / median(l)).toFixed(2)} ${roof}`);
  }
}
console.log(`\nraw results: ${raw}`);
EOF

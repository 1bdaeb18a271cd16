#!/usr/bin/env bash
# The GPU half of ExaServe's checks, for a machine with an NVIDIA GPU (8.0 or
# newer): builds with CUDA into its own build directory, runs the GPU tests
# (the CUDA kernels op by op and the CUDA engine end to end against the CPU
# engine, batch invariance on the GPU, the CUDA device, NCCL), compares the
# CUDA engine's greedy tokens with the CPU engine's on the benchmark models,
# and benchmarks batch-1 and batch-64 decode on the small preset and on a
# generated ~1B-parameter f16 model: tokens/s and achieved weight bandwidth as
# a fraction of the device's peak. Budget: under 8 minutes on an H200 host.
#
#   scripts/gpu_check.sh                  # everything
#   GPU_CHECK_BUILD_DIR=dir scripts/gpu_check.sh   # reuse a CUDA build there
#
# Everything it writes goes under $OUT when set (else build-gpu/gpu-check): the
# log of each phase, the benchmark JSON, and summary.md (the table for
# docs/PERFORMANCE.md). Generated models go to a scratch directory, not $OUT.
# Exit status: 0 when every check passed, 1 otherwise (the summary says which).

set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${GPU_CHECK_BUILD_DIR:-$repo/build-gpu}"
out="${OUT:-$build/gpu-check}"
mkdir -p "$out"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/exaserve-gpu-check.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
jobs="$(nproc)"
start=$SECONDS
failures=()

step() { printf '\n[%3ds] == %s\n' "$((SECONDS - start))" "$*" | tee -a "$out/progress.log"; }
note() { printf '[%3ds]    %s\n' "$((SECONDS - start))" "$*" | tee -a "$out/progress.log"; }
failed() { failures+=("$1"); note "FAILED: $1"; }

# Runs "$@" with a time limit, its output to $out/<name>.log (and the last
# lines to the terminal); records a failure instead of stopping the script.
run_logged() {
  local name="$1" limit="$2"
  shift 2
  local rc=0
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1 || rc=$?
  tail -n 15 "$out/$name.log" | sed 's/^/      /'
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then failed "$name: timed out after ${limit}s"; return 1; fi
  if [ "$rc" -eq 77 ]; then failed "$name: SKIPPED on a GPU machine (see $name.log)"; return 1; fi
  if [ "$rc" -ne 0 ]; then failed "$name: exit status $rc (see $name.log)"; return 1; fi
  note "ok: $name"
}

step "1/6 device"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >"$out/nvidia-smi.log" 2>&1; then
  note "no usable GPU here (nvidia-smi failed): nothing to check"
  exit 1
fi
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv | tee -a "$out/nvidia-smi.log"
arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')"
nvcc="${CUDACXX:-/usr/local/cuda/bin/nvcc}"
[ -x "$nvcc" ] || nvcc="$(command -v nvcc || true)"
if [ -z "$nvcc" ]; then note "nvcc not found (set CUDACXX)"; exit 1; fi
"$nvcc" --version | tail -1 | tee -a "$out/progress.log"

step "2/6 build with CUDA (sm_$arch) into $build"
if [ -z "${GPU_CHECK_BUILD_DIR:-}" ] || [ ! -f "$build/CMakeCache.txt" ]; then
  generator=()
  command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
  cmake -S "$repo" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DEXASERVE_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="$arch" >"$out/configure.log" 2>&1 ||
    { tail -n 30 "$out/configure.log"; note "configure failed (see configure.log)"; exit 1; }
  grep -q "building the CUDA device" "$out/configure.log" || { note "CMake did not enable CUDA (see configure.log)"; exit 1; }
fi
targets=(exaserve cuda_gpu_test)
for t in cuda_device_test nccl_test; do
  cmake --build "$build" --target help 2>/dev/null | grep -q "^${t}[: ]" && targets+=("$t")
done
note "targets: ${targets[*]}"
if ! timeout 420 cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$out/build.log" 2>&1; then
  grep -E "error|Error" "$out/build.log" | head -n 30
  note "build failed (see build.log)"
  exit 1
fi
bin="$build/bin"
note "built in $((SECONDS - start))s"

step "3/6 GPU tests"
run_logged cuda_gpu_test 240 "$bin/cuda_gpu_test" || true
for t in cuda_device_test nccl_test; do
  [ -x "$bin/$t" ] && { run_logged "$t" 120 "$bin/$t" || true; }
done

step "4/6 models: the small preset and a ~1B-parameter f16 model"
small="$scratch/small-f16.gguf"
big="$scratch/llama-1b-f16.gguf"
"$bin/exaserve" gen-model --preset small --type f16 --out "$small" >"$out/gen-small.log" 2>&1
# TinyLlama-1.1B's shape: 22 blocks, width 2048, 32 heads of 64 over 4 KV
# heads (GQA), MLP 5632, vocabulary 32000: 1.1 B parameters, 2.2 GB in f16.
"$bin/exaserve" gen-model --preset small --type f16 --layers 22 --dim 2048 --heads 32 --kv-heads 4 --ff 5632 \
  --vocab 32000 --context 2048 --name exaserve-1b --out "$big" >"$out/gen-1b.log" 2>&1
note "generated: $(du -h "$small" | cut -f1) and $(du -h "$big" | cut -f1)"

step "5/6 CUDA engine vs CPU engine: greedy tokens on the benchmark models"
run_logged check-small 120 "$bin/exaserve" bench-engine --model "$small" --device cuda --check-cpu 32 \
  --batches 1 --decode-steps 1 --repeat 1 --prefill-tokens 16 || true
run_logged check-1b 180 "$bin/exaserve" bench-engine --model "$big" --device cuda --check-cpu 8 \
  --batches 1 --decode-steps 1 --repeat 1 --prefill-tokens 16 || true

step "6/6 decode benchmarks (batch 1 and 64)"
bench() {  # name model
  run_logged "bench-$1" 180 "$bin/exaserve" bench-engine --model "$2" --device cuda --batches 1,64 \
    --decode-steps 32 --decode-prompt 16 --prefill-tokens 512 --repeat 3 --json || return 1
  grep '^{' "$out/bench-$1.log" | tail -1 >"$out/bench-$1.json"
}
bench small "$small" || true
bench 1b "$big" || true

python3 - "$out" "${failures[@]+"${failures[@]}"}" <<'EOF' | tee "$out/summary.md"
import json, os, sys
out, failures = sys.argv[1], sys.argv[2:]
rows = []
for name, label in (("small", "small preset (f16)"), ("1b", "1.1B generated (f16)")):
    path = os.path.join(out, f"bench-{name}.json")
    if not os.path.exists(path):
        rows.append(f"| {label} | (no result) | | | | | |")
        continue
    r = json.load(open(path))
    peak = r.get("peak_gbps", 0)
    dec = {d["batch"]: d for d in r["decode"]}
    b1, b64 = dec.get(1), dec.get(64)
    frac = b1["weight_gbps"] / peak if b1 and peak else 0
    ratio = b64["tok_s"] / b1["tok_s"] if b1 and b64 and b1["tok_s"] else 0
    rows.append(f"| {label} | {r['device']} | {r['prefill_tok_s']:.0f} | {b1['tok_s']:.1f} | "
                f"{b1['weight_gbps']:.0f} GB/s = {100 * frac:.0f} % of {peak:.0f} | {b64['tok_s']:.0f} | {ratio:.1f}x |")
print("| model | device | prefill tok/s | batch-1 tok/s | batch-1 weight bandwidth | batch-64 tok/s | 64 vs 1 |")
print("|---|---|---|---|---|---|---|")
print("\n".join(rows))
print()
print("Targets (issue 11): batch 1 reads the 1B model's weights at >= 70 % of peak; batch 64 >= 20x batch 1.")
print("Checks: " + ("all passed" if not failures else "FAILED: " + "; ".join(failures)))
EOF
note "done in $((SECONDS - start))s; results in $out"
[ ${#failures[@]} -eq 0 ]

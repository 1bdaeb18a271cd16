#!/usr/bin/env bash
# Where a CUDA decode step's time goes, kernel by kernel, on a GPU machine:
# Nsight Compute (ncu) times every kernel of a short bench-engine run on the
# generated ~1.1B-parameter f16 model (gpu_check.sh's shape) at batch 1 and
# batch 64, and prints its per-kernel summary (launches, mean duration), so a
# step's kernel time can be set against its wall time (bench-engine's tok/s).
# Programs come from the prebuilt bundle (.gpu-bundle, scripts/gpu_bundle.sh)
# or GPU_PROFILE_BIN=dir. ncu runs with --clock-control none (the clocks are
# left as the machine sets them; each kernel's SM clock is printed beside
# its duration, since a GPU that idles between profiled kernels may run them
# slower than in a CUDA graph). Output under $OUT when set, else
# build-gpu/gpu-profile: the summary printed here (summary.txt) and the raw
# logs in profile-logs.tar.gz (the device tool brings back 8 files at most).
# Each phase has a time limit; exit status 1 when one failed.
#
#   scripts/gpu_profile.sh            # batches 1 and 64
#   GPU_PROFILE_BATCHES=1 scripts/gpu_profile.sh

set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${GPU_PROFILE_BIN:-$repo/.gpu-bundle/bin}"
out="${OUT:-$repo/build-gpu/gpu-profile}"
raw="$out/raw"
mkdir -p "$raw"
[ -x "$bin/exaserve" ] || { echo "gpu_profile: $bin/exaserve missing: run scripts/gpu_bundle.sh, or set GPU_PROFILE_BIN" >&2; exit 1; }
[ -d "$bin/../lib" ] && export LD_LIBRARY_PATH="$(cd "$bin/../lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ncu="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)"
[ -n "$ncu" ] || { echo "gpu_profile: ncu (Nsight Compute) not found" >&2; exit 1; }
scratch="$(mktemp -d "${TMPDIR:-/tmp}/exaserve-gpu-profile.XXXXXX")"
trap 'rm -rf "$scratch"; tar czf "$out/profile-logs.tar.gz" -C "$out" raw && rm -rf "$raw"' EXIT
exec > >(tee "$out/summary.txt") 2>&1
model="$scratch/llama-1b-f16.gguf"
rc=0
timeout 120 "$bin/exaserve" gen-model --preset small --type f16 --layers 22 --dim 2048 --heads 32 --kv-heads 4 \
  --ff 5632 --vocab 32000 --context 2048 --name exaserve-1b --out "$model" >"$raw/gen.log" 2>&1 ||
  { echo "gpu_profile: model generation failed (gen.log)"; exit 1; }
for batch in ${GPU_PROFILE_BATCHES:-1 64}; do
  # Unprofiled first: the step's wall time to set the kernels against.
  timeout 120 "$bin/exaserve" bench-engine --model "$model" --device cuda --batches "$batch" --decode-steps 32 \
    --decode-prompt 16 --prefill-tokens 16 --repeat 3 >"$raw/bench-b$batch.txt" 2>&1 || rc=1
  grep -E "^ +$batch " "$raw/bench-b$batch.txt" | sed "s/^/batch $batch, unprofiled: /" || true
  # Profiled: every kernel of the run (prefill, capture, decode steps).
  timeout 240 "$ncu" --clock-control none --metrics gpu__time_duration.sum,smsp__cycles_elapsed.avg.per_second --print-summary per-kernel \
    "$bin/exaserve" bench-engine --model "$model" --device cuda --batches "$batch" --decode-steps 8 \
    --decode-prompt 16 --prefill-tokens 16 --repeat 1 >"$raw/ncu-b$batch.txt" 2>&1 || rc=1
  echo "== batch $batch: per-kernel summary (duration and SM clock: minimum, maximum, average)"
  awk '/\)x\(/ && /[Ii]nvocations/ {name=$0; print name} /gpu__time_duration.sum|cycles_elapsed/ {print}' \
    "$raw/ncu-b$batch.txt" | sed -e 's/  */ /g' -e 's/(anonymous namespace)::/ /g' | cut -c1-200 | uniq || true
  grep -q gpu__time_duration "$raw/ncu-b$batch.txt" || tail -n 30 "$raw/ncu-b$batch.txt"
done
exit "$rc"

#!/usr/bin/env bash
# Packs the CUDA build's programs that scripts/gpu_check.sh runs, with the
# shared libraries they need beyond the C library, into .gpu-bundle/ (an
# ignored path) so a GPU machine that cannot build ExaServe can still run the
# check. A GPU machine lent through the device tool gets a copy of the working
# tree, not our Debian -dev packages (CAF, Cap'n Proto, spdlog, ...), and
# cannot reach a package registry: building there fails at configure. So:
#
#   here:   flock /tmp/exa-build.lock cmake --build build --target exaserve cuda_gpu_test cuda_device_test nccl_test cuda_tp_gpu_test
#           scripts/gpu_bundle.sh            # or: scripts/gpu_bundle.sh path/to/cuda-build
#   there:  the device tool's run with carry [".gpu-bundle"] and the command
#           scripts/gpu_check.sh             # finds .gpu-bundle and skips the build
#
# The bundle is x86-64 Linux code built against this machine's glibc (it
# records the newest symbol version it needs; gpu_check.sh refuses a machine
# whose libraries cannot satisfy it). It must stay under the device tool's
# 64 MiB (working tree included): binaries are stripped, and libstdc++ and
# libgcc_s go to lib/compat, used only when the machine's own are too old.

set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$repo/build}"
dest="$repo/.gpu-bundle"
limit_mib=56  # leaves room for the working tree under the tool's 64 MiB

die() { echo "gpu_bundle: $*" >&2; exit 1; }

[ -x "$build/bin/cuda_gpu_test" ] ||
  die "$build/bin/cuda_gpu_test is missing: build a CUDA-enabled tree first (nvcc found at configure; target cuda_gpu_test)"
[ -x "$build/bin/exaserve" ] || die "$build/bin/exaserve is missing: build the exaserve target first"
for t in exaserve cuda_gpu_test; do
  # Stale binaries would check old code: say so (the bundle records its commit).
  newer="$(find "$repo/gpu" "$repo/runtime" -newer "$build/bin/$t" \( -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.hpp' \) -print -quit)"
  [ -z "$newer" ] || echo "gpu_bundle: WARNING: $build/bin/$t is older than $newer: rebuild it unless that change is not yours to test" >&2
done

rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib/compat"
programs=()
for t in exaserve cuda_gpu_test cuda_device_test nccl_test cuda_tp_gpu_test; do
  [ -x "$build/bin/$t" ] || continue
  strip --strip-unneeded -o "$dest/bin/$t" "$build/bin/$t"
  programs+=("$build/bin/$t")
done

# Every shared library the programs load, except the C library's own (the
# machine's must serve; it is newer than ours or the bundle cannot run there).
declare -A seen=()
for p in "${programs[@]}"; do
  while read -r lib path; do
    [ -n "$path" ] && [ -f "$path" ] || continue
    case "$lib" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|linux-vdso*) continue ;;
      libstdc++.so.*|libgcc_s.so.*) dir="$dest/lib/compat" ;;
      libcuda.so.*|libnvidia-*) continue ;;  # the driver's: never ship them
      *) dir="$dest/lib" ;;
    esac
    [ -n "${seen[$lib]:-}" ] && continue
    seen[$lib]=1
    cp -L "$path" "$dir/$lib"
  done < <(ldd "$p" | awk '$2 == "=>" {print $1, $3}')
done

glibc="$(for f in "$dest"/bin/* "$dest"/lib/*.so*; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)"
glibcxx="$(for f in "$dest"/bin/* "$dest"/lib/*.so*; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBCXX_[0-9][0-9.]*' | sort -V | tail -1)"
{
  echo "commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "dirty=$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null | grep -c . || true)"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host=$(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "glibc_needed=$glibc"
  echo "glibcxx_needed=$glibcxx"
  echo "nvcc=$(grep -m1 'CMAKE_CUDA_COMPILER_VERSION' "$build/CMakeFiles"/*/CMakeCUDACompiler.cmake 2>/dev/null | sed 's/.*"\(.*\)".*/\1/' || true)"
  echo "cuda_code=$(grep -oh 'generate-code=arch=compute_[0-9]*,code=\[[a-z_0-9,]*\]' "$build"/build.ninja "$build"/*/CMakeFiles/*/flags.make 2>/dev/null | sed 's/.*code=//' | sort -u | tr '\n' ' ' || true)"
  echo "programs=$(ls "$dest/bin" | tr '\n' ' ')"
} >"$dest/BUILD_INFO"

size_mib=$(( $(du -sb "$dest" | cut -f1) / 1048576 ))
cat "$dest/BUILD_INFO"
echo "gpu_bundle: $dest holds ${size_mib} MiB ($(ls "$dest/lib" | grep -c '\.so') libraries)"
[ "$size_mib" -le "$limit_mib" ] || die "the bundle is ${size_mib} MiB, over ${limit_mib}: the device tool carries 64 MiB in all"
echo "gpu_bundle: carry \".gpu-bundle\" in the device tool's run; scripts/gpu_check.sh uses it instead of building"

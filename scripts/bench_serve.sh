#!/usr/bin/env bash
# Serving-path overhead behind docs/PERFORMANCE.md ("Serving-path overhead"):
# starts `exaserve serve --engine null` (a zero-cost engine, so latency is
# pure serving path), then loads it with wrk over HTTP and with rpc_loadgen
# over Cap'n Proto RPC at a few concurrency levels, and prints one table.
#
#   scripts/bench_serve.sh                 # -c 1, 8, 64; 10 s each
#   CONCURRENCY="1 64" DURATION_S=5 scripts/bench_serve.sh
#
# Environment:
#   BIN_DIR       where exaserve and rpc_loadgen are (default build/bin)
#   CONCURRENCY   closed-loop concurrency levels (default "1 8 64")
#   DURATION_S    measured seconds per run (default 10)
#   WARMUP_S      unmeasured seconds before each run (default 2)
#   MAX_TOKENS    tokens per request (default 1: latency = time to first token)
#   SERVE_ARGS    extra flags for `exaserve serve` (e.g. "--nodes 1 --replicas 1")
#   PERF_DATA     if set, `perf record -g` the server during the HTTP run at the
#                 highest concurrency and write the profile there
#   EXASERVE_CACHE  model cache (default /tmp/exacache; the tiny model is
#                 generated on first use)
#
# The load generator and the server share the machine's cores, so on a small
# machine the numbers are a floor for the server alone.
set -euo pipefail
cd "$(dirname "$0")/.."

bin_dir="${BIN_DIR:-build/bin}"
concurrency="${CONCURRENCY:-1 8 64}"
duration_s="${DURATION_S:-10}"
warmup_s="${WARMUP_S:-2}"
max_tokens="${MAX_TOKENS:-1}"
export EXASERVE_CACHE="${EXASERVE_CACHE:-/tmp/exacache}"
# Warnings only: per-request info lines would put logging on the hot path.
export EXASERVE_LOG="${EXASERVE_LOG:-warn}"
# Bounds: the tiny model is generated on first start, which takes seconds.
ready_timeout_s=120

for tool in "$bin_dir/exaserve" "$bin_dir/rpc_loadgen"; do
  [ -x "$tool" ] || { echo "bench_serve: $tool not built (cmake --build build --target exaserve rpc_loadgen)" >&2; exit 2; }
done
command -v wrk >/dev/null || { echo "bench_serve: wrk not installed" >&2; exit 2; }
command -v curl >/dev/null || { echo "bench_serve: curl not installed" >&2; exit 2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/bench_serve.XXXXXX")"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    # The server drains for up to 10 s; do not wait longer than that.
    for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  echo "server log: $work/server.log" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Port 0: the server picks free ports and prints them in its banner.
# shellcheck disable=SC2086 # SERVE_ARGS is a list of flags
"$bin_dir/exaserve" serve --engine null --http-port 0 --rpc-port 0 ${SERVE_ARGS:-} \
  >"$work/banner.txt" 2>"$work/server.log" </dev/null &
server_pid=$!

http_url="" rpc_addr=""
for _ in $(seq $((ready_timeout_s * 5))); do
  kill -0 "$server_pid" 2>/dev/null || { echo "bench_serve: server exited; see $work/server.log" >&2; exit 1; }
  http_url="$(grep -o 'HTTP (OpenAI-compatible): http://[0-9.]*:[0-9]*' "$work/banner.txt" | grep -o 'http://.*' || true)"
  rpc_addr="$(grep 'Proto RPC:' "$work/banner.txt" | grep -oE '[0-9][0-9.]*:[0-9]+' | head -1 || true)"
  if [ -n "$http_url" ] && [ -n "$rpc_addr" ] && curl -sf --max-time 2 "$http_url/readyz" >/dev/null; then break; fi
  http_url=""
  sleep 0.2
done
[ -n "$http_url" ] || { echo "bench_serve: not ready after ${ready_timeout_s} s; see $work/server.log" >&2; exit 1; }
echo "server pid $server_pid  http $http_url  rpc $rpc_addr  $(grep -o 'serving (.*)' "$work/banner.txt")"
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1)"

rows="$work/rows.txt"
: >"$rows"
export WRK_MAX_TOKENS="$max_tokens"
max_c=0
for c in $concurrency; do [ "$c" -gt "$max_c" ] && max_c=$c; done

run_http() {
  local c=$1 threads=$(( $1 < 2 ? 1 : 2 )) perf_pid=""
  # wrk has no warm-up phase: a short unrecorded run fills the server's pools.
  wrk -t"$threads" -c"$c" -d"${warmup_s}s" -s bench/wrk_completion.lua "$http_url/v1/completions" >/dev/null
  if [ -n "${PERF_DATA:-}" ] && [ "$c" -eq "$max_c" ]; then
    perf record -g -o "$PERF_DATA" -p "$server_pid" -- sleep "$duration_s" >/dev/null 2>"$work/perf.log" &
    perf_pid=$!
  fi
  wrk -t"$threads" -c"$c" -d"${duration_s}s" --latency -s bench/wrk_completion.lua \
    "$http_url/v1/completions" | tee "$work/wrk-c$c.txt"
  [ -z "$perf_pid" ] || wait "$perf_pid" || true
  local line
  line="$(grep '^WRK_RESULT' "$work/wrk-c$c.txt")"
  # Fields: door concurrency requests/s p50 p90 p99 max errors.
  echo "http $c $(sed -E 's/.*requests_per_s=([0-9.]+) p50_ms=([0-9.]+) p90_ms=([0-9.]+) p99_ms=([0-9.]+) max_ms=([0-9.]+) errors=([0-9]+).*/\1 \2 \3 \4 \5 \6/' <<<"$line")" >>"$rows"
}

run_rpc() {
  local c=$1 json
  json="$("$bin_dir/rpc_loadgen" --connect "$rpc_addr" --concurrency "$c" --duration-s "$duration_s" \
    --warmup-s "$warmup_s" --max-tokens "$max_tokens" --json)" || true
  echo "$json"
  [ -n "$json" ] || { echo "rpc $c - - - - - failed" >>"$rows"; return; }
  local rps ttft errors
  rps="$(grep -o '"requests_per_s":[0-9.]*' <<<"$json" | cut -d: -f2)"
  errors="$(grep -o '"errors":[0-9]*' <<<"$json" | cut -d: -f2)"
  ttft="$(sed -E 's/.*"ttft_ms":\{"p50":([0-9.]+),"p90":([0-9.]+),"p99":([0-9.]+),"max":([0-9.]+).*/\1 \2 \3 \4/' <<<"$json")"
  echo "rpc $c $rps $ttft $errors" >>"$rows"
}

for c in $concurrency; do
  echo "== HTTP, concurrency $c"
  run_http "$c"
  kill -0 "$server_pid" 2>/dev/null || { echo "bench_serve: server died; see $work/server.log" >&2; exit 1; }
done
for c in $concurrency; do
  echo "== RPC, concurrency $c"
  run_rpc "$c"
  kill -0 "$server_pid" 2>/dev/null || { echo "bench_serve: server died; see $work/server.log" >&2; exit 1; }
done

echo
echo "Serving-path overhead, engine null, max_tokens $max_tokens, ${duration_s} s per run"
echo "(latency = time to first token; HTTP from wrk, RPC from rpc_loadgen; ms)"
printf '%-5s %5s %12s %9s %9s %9s %9s %7s\n' door conc 'requests/s' p50 p90 p99 max errors
while read -r door c rps p50 p90 p99 max errors; do
  printf '%-5s %5s %12s %9s %9s %9s %9s %7s\n' "$door" "$c" "$rps" "$p50" "$p90" "$p99" "$max" "$errors"
done <"$rows"

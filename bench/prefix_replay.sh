#!/usr/bin/env bash
# Prefix caching through the embedded cluster, behind docs/PERFORMANCE.md
# ("Prefix caching and prefix-aware routing"): for each routing policy, starts
# `exaserve serve` (real CPU engines, the generated tiny model) on free ports,
# replays the Azure conversation trace into it with bench/prefix_replay (open
# loop, multi-turn conversations as token ids), reads the prefix-cache
# counters from /metrics, stops the server, and prints one table.
#
#   bench/prefix_replay.sh
#   POLICIES="least_outstanding prefix_aware" REQUESTS=200 bench/prefix_replay.sh
#
# Environment:
#   BIN_DIR          where exaserve and prefix_replay are (default build/bin)
#   POLICIES         routing policies (default "least_outstanding prefix_aware round_robin")
#   NODES, DEVICES   embedded cluster shape (default 2 x 2); one replica per device
#   REPLICAS         replicas of the model (default NODES x DEVICES)
#   MODEL_FILE       GGUF to serve (default: the generated tiny model); with
#                    it, KV_TOKEN_BYTES = its KV bytes a token (layers x KV
#                    dim x 2 x 2: 16384 for the small preset) and REPLAY_ARGS
#                    sized to its context (small: 2048)
#   KV_TOKEN_BYTES   KV bytes per token (default 256: tiny; required with
#                    MODEL_FILE), for the block size
#   DEVICE_THREADS   engine threads per device ([cluster] device_threads;
#                    default the server's)
#   PREFIX_SLACK_TOKENS, PREFIX_SLACK_RATIO, PREFIX_SLACK_S
#                    prefix_aware's load slack (the deployment's
#                    prefix_slack_tokens / prefix_slack_ratio / prefix_slack_s;
#                    default the server's, 2048, 0.25 and 0.2)
#   KV_PAGE_KB       KV page (default 4: 16-token blocks for tiny, whose token
#                    takes 256 bytes; the server's default 32 KiB gives 128)
#   KV_TOKENS        KV tokens per replica (default 2048: room for the
#                    running requests and a prefix cache that cannot hold
#                    every conversation)
#   REPLAY_ARGS      flags for prefix_replay (default: its defaults: the first
#                    300 rows at 4x, lengths / 4, prompts <= 440, outputs
#                    <= 16, 8 applications with 64-token system prompts)
#   EXASERVE_CACHE   model cache (default /tmp/exacache; tiny is generated there)
#
# The server and the replay share the machine's cores; with 2 cores and 4
# replicas the engines time-share, so TTFT includes waiting for a core.
set -euo pipefail
# MODEL_FILE as given, before the cd below (a relative path is the caller's).
if [ -n "${MODEL_FILE:-}" ]; then
  [ -f "$MODEL_FILE" ] || { echo "prefix_replay: MODEL_FILE $MODEL_FILE not found" >&2; exit 2; }
  MODEL_FILE="$(realpath "$MODEL_FILE")"
  case "$MODEL_FILE" in *'#'*) echo "prefix_replay: MODEL_FILE $MODEL_FILE holds '#', which the server's config reads as a comment" >&2; exit 2 ;; esac
  [ -n "${KV_TOKEN_BYTES:-}" ] || { echo "prefix_replay: with MODEL_FILE, give KV_TOKEN_BYTES (layers x KV dim x 2 x 2; small: 16384)" >&2; exit 2; }
fi
cd "$(dirname "$0")/.."

bin_dir="${BIN_DIR:-build/bin}"
policies="${POLICIES:-least_outstanding prefix_aware round_robin}"
nodes="${NODES:-2}"
devices="${DEVICES:-2}"
replicas="${REPLICAS:-$((nodes * devices))}"
kv_page_kb="${KV_PAGE_KB:-4}"
kv_tokens="${KV_TOKENS:-2048}"
model_file="${MODEL_FILE:-}"
kv_token_bytes="${KV_TOKEN_BYTES:-256}"
device_threads="${DEVICE_THREADS:-}"
model_name=tiny
[ -z "$model_file" ] || model_name=replay
[[ "$kv_token_bytes" =~ ^[1-9][0-9]*$ ]] || { echo "prefix_replay: KV_TOKEN_BYTES must be a positive integer, got '$kv_token_bytes'" >&2; exit 2; }
block_tokens=$((kv_page_kb * 1024 / kv_token_bytes))
[ "$block_tokens" -ge 1 ] || { echo "prefix_replay: KV_PAGE_KB $kv_page_kb holds no token of $kv_token_bytes bytes" >&2; exit 2; }
[ "$block_tokens" -le 256 ] || block_tokens=256
export EXASERVE_CACHE="${EXASERVE_CACHE:-/tmp/exacache}"
export EXASERVE_LOG="${EXASERVE_LOG:-warn}"
ready_timeout_s=120  # the tiny model is generated on first start
stop_timeout_s=15    # the server drains for up to 10 s

for tool in "$bin_dir/exaserve" "$bin_dir/prefix_replay"; do
  [ -x "$tool" ] || { echo "prefix_replay: $tool not built (cmake --build build --target exaserve prefix_replay)" >&2; exit 2; }
done
command -v curl >/dev/null || { echo "prefix_replay: curl not installed" >&2; exit 2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/prefix_replay.XXXXXX")"
server_pid=""
stop_server() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq $((stop_timeout_s * 5))); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  server_pid=""
}
trap 'stop_server; echo "logs: $work" >&2' EXIT
trap 'exit 130' INT TERM

metric() {  # metric FILE SERIES: the series' value, or 0
  grep -F "$2 " "$1" | awk '{print $NF}' | head -1 | grep . || echo 0
}

rows="$work/rows.txt"
: >"$rows"
for policy in $policies; do
  cat >"$work/$policy.conf" <<EOF
[cluster]
nodes = $nodes
devices_per_node = $devices
kv_page_kb = $kv_page_kb
${device_threads:+device_threads = $device_threads}
[deployment $model_name]
${model_file:+model = $model_file}
replicas = $replicas
kv_tokens = $kv_tokens
routing = $policy
${PREFIX_SLACK_TOKENS:+prefix_slack_tokens = $PREFIX_SLACK_TOKENS}
${PREFIX_SLACK_RATIO:+prefix_slack_ratio = $PREFIX_SLACK_RATIO}
${PREFIX_SLACK_S:+prefix_slack_s = $PREFIX_SLACK_S}
EOF
  "$bin_dir/exaserve" serve --config "$work/$policy.conf" --http-port 0 --rpc-port 0 \
    >"$work/$policy.banner" 2>"$work/$policy.server.log" </dev/null &
  server_pid=$!
  http_url="" rpc_addr=""
  for _ in $(seq $((ready_timeout_s * 5))); do
    kill -0 "$server_pid" 2>/dev/null || { echo "prefix_replay: server exited; see $work/$policy.server.log" >&2; exit 1; }
    http_url="$(grep -o 'HTTP (OpenAI-compatible): http://[0-9.]*:[0-9]*' "$work/$policy.banner" | grep -o 'http://.*' || true)"
    rpc_addr="$(grep 'Proto RPC:' "$work/$policy.banner" | grep -oE '[0-9][0-9.]*:[0-9]+' | head -1 || true)"
    if [ -n "$http_url" ] && [ -n "$rpc_addr" ] && curl -sf --max-time 2 "$http_url/readyz" >/dev/null; then break; fi
    http_url=""
    sleep 0.2
  done
  [ -n "$http_url" ] || { echo "prefix_replay: not ready after ${ready_timeout_s} s; see $work/$policy.server.log" >&2; exit 1; }
  # Every replica ready, not just one: the replay's first requests must have
  # all of them to choose from.
  for _ in $(seq $((ready_timeout_s * 5))); do
    curl -sf --max-time 2 "$http_url/metrics" >"$work/$policy.metrics" || true
    [ "$(metric "$work/$policy.metrics" 'exaserve_replicas{state="ready"}')" = "$replicas" ] && break
    sleep 0.2
  done
  echo "== $policy: $replicas replicas of ${model_file:-tiny} on $nodes x $devices, ${block_tokens}-token KV blocks, kv_tokens $kv_tokens" >&2
  # shellcheck disable=SC2086 # REPLAY_ARGS is a list of flags
  "$bin_dir/prefix_replay" --connect "$rpc_addr" --replicas "$replicas" --block-tokens "$block_tokens" \
    --model "$model_name" \
    ${REPLAY_ARGS:-} --json >"$work/$policy.json"
  cat "$work/$policy.json" >&2
  # The replicas add their engines' counters at each load report.
  sleep 1
  curl -sf --max-time 5 "$http_url/metrics" >"$work/$policy.metrics"
  lookup="$(metric "$work/$policy.metrics" "exaserve_prefix_cache_lookup_tokens_total{model=\"$model_name\"}")"
  hit="$(metric "$work/$policy.metrics" "exaserve_prefix_cache_hit_tokens_total{model=\"$model_name\"}")"
  evicted="$(metric "$work/$policy.metrics" "exaserve_prefix_cache_evicted_blocks_total{model=\"$model_name\"}")"
  evicted_miss="$(metric "$work/$policy.metrics" "exaserve_prefix_cache_evicted_miss_tokens_total{model=\"$model_name\"}")"
  stop_server
  echo "$policy $lookup $hit ${evicted:-0} ${evicted_miss:-0} $(cat "$work/$policy.json")" >>"$rows"
done

field() { grep -o "\"$1\":[^,}]*" <<<"$2" | head -1 | cut -d: -f2 | tr -d '"'; }
echo
echo "Prefix replay: $replicas replicas of ${model_file:-tiny} ($nodes nodes x $devices devices), ${block_tokens}-token blocks, kv_tokens $kv_tokens"
echo "replay: ${REPLAY_ARGS:-defaults}   (TTFT: client, sent -> first token)"
printf '%-18s %5s %8s %8s %7s %9s %8s %9s %9s %12s %s\n' policy req prompt cached 'hit %' reusable prefill \
  'ttft p50' 'ttft p99' 'max/mean' 'metrics hit/lookup, evicted blocks, missed tokens evicted lately'
while read -r policy lookup hit evicted evicted_miss json; do
  max="$(field requests_per_replica_max "$json")" mean="$(field requests_per_replica_mean "$json")"
  printf '%-18s %5s %8s %8s %7s %9s %8s %9s %9s %12s %s\n' "$policy" "$(field requests "$json")" \
    "$(field prompt_tokens "$json")" "$(field cached_tokens "$json")" "$(field hit_percent "$json")" \
    "$(field reusable_tokens "$json")" "$(field prefill_tokens "$json")" \
    "$(grep -o '"ttft_ms":{[^}]*}' <<<"$json" | grep -o '"p50":[0-9.]*' | cut -d: -f2)" \
    "$(grep -o '"ttft_ms":{[^}]*}' <<<"$json" | grep -o '"p99":[0-9.]*' | cut -d: -f2)" \
    "$max/$mean" "$hit/$lookup, $evicted, $evicted_miss"
  err="$(field errors "$json")"
  [ "$err" = 0 ] || echo "  $policy: $err errors: $(field first_error "$json")"
done <"$rows"

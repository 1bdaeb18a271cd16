#!/usr/bin/env bash
# How many real node processes this machine holds with the control plane
# steady: a controller, NODES node processes of 12 null-engine replicas each
# (4 devices x 3), one gateway, all on loopback. Prints memory per node
# process, controller CPU at steady state, time from start to every replica
# ready, and detection and recovery after kill -9 of KILL node processes at
# once (a rack). Every process it starts is killed on exit.
#
#   scripts/scale_processes.sh [NODES=256] [KILL=16]      (KEEP=1 keeps the logs)
set -euo pipefail
nodes=${1:-256}
kill_n=${2:-16}
bin=${EXASERVE_BIN:-build/bin}
dir=$(mktemp -d /tmp/exa-scale-XXXXXX)
port=$((17000 + RANDOM % 2000))
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # The logs stay only when asked for (KEEP=1), for a look at what happened.
  if [ "${KEEP:-0}" = 1 ]; then echo "scale: logs kept in $dir"; else rm -rf "$dir"; fi
}
trap cleanup EXIT
ulimit -n 65536 2>/dev/null || true

replicas=$((nodes * 12))
cat >"$dir/cluster.ini" <<EOF
[cluster]
engine = null
[deployment tiny]
replicas = $replicas
EOF
now() { date +%s.%N; }
secs_of_day() {  # "2026-12-01T10:00:41.498 ..." -> seconds since midnight
  awk '{ split(substr($1, 12), t, ":"); print t[1] * 3600 + t[2] * 60 + t[3] }'
}
ready_count() {
  "$bin/exaserve-cli" --connect "127.0.0.1:$rpc" status 2>/dev/null |
    awk '/^DEPLOYMENTS/ { d = 1; next } d && $1 == "tiny" { split($3, r, "/"); print r[1]; exit }'
}

t_start=$(now)
"$bin/exaserve" controller --listen "127.0.0.1:$port" --config "$dir/cluster.ini" --state-dir "$dir/state" \
  --wait-nodes "$nodes" >"$dir/controller.out" 2>"$dir/controller.err" &
controller=$!
pids+=("$controller")
for _ in $(seq 100); do grep -q listening "$dir/controller.out" 2>/dev/null && break; sleep 0.1; done
for i in $(seq 1 "$nodes"); do
  EXASERVE_LOG=warn "$bin/exaserve" node --join "127.0.0.1:$port" --node-id "$i" --rack $(((i - 1) / kill_n)) \
    --devices 4 --engine null >"$dir/node-$i.out" 2>"$dir/node-$i.err" &
  pids+=("$!")
done
"$bin/exaserve" gateway --join "127.0.0.1:$port" --http-port 0 --rpc-port 0 >"$dir/gateway.out" 2>"$dir/gateway.err" &
pids+=("$!")
for _ in $(seq 300); do grep -q "serving HTTP" "$dir/gateway.out" 2>/dev/null && break; sleep 0.1; done
rpc=$(grep -o 'RPC on [0-9.]*:[0-9]*' "$dir/gateway.out" | cut -d: -f2)

echo "scale: $nodes node processes x 12 replicas = $replicas; waiting for all ready (dir $dir)"
deadline=$(($(date +%s) + 600))
while [ "$(ready_count)" != "$replicas" ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "scale: not all ready after 600 s: $(ready_count)/$replicas" >&2; exit 1; }
  sleep 0.5
done
t_ready=$(now)

sleep 5  # settle
ticks() { awk '{ print $14 + $15 }' "/proc/$controller/stat"; }
hz=$(getconf CLK_TCK)
c0=$(ticks); w0=$(now); sleep 10; c1=$(ticks); w1=$(now)
controller_cpu=$(echo "($c1 - $c0) / $hz / ($w1 - $w0) * 100" | bc -l)
rss_nodes=0
for p in "${pids[@]:1:$nodes}"; do
  rss_nodes=$((rss_nodes + $(awk '/VmRSS/ { print $2 }' "/proc/$p/status")))
done
rss_controller=$(awk '/VmRSS/ { print $2 }' "/proc/$controller/status")
rss_gateway=$(awk '/VmRSS/ { print $2 }' "/proc/${pids[-1]}/status")

# A rack: the first KILL node processes, at once.
t_kill=$(now)
for p in "${pids[@]:1:$kill_n}"; do kill -9 "$p"; done
kill_sod=$(date -d "@${t_kill%.*}" +%H:%M:%S | awk -F: '{ print $1 * 3600 + $2 * 60 + $3 }').${t_kill#*.}
while [ "$(grep -c 'event=node_lost' "$dir/controller.err")" -lt "$kill_n" ]; do sleep 0.05; done
last_lost=$(grep 'event=node_lost' "$dir/controller.err" | tail -1 | secs_of_day)
deadline=$(($(date +%s) + 600))
sleep 0.5
while [ "$(ready_count)" != "$replicas" ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "scale: not recovered after 600 s" >&2; exit 1; }
  sleep 0.2
done
t_recovered=$(now)

printf 'nodes %d, replicas %d, cpu %s (%d cores)\n' "$nodes" "$replicas" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" "$(nproc)"
printf 'start to all ready            %.1f s\n' "$(echo "$t_ready - $t_start" | bc -l)"
printf 'memory per node process       %.1f MiB (RSS, mean of %d)\n' "$(echo "$rss_nodes / $nodes / 1024" | bc -l)" "$nodes"
printf 'controller RSS / gateway RSS  %.1f / %.1f MiB\n' "$(echo "$rss_controller / 1024" | bc -l)" \
  "$(echo "$rss_gateway / 1024" | bc -l)"
printf 'controller CPU, steady        %.1f %% of one core\n' "$controller_cpu"
printf 'heartbeats to the controller  %.0f /s (every 2 s per node), plus transport keep-alives %d /s each way (every 1 s per connection)\n' \
  "$(echo "$nodes / 2" | bc -l)" "$nodes"
printf 'kill -9 of %d nodes: all detected after %.3f s, all %d replicas ready again after %.2f s\n' "$kill_n" \
  "$(echo "$last_lost - $kill_sod" | bc -l)" "$replicas" "$(echo "$t_recovered - $t_kill" | bc -l)"

#!/usr/bin/env bash
# Two builds of the engine against each other, as simultaneous pairs: each
# round starts `OLD bench-engine ARGS` and `NEW bench-engine ARGS` at the same
# moment, each pinned to cores of its own, swaps the cores every round and who
# starts first every two.
# A slow phase of the host (another tenant, the memory's hour) then hits both
# sides of a pair alike, which alternating runs cannot promise: on the hosts
# of docs/PERFORMANCE.md the same binary against itself read 0.98-1.02 this
# way one evening (0.86-1.14 alternated), single rounds 0.85-1.07 with medians
# 0.99-1.03 another. Run it once with the same binary twice to see this
# host's spread before reading a ratio, and read medians of several rounds.
#
#   bench/ab_pairs.sh [--rounds N] [--threads T] [--raw FILE] OLD NEW -- BENCH-ENGINE-ARGS...
#
#   OLD, NEW   exaserve binaries (copy one aside before rebuilding)
#   --rounds   pairs to run (default 4; a multiple of 4 gives each side each core set,
#              and the first start, equally often)
#   --threads  engine threads per side (default 1); the host needs 2 × T cores
#   --raw      also append each run's JSON line, tagged old/new and round, to FILE
#   after --   bench-engine's arguments: at least --model FILE; --threads, --json,
#              --repeat and --no-copy-bandwidth are set here (one repetition each, no
#              machine probes, which would measure the other side's load)
#
# Prints each round's ratios new / old (prefill, and decode per batch size),
# then each metric's median and min-max. Example (batch 8 at context 1,024):
#   bench/ab_pairs.sh /tmp/exaserve.old build/bin/exaserve -- \
#     --model ~/.cache/exaserve/models/small-q8_0-seed1-a64.gguf --batches 8 \
#     --decode-prompt 1024 --decode-steps 16 --prefill-tokens 16
set -euo pipefail

rounds=4
threads=1
raw=""
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
value() {  # the value of option $1, which must have one
  [[ $# -ge 2 && -n "$2" ]] || { echo "ab_pairs.sh: $1 needs a value" >&2; exit 2; }
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) value "$@"; rounds="$2"; shift 2 ;;
    --threads) value "$@"; threads="$2"; shift 2 ;;
    --raw) value "$@"; raw="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    --) break ;;
    -*) echo "ab_pairs.sh: unknown option '$1'" >&2; usage ;;
    *) break ;;
  esac
done
[[ $# -ge 3 && "$3" == "--" ]] || { echo "ab_pairs.sh: expected OLD NEW -- BENCH-ENGINE-ARGS" >&2; usage; }
old="$1"; new="$2"; shift 3
for n in "$rounds" "$threads"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "ab_pairs.sh: --rounds and --threads take positive integers, got '$n'" >&2; exit 2; }
done
for b in "$old" "$new"; do
  [[ -x "$b" ]] || { echo "ab_pairs.sh: '$b' is not an executable exaserve binary" >&2; exit 2; }
done
for a in "$@"; do
  case "$a" in
    --threads|--json|--repeat|--no-copy-bandwidth)
      echo "ab_pairs.sh: '$a' is set by the script; leave it out of the bench-engine arguments" >&2; exit 2 ;;
  esac
done
[[ " $* " == *" --model "* ]] || { echo "ab_pairs.sh: the bench-engine arguments need --model FILE" >&2; exit 2; }
command -v python3 >/dev/null || { echo "ab_pairs.sh: python3 is needed for the summary" >&2; exit 1; }
command -v taskset >/dev/null || { echo "ab_pairs.sh: taskset (util-linux) is needed to pin each side" >&2; exit 1; }
# The CPUs this process may use (a cpuset need not start at 0), the first
# 2 × T of them split between the sides.
mapfile -t cpus < <(python3 -c 'import os; print("\n".join(map(str, sorted(os.sched_getaffinity(0)))))')
(( ${#cpus[@]} >= 2 * threads )) || {
  echo "ab_pairs.sh: $threads threads a side need $((2 * threads)) CPUs, this process may use ${#cpus[@]}" >&2; exit 2; }
join() { local IFS=,; echo "$*"; }

work="$(mktemp -d)"
pids=()
cleanup() {
  for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

set_a="$(join "${cpus[@]:0:threads}")"
set_b="$(join "${cpus[@]:threads:threads}")"
: > "$work/rounds.jsonl"
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then c_old="$set_a"; c_new="$set_b"; else c_old="$set_b"; c_new="$set_a"; fi
  pids=()
  # Each run is bounded: a hung build must not hold the host. Who starts
  # first alternates every two rounds, so neither side always has the head
  # start (its load and short first phases ahead of the other's).
  start_old() {
    timeout 1800 taskset -c "$c_old" "$old" bench-engine "$@" --threads "$threads" --repeat 1 --no-copy-bandwidth --json \
      > "$work/old.json" 2> "$work/old.err" &
    pid_old=$!
  }
  start_new() {
    timeout 1800 taskset -c "$c_new" "$new" bench-engine "$@" --threads "$threads" --repeat 1 --no-copy-bandwidth --json \
      > "$work/new.json" 2> "$work/new.err" &
    pid_new=$!
  }
  if ((((r - 1) / 2) % 2 == 0)); then start_old "$@"; start_new "$@"; else start_new "$@"; start_old "$@"; fi
  pids=("$pid_old" "$pid_new")
  # The first side to fail stops the other: no waiting out its timeout.
  status=0
  first=""
  if ! wait -n -p first "${pids[@]}"; then status=1; fi
  other="${pids[0]}"
  [[ "$first" == "$other" ]] && other="${pids[1]}"
  if ((status != 0)); then kill "$other" 2>/dev/null || true; fi
  wait "$other" || status=1
  pids=()
  if ((status != 0)); then
    echo "ab_pairs.sh: round $r failed; the last lines of each side's log:" >&2
    tail -n 5 "$work/old.err" "$work/new.err" >&2
    exit 1
  fi
  if [[ -n "$raw" ]]; then
    printf '{"round":%d,"side":"old","cores":"%s","run":%s}\n' "$r" "$c_old" "$(cat "$work/old.json")" >> "$raw"
    printf '{"round":%d,"side":"new","cores":"%s","run":%s}\n' "$r" "$c_new" "$(cat "$work/new.json")" >> "$raw"
  fi
  python3 - "$work/old.json" "$work/new.json" "$r" "$c_new" >> "$work/rounds.jsonl" <<'EOF'
import json, sys
old, new = (json.load(open(p)) for p in sys.argv[1:3])
ratio = lambda n, o: n / o if o > 0 else float("nan")  # a phase that measured nothing
ratios = {"prefill": ratio(new["prefill_tok_s"], old["prefill_tok_s"])}
for o, n in zip(old["decode"], new["decode"]):
    ratios["batch %d" % o["batch"]] = ratio(n["tok_s"], o["tok_s"])
print(json.dumps({"round": int(sys.argv[3]), "new_cores": sys.argv[4], "ratios": ratios,
                  "old": {"prefill": old["prefill_tok_s"], **{"batch %d" % d["batch"]: d["tok_s"] for d in old["decode"]}},
                  "new": {"prefill": new["prefill_tok_s"], **{"batch %d" % d["batch"]: d["tok_s"] for d in new["decode"]}}}))
EOF
  python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).read().splitlines()[-1])
print("round %d (new on cores %s): " % (r["round"], r["new_cores"]) +
      "  ".join("%s %.1f / %.1f = %.3f" % (k, r["new"][k], r["old"][k], v) for k, v in r["ratios"].items()), flush=True)
' "$work/rounds.jsonl"
done

python3 - "$work/rounds.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print()
print("| metric | new / old, median | min-max | rounds |")
print("| --- | --- | --- | --- |")
for k in rows[0]["ratios"]:
    xs = [r["ratios"][k] for r in rows]
    print("| %s | %.3f | %.3f-%.3f | %d |" % (k, statistics.median(xs), min(xs), max(xs), len(xs)))
EOF

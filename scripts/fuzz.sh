#!/usr/bin/env bash
# A longer fuzzing campaign of the HTTP front door and the JSON body decoder
# than ctest's (600 HTTP and 12,000 JSON mutations, seed 1).
#   scripts/fuzz.sh [ITERATIONS] [FIRST_SEED] [SEEDS]
# Inputs that fail are kept in build/test-tmp/fuzz-failures/; copy the ones
# worth keeping into tests/integration/fuzz-corpus/{http,json}/.
set -euo pipefail
cd "$(dirname "$0")/.."
iterations=${1:-20000}
first=${2:-2}
seeds=${3:-4}
cmake --build build --target integration_test
for ((s = first; s < first + seeds; s++)); do
  echo "== seed $s, $iterations iterations"
  EXA_FUZZ_ITERATIONS=$iterations EXA_FUZZ_SEED=$s build/bin/integration_test "[fuzz]" | tail -2
done

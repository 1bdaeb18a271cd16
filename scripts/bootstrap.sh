#!/usr/bin/env bash
# Installs the Debian packages ExaServe builds against. Idempotent: silent when
# everything is present, one line per missing package otherwise, and a clear
# message (non-zero exit) when it cannot install them.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache
  libcaf-dev            # CAF 0.17: actors, middleman, OpenSSL module
  libssl-dev            # OpenSSL: exaserve gen-certs
  capnproto libcapnp-dev # Cap'n Proto 0.9 + KJ async/HTTP
  libspdlog-dev libfmt-dev
  nlohmann-json3-dev    # JSON for the HTTP front door
  libpcre2-dev          # PCRE2: the regexes of byte-level BPE pre-tokenizers (Unicode properties)
  wrk                   # HTTP load generator for the serving benchmark
  catch2                # Catch2 v2: tests
  libbenchmark-dev      # Google Benchmark: bench/
  iproute2              # ip netns, veth and tc netem: partitions in the multi-process tests
  curl                  # HTTPS client of the front-door TLS tests
  prometheus            # promtool (alert rules) and the server the metrics integration test scrapes with
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "bootstrap: installing missing packages: ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "bootstrap: cannot install ${missing[*]}: not root and no sudo." >&2
  echo "bootstrap: install them with: apt-get install ${missing[*]}" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
if ! { "${as_root[@]}" apt-get update -qq && \
       "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  echo "bootstrap: apt-get failed installing ${missing[*]}; last lines:" >&2
  tail -20 "$log" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
echo "bootstrap: done"

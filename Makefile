# The two commands that matter: `make run` and `make test`. Both set up what
# they need (Debian packages via scripts/bootstrap.sh), configure and build.

BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
CTEST_FLAGS ?=

.PHONY: all setup configure build run test bench bench-llamacpp bench-speculative bench-prefix bench-all clean help

all: build

help:
	@echo "make run    - set up, build and start the main job"
	@echo "make test   - set up, build and run every test"
	@echo "make build  - build into $(BUILD_DIR)/bin"
	@echo "make bench  - engine benchmark on the small preset (see docs/PERFORMANCE.md)"
	@echo "make bench-llamacpp    - batch-1 decode and prefill against llama.cpp, same files, one run"
	@echo "make bench-speculative - speculative decoding: acceptance and speedup by draft agreement and k"
	@echo "make bench-prefix      - prefix caching and routing: the simulator's two scenarios, then the embedded cluster"
	@echo "make bench-all         - every benchmark above, in that order (long: see each script's header for a shorter run)"

setup:
	@scripts/bootstrap.sh

$(BUILD_DIR)/build.ninja: | setup
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

configure: setup $(BUILD_DIR)/build.ninja

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

run: build
	@$(BUILD_DIR)/bin/exaserve serve --no-auth

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) $(CTEST_FLAGS)

bench: build
	@BIN_DIR=$(BUILD_DIR)/bin scripts/bench_engine.sh

# The other sections of docs/PERFORMANCE.md, each with its own script; the
# scripts take options for the variants the document names.
bench-llamacpp: build
	@bench/vs_llamacpp.sh --exaserve $(BUILD_DIR)/bin/exaserve

bench-speculative: build
	@BIN_DIR=$(BUILD_DIR)/bin scripts/bench_speculative.sh

bench-prefix: build
	@$(BUILD_DIR)/bin/exaserve sim prefix
	@$(BUILD_DIR)/bin/exaserve sim prefix_many
	@BIN_DIR=$(BUILD_DIR)/bin bench/prefix_replay.sh

# One after another even under make -j: benchmarks side by side would time
# each other.
bench-all: build
	@$(MAKE) --no-print-directory bench
	@$(MAKE) --no-print-directory bench-llamacpp
	@$(MAKE) --no-print-directory bench-speculative
	@$(MAKE) --no-print-directory bench-prefix

clean:
	@rm -rf $(BUILD_DIR)

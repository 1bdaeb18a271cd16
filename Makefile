# The two commands that matter: `make run` and `make test`. Both set up what
# they need (Debian packages via scripts/bootstrap.sh), configure and build.

BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
CTEST_FLAGS ?=

.PHONY: all setup configure build run test bench clean help

all: build

help:
	@echo "make run    - set up, build and start the main job"
	@echo "make test   - set up, build and run every test"
	@echo "make build  - build into $(BUILD_DIR)/bin"
	@echo "make bench  - engine benchmark on the small preset (see docs/PERFORMANCE.md)"

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
	@scripts/bench_engine.sh

clean:
	@rm -rf $(BUILD_DIR)

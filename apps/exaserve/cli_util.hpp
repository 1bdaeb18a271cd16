#pragma once
// Small helpers shared by the subcommands: error reporting, the model cache
// directory, and the default model.

#include <string>
#include <string_view>

#include "common/error.hpp"

namespace exa::app {

/// Prints "exaserve <command>: <code>: <message>" to stderr; returns 1 (or 2
/// for usage errors) for use as an exit status.
int fail(const char* command, const error& e);

/// Where generated default models live: $EXASERVE_CACHE, else
/// $XDG_CACHE_HOME/exaserve, else ~/.cache/exaserve (created if missing).
expected<std::string> cache_dir();

/// `s` as a JSON string literal, quotes included.
std::string json_string(std::string_view s);

/// Chooses the engine's kernel variant (isa.hpp) from EXA_ENGINE_ISA, or the
/// best the CPU supports, and logs it with the CPU's features. An unknown or
/// unsupported EXA_ENGINE_ISA is an error (a misconfigured node should not
/// start on another path than asked).
expected<void> init_engine_isa();

/// Path of the default model (the `tiny` preset, f32, seed 1), generating it
/// on first use.
expected<std::string> default_model_path();

}  // namespace exa::app

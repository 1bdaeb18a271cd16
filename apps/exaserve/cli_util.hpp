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

/// Path of the default model (the `tiny` preset, f32, seed 1), generating it
/// on first use.
expected<std::string> default_model_path();

}  // namespace exa::app

#pragma once
// What a deployment serves: a GGUF file, or (in simulation) a published model
// shape -- "preset:llama-2-13b:int4" or "preset:llama-2-13b:int4:ctx=16384" --
// for which no weights exist and the simulated engine's cost model stands in.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cluster/model_shape.hpp"
#include "common/error.hpp"

namespace exa::cluster {

struct model_ref {
  std::string file;                   // a GGUF path, when not a preset
  std::optional<model_shape> preset;  // the shape, for "preset:..." references

  bool is_preset() const noexcept { return preset.has_value(); }
};

/// Parses a reference. Errors name the bad part (unknown preset or precision,
/// a bad context override).
expected<model_ref> parse_model_ref(std::string_view text);

/// "preset:NAME:PRECISION[:ctx=N]".
std::string preset_ref(std::string_view name, precision p, std::optional<std::uint32_t> context_length = {});

}  // namespace exa::cluster

#include "gpu/device.hpp"

#include "common/assert.hpp"

#include <algorithm>
#include "engine/speculative.hpp"
#include "gpu/device_engine.hpp"
#include "model/llama_model.hpp"

namespace exa::gpu {

std::string_view to_string(device_kind kind) noexcept {
  switch (kind) {
    case device_kind::cpu: return "cpu";
    case device_kind::cuda: return "cuda";
  }
  return "unknown";
}

expected<engine::cpu_engine_config> paged_kv_config(std::size_t token_bytes, std::size_t page_bytes,
                                                    std::uint32_t kv_tokens) {
  if (token_bytes == 0 || token_bytes > page_bytes)
    return make_error(errc::invalid_argument, "a KV page of " + std::to_string(page_bytes) +
                                                  " bytes cannot hold one token of this model (" +
                                                  std::to_string(token_bytes) + " bytes); raise the page size");
  engine::cpu_engine_config ec;
  ec.kv_block_tokens = static_cast<std::uint32_t>(std::min<std::size_t>(256, page_bytes / token_bytes));
  ec.kv_max_blocks = (kv_tokens + ec.kv_block_tokens - 1) / ec.kv_block_tokens;
  return ec;
}

expected<std::uint32_t> checked_draft_tokens(const model::llama_model& target, const engine_options& options) {
  EXA_ASSERT_MSG(options.draft != nullptr, "checked_draft_tokens without a draft");
  const auto k = options.draft_tokens ? options.draft_tokens : engine::default_draft_tokens;
  if (auto ok = engine::check_draft(target, *options.draft, k); !ok) return std::unexpected(ok.error());
  return k;
}

}  // namespace exa::gpu

#pragma once
// Helpers every device's engine factory shares: an engine that keeps its
// device alive, and the draft-model check.

#include <memory>
#include <utility>

#include "engine/cpu_engine.hpp"
#include "gpu/device.hpp"

namespace exa::gpu {

/// `Engine` built in place beside a reference to its device, which is
/// destroyed after it: the pool its KV blocks return to, the threads or
/// stream it runs on, outlive every engine of the device.
template <class Engine, class... Args>
std::shared_ptr<engine::inference_engine> bind_to_device(std::shared_ptr<device> dev, Args&&... args) {
  struct bound {
    std::shared_ptr<device> keep;  // first member: destroyed last
    Engine engine;
    bound(std::shared_ptr<device> d, Args&&... a) : keep(std::move(d)), engine(std::forward<Args>(a)...) {}
  };
  auto holder = std::make_shared<bound>(std::move(dev), std::forward<Args>(args)...);
  return std::shared_ptr<engine::inference_engine>(holder, &holder->engine);
}

/// The same for an engine made elsewhere (a factory that returns it).
inline std::shared_ptr<engine::inference_engine> bind_to_device(std::shared_ptr<device> dev,
                                                                std::unique_ptr<engine::inference_engine> made) {
  struct bound {
    std::shared_ptr<device> keep;  // first member: destroyed last
    std::unique_ptr<engine::inference_engine> engine;
  };
  auto holder = std::make_shared<bound>(bound{std::move(dev), std::move(made)});
  return std::shared_ptr<engine::inference_engine>(holder, holder->engine.get());
}

/// The engine's KV paging on a device whose pages hold `page_bytes`, for a
/// model of which one token's K and V take `token_bytes`: as many tokens
/// per block as a page holds (at most 256), and the replica's share of the
/// pool for `kv_tokens` (0: the whole pool). invalid_argument when a page
/// cannot hold one token.
expected<engine::cpu_engine_config> paged_kv_config(std::size_t token_bytes, std::size_t page_bytes,
                                                    std::uint32_t kv_tokens);

/// The draft's tokens per step (options.draft_tokens, or the default) after
/// checking the draft fits `target` (engine::check_draft). Needs options.draft.
expected<std::uint32_t> checked_draft_tokens(const model::llama_model& target, const engine_options& options);

}  // namespace exa::gpu

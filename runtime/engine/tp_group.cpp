#include "engine/tp_group.hpp"

#include "common/assert.hpp"

namespace exa::engine {

tp_group::tp_group(const model::llama_config& config, std::vector<member> members, resident_options resident)
    : members_(std::move(members)), errors_(members_.size()), scratch_(members_.size()) {
  EXA_ASSERT(!members_.empty());
  for (std::size_t r = 0; r < members_.size(); ++r) {
    member& m = members_[r];
    EXA_ASSERT(m.threads != nullptr && m.comm != nullptr);
    EXA_ASSERT_MSG(m.comm->rank() == static_cast<int>(r) && m.comm->size() == static_cast<int>(members_.size()),
                   "a member's communicator rank or size differs from its place in the group");
    EXA_ASSERT(m.weights.rank() == r && m.weights.size() == members_.size());
    for (std::size_t o = 0; o < r; ++o)
      EXA_ASSERT_MSG(members_[o].threads != m.threads, "two members share a thread_pool");
    forwards_.push_back(
        std::make_unique<llama_forward>(config, m.weights.weights(), m.pages, *m.threads, *m.comm, resident));
    comms_.push_back(m.comm);
  }
  start_drivers();
}

tp_group::tp_group(std::vector<std::unique_ptr<forward_executor>> forwards,
                   std::vector<std::shared_ptr<communicator>> comms)
    : forwards_(std::move(forwards)), comms_(std::move(comms)), errors_(forwards_.size()), scratch_(forwards_.size()) {
  EXA_ASSERT(!forwards_.empty() && comms_.size() == forwards_.size());
  for (std::size_t r = 0; r < forwards_.size(); ++r) {
    EXA_ASSERT(forwards_[r] != nullptr && comms_[r] != nullptr);
    EXA_ASSERT_MSG(comms_[r]->rank() == static_cast<int>(r) && comms_[r]->size() == static_cast<int>(forwards_.size()),
                   "a member's communicator rank or size differs from its place in the group");
  }
  start_drivers();
}

resident_memory tp_group::weights_memory() const noexcept {
  resident_memory sum;
  sum.huge_pages = true;
  for (const auto& f : forwards_) {
    const resident_memory m = f->weights_memory();
    sum.bytes += m.bytes;
    sum.copies += m.copies;
    sum.huge_pages = sum.huge_pages && m.huge_pages;
  }
  sum.huge_pages = sum.huge_pages && sum.copies > 0;
  return sum;
}

void tp_group::start_drivers() {
  drivers_.reserve(forwards_.size() - 1);
  for (std::size_t r = 1; r < forwards_.size(); ++r) drivers_.emplace_back([this, r] { drive(r); });
}

tp_group::~tp_group() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (auto& t : drivers_) t.join();
}

void tp_group::run_member(std::size_t r, std::vector<float>& logits) {
  auto ok = forwards_[r]->execute(*batch_, logits);
  if (ok) return;
  // Release the members still waiting in a collective now, not at the timeout.
  comms_[r]->abort("tensor-parallel member " + std::to_string(r) + " failed: " + ok.error().message);
  errors_[r] = std::move(ok.error());
}

void tp_group::drive(std::size_t r) {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    run_member(r, scratch_[r]);
    std::lock_guard lock(mutex_);
    if (--running_ == 0) done_.notify_one();
  }
}

expected<void> tp_group::execute(const forward_batch& batch, std::vector<float>& logits) {
  for (auto& e : errors_) e.reset();
  {
    std::lock_guard lock(mutex_);
    EXA_ASSERT_MSG(running_ == 0, "tp_group::execute is not reentrant");
    batch_ = &batch;
    running_ = drivers_.size();
    ++generation_;
  }
  start_.notify_all();
  run_member(0, logits);
  {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return running_ == 0; });
    batch_ = nullptr;
  }
  for (auto& e : errors_)
    if (e) {
      logits.clear();
      return make_error(errc::unavailable, e->message);
    }
  return {};
}

}  // namespace exa::engine

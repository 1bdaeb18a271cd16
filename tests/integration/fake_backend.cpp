#include <fmt/format.h>

#include "fake_backend.hpp"

#include <algorithm>

namespace exa::test {

fake_output fake_complete(const api::generate_request& request) {
  fake_output out;
  std::vector<api::token_id> source;
  std::string source_text;
  // The fake has no model and so no chat template: it joins the messages as
  // "role: content\n" (real backends render the model's template).
  std::optional<std::string> text = request.prompt_text;
  if (request.messages) {
    text.emplace();
    for (const auto& m : *request.messages) *text += m.role + ": " + m.content + "\n";
  }
  if (text) {
    for (auto it = text->rbegin(); it != text->rend(); ++it) {
      source.push_back(static_cast<unsigned char>(*it));
      source_text.push_back(*it);
    }
    out.prompt_tokens = static_cast<std::uint32_t>(text->size());
  } else if (request.prompt_ids) {
    for (auto it = request.prompt_ids->rbegin(); it != request.prompt_ids->rend(); ++it) {
      source.push_back(*it);
      source_text.push_back(static_cast<char>('a' + *it % 26));
    }
    out.prompt_tokens = static_cast<std::uint32_t>(request.prompt_ids->size());
  }
  if (source.empty() && request.ignore_eos) {
    source.push_back('.');
    source_text.push_back('.');
  }
  for (std::uint32_t i = 0; i < request.max_tokens; ++i) {
    if (i >= source.size() && !request.ignore_eos) break;  // end of sequence
    out.tokens.push_back(source[i % source.size()]);
    out.text.push_back(source_text[i % source.size()]);
  }
  out.reason = out.tokens.size() == request.max_tokens ? api::finish_reason::length : api::finish_reason::stop;
  // One byte per token, so a text position is a token position.
  std::size_t cut = std::string::npos;
  for (const auto& stop : request.stop) cut = std::min(cut, out.text.find(stop));
  if (cut != std::string::npos) {
    out.text.resize(cut);
    out.tokens.resize(cut);
    out.reason = api::finish_reason::stop;
  }
  if (request.logprobs)
    for (std::size_t i = 0; i < out.tokens.size(); ++i) {
      const float lp = -0.25f * static_cast<float>(i + 1);
      api::token_logprob t{out.tokens[i], std::string(1, out.text[i]), lp, {}};
      for (std::uint32_t k = 0; k < request.top_logprobs; ++k) {
        const api::token_id id = (out.tokens[i] + static_cast<api::token_id>(k)) % 256;
        t.top.push_back({id, std::string(1, static_cast<char>(k == 0 ? out.text[i] : id)), lp - static_cast<float>(k)});
      }
      out.logprobs.push_back(std::move(t));
    }
  return out;
}

struct fake_backend::job {
  api::generate_request request;
  std::shared_ptr<api::stream_sink> sink;
  fake_behavior behavior;
  bool cancelled = false;  // guarded by fake_backend::mu_
};

fake_backend::fake_backend() {
  models_.push_back({"fake", "fake.gguf", 1, 1, 2048});
  // Latency as the gateways saw it over the last minute (for top).
  models_.back().ttft_p50_ms = 12;
  models_.back().ttft_p99_ms = 80;
  models_.back().tpot_p50_ms = 3;
  models_.back().tpot_p99_ms = 9;
  helper_ = std::thread([this] {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stopping_ || !posted_.empty(); });
      if (posted_.empty()) return;
      auto batch = std::move(posted_);
      posted_.clear();
      lock.unlock();
      for (auto& fn : batch) fn();
      lock.lock();
    }
  });
}

fake_backend::~fake_backend() {
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (auto& [id, j] : jobs_) j->cancelled = true;
    threads = std::move(threads_);
  }
  cv_.notify_all();
  for (auto& t : threads) t.join();
  helper_.join();
}

void fake_backend::post(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    posted_.push_back(std::move(fn));
  }
  cv_.notify_all();
}

void fake_backend::set_behavior(const std::string& model, fake_behavior behavior) {
  std::lock_guard lock(mu_);
  behaviors_[model] = behavior;
  if (std::none_of(models_.begin(), models_.end(), [&](const auto& m) { return m.name == model; }))
    models_.push_back({model, model + ".gguf", 1, 1, 2048});
}

void fake_backend::set_ready(bool ready) {
  std::lock_guard lock(mu_);
  ready_ = ready;
}

void fake_backend::set_status_error(std::optional<error> e) {
  std::lock_guard lock(mu_);
  status_error_ = std::move(e);
}

std::vector<api::generate_request> fake_backend::requests() const {
  std::lock_guard lock(mu_);
  return requests_;
}

std::vector<std::string> fake_backend::cancels() const {
  std::lock_guard lock(mu_);
  return cancels_;
}

std::vector<std::string> fake_backend::admin_log() const {
  std::lock_guard lock(mu_);
  return admin_log_;
}

bool fake_backend::wait_for_cancel(const std::string& id, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout,
                      [&] { return std::find(cancels_.begin(), cancels_.end(), id) != cancels_.end(); });
}

bool fake_backend::wait_for_requests(std::size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return requests_.size() >= n; });
}

bool fake_backend::wait_idle(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return active_ == 0; });
}

void fake_backend::generate(api::generate_request request, std::shared_ptr<api::stream_sink> sink) {
  auto j = std::make_shared<job>();
  j->sink = std::move(sink);
  bool known = false;
  {
    std::lock_guard lock(mu_);
    requests_.push_back(request);
    known = std::any_of(models_.begin(), models_.end(), [&](const auto& m) { return m.name == request.model; });
    if (auto it = behaviors_.find(request.model); it != behaviors_.end()) j->behavior = it->second;
    if (!known) j->behavior.refuse = error{errc::not_found, "model '" + request.model + "' is not deployed"};
    j->request = std::move(request);
    jobs_[j->request.request_id] = j;
    ++active_;
  }
  cv_.notify_all();
  if (j->behavior.synchronous) {
    run_job(j);
    return;
  }
  std::lock_guard lock(mu_);
  threads_.emplace_back([this, j] { run_job(j); });
}

void fake_backend::run_job(const std::shared_ptr<job>& j) {
  api::generate_result result;
  const auto& b = j->behavior;
  auto finish = [&] {
    j->sink->on_done(result);
    std::lock_guard lock(mu_);
    jobs_.erase(j->request.request_id);
    --active_;
    cv_.notify_all();
  };
  if (b.refuse) {
    result.reason = api::finish_reason::error;
    result.err = b.refuse;
    return finish();
  }
  const auto out = fake_complete(j->request);
  result.usage.prompt_tokens = out.prompt_tokens;
  result.usage.cached_tokens = std::min(b.cached_tokens, out.prompt_tokens);
  result.replica = j->request.model + "/0";
  for (std::size_t i = 0; i < out.tokens.size(); ++i) {
    {
      std::unique_lock lock(mu_);
      if (b.hang_after && *b.hang_after == i) cv_.wait(lock, [&] { return j->cancelled; });
      if (b.token_delay.count() > 0) cv_.wait_for(lock, b.token_delay, [&] { return j->cancelled; });
      if (j->cancelled) {
        result.reason = api::finish_reason::cancelled;
        lock.unlock();
        return finish();
      }
    }
    if (b.fail_after && *b.fail_after == i) {
      result.reason = api::finish_reason::error;
      result.err = error{errc::internal, "replica fake/0 crashed mid-stream"};
      return finish();
    }
    api::token_chunk chunk{{out.tokens[i]}, std::string(1, out.text[i]), static_cast<std::uint32_t>(i), {}};
    if (!out.logprobs.empty()) chunk.logprobs.push_back(out.logprobs[i]);
    j->sink->on_chunk(chunk);
    ++result.usage.completion_tokens;
  }
  result.reason = out.reason;
  finish();
}

void fake_backend::cancel(const std::string& request_id) {
  {
    std::lock_guard lock(mu_);
    cancels_.push_back(request_id);
    if (auto it = jobs_.find(request_id); it != jobs_.end()) it->second->cancelled = true;
  }
  cv_.notify_all();
}

void fake_backend::models(std::function<void(std::vector<api::model_info>)> done) {
  post([this, done = std::move(done)] {
    std::vector<api::model_info> copy;
    {
      std::lock_guard lock(mu_);
      copy = models_;
    }
    done(std::move(copy));
  });
}

void fake_backend::status(std::function<void(expected<api::cluster_status>)> done) {
  post([this, done = std::move(done)] {
    std::unique_lock lock(mu_);
    if (status_error_) {
      auto e = *status_error_;
      lock.unlock();
      return done(std::unexpected(e));
    }
    api::cluster_status s;
    s.nodes.push_back({0, 0, "healthy", "", 0, "", "eu-west"});  // a region: the cli shows it
    s.devices.push_back({0, 0, "cpu", 8ull << 30, 1ull << 30});
    for (const auto& m : models_)
      for (std::uint32_t r = 0; r < m.replicas_desired; ++r)
        s.replicas.push_back({m.name + "/" + std::to_string(r), m.name, r, 1, "ready", 0, 0, 0, 0, 128, 4096});
    s.models = models_;
    s.rollouts = rollouts_;
    lock.unlock();
    done(std::move(s));
  });
}

void fake_backend::metrics(std::function<void(std::string)> done) {
  post([this, done = std::move(done)] {
    std::size_t n = 0;
    {
      std::lock_guard lock(mu_);
      n = requests_.size();
    }
    done("# TYPE fake_requests_total counter\nfake_requests_total " + std::to_string(n) + "\n");
  });
}

void fake_backend::ready(std::function<void(bool)> done) {
  post([this, done = std::move(done)] {
    bool r = false;
    {
      std::lock_guard lock(mu_);
      r = ready_;
    }
    done(r);
  });
}

void fake_backend::deploy(api::deploy_request request, std::function<void(expected<void>)> done) {
  post([this, request = std::move(request), done = std::move(done)] {
    {
      std::lock_guard lock(mu_);
      admin_log_.push_back("deploy name=" + request.name + " model_file=" + request.model_file +
                           " replicas=" + std::to_string(request.replicas) +
                           " kv_tokens=" + std::to_string(request.kv_tokens) + " routing=" + request.routing +
                           (request.draft_model.empty() ? "" : " draft_model=" + request.draft_model +
                                                                    " draft_sha256=" + request.draft_sha256 +
                                                                    " draft_tokens=" + std::to_string(request.draft_tokens)) +
                           (request.chat_template.empty() ? "" : " chat_template=" + request.chat_template) +
                           (request.routing != "prefix_aware"
                                ? ""
                                : fmt::format(" prefix_slack={}/{}/{}", request.prefix_slack_tokens,
                                              request.prefix_slack_ratio, request.prefix_slack_s)));
      std::erase_if(models_, [&](const auto& m) { return m.name == request.name; });
      const std::string file = request.model_file.empty() ? "default.gguf" : request.model_file;
      api::model_info m{request.name, file, request.replicas, request.replicas, 2048};
      m.routing = request.routing;
      m.prefix_slack_tokens = request.prefix_slack_tokens;
      m.prefix_slack_ratio = request.prefix_slack_ratio;
      m.prefix_slack_s = request.prefix_slack_s;
      models_.push_back(std::move(m));
    }
    done({});
  });
}

void fake_backend::undeploy(std::string name, std::function<void(expected<void>)> done) {
  post([this, name = std::move(name), done = std::move(done)] {
    std::unique_lock lock(mu_);
    admin_log_.push_back("undeploy name=" + name);
    if (std::erase_if(models_, [&](const auto& m) { return m.name == name; }) == 0) {
      lock.unlock();
      return done(std::unexpected(error{errc::not_found, "deployment '" + name + "' does not exist"}));
    }
    lock.unlock();
    done({});
  });
}

// Logs the call; node 0 exists with one replica, nothing else does.
void fake_backend::drain(api::drain_request request, std::function<void(expected<api::drain_result>)> done) {
  post([this, request, done = std::move(done)] {
    const bool node = request.kind == api::drain_request::target::node;
    {
      std::lock_guard lock(mu_);
      admin_log_.push_back(std::string(request.undrain ? "undrain" : "drain") + (node ? " node=" : " replica=") +
                           std::to_string(request.id) + " deadline_ms=" + std::to_string(request.deadline_ms));
    }
    if (request.id != 0)
      return done(std::unexpected(error{errc::not_found, std::string("no ") + (node ? "node " : "replica ") +
                                                             std::to_string(request.id)}));
    done(api::drain_result{request.undrain ? 0u : 1u, request.deadline_ms ? request.deadline_ms : 60000u});
  });
}

void fake_backend::rollout(api::rollout_request request, std::function<void(expected<api::rollout_result>)> done) {
  post([this, request, done = std::move(done)] {
    static constexpr const char* ops[] = {"start", "status", "pause", "resume", "abort", "promote"};
    {
      std::lock_guard lock(mu_);
      admin_log_.push_back(fmt::format("rollout {} name={} file={} version={} steps={} bake_s={} max_unavailable={} "
                                       "surge={} min_samples={}",
                                       ops[static_cast<int>(request.what)], request.name, request.model_file,
                                       request.version, request.steps, request.bake_s, request.max_unavailable,
                                       request.surge, request.min_samples));
    }
    if (request.name != "tiny")
      return done(std::unexpected(error{errc::not_found, "no deployment named '" + request.name + "'"}));
    const std::string line = "in_progress step 1/3 split 1=99% 2=1% verdict none yet";
    {
      std::lock_guard lock(mu_);
      rollouts_ = {{request.name, line}};
    }
    done(api::rollout_result{line});
  });
}

void fake_backend::scale(std::string name, std::uint32_t replicas, std::function<void(expected<void>)> done) {
  post([this, name = std::move(name), replicas, done = std::move(done)] {
    std::unique_lock lock(mu_);
    admin_log_.push_back("scale name=" + name + " replicas=" + std::to_string(replicas));
    auto it = std::find_if(models_.begin(), models_.end(), [&](const auto& m) { return m.name == name; });
    if (it == models_.end()) {
      lock.unlock();
      return done(std::unexpected(error{errc::not_found, "deployment '" + name + "' does not exist"}));
    }
    it->replicas_desired = it->replicas_ready = replicas;
    lock.unlock();
    done({});
  });
}

}  // namespace exa::test

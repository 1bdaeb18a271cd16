// Devices without a GPU: choosing the kind (`--device-kind`) from what CUDA
// reports, the executors and their completion hand-over, the CPU device
// (pool, engine factory, telemetry), the CUDA memory budget, and what a
// CUDA device says on a host without one.

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "gpu/cpu_device.hpp"
#include "gpu/cuda_device.hpp"
#include "gpu/device_select.hpp"
#include "gpu/executor.hpp"
#include "gpu/nvml.hpp"
#include "gpu/tensor_parallel.hpp"
#include "model/llama_model.hpp"
#include "model/model_gen.hpp"

using namespace exa;
using namespace exa::gpu;
using Catch::Matchers::Contains;

namespace {

expected<int> cuda_reports(int n) { return n; }
expected<int> cuda_fails(const std::string& why) { return make_error(errc::unavailable, why); }

// Waits (bounded) for a callback from another thread.
struct outcome_box {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<task_outcome> outcomes;
  executor::completion sink() {
    return [this](task_outcome o) {
      std::lock_guard lock(mutex);
      outcomes.push_back(std::move(o));
      cv.notify_all();
    };
  }
  bool wait_for(std::size_t n) {
    std::unique_lock lock(mutex);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return outcomes.size() >= n; });
  }
};

std::shared_ptr<const model::llama_model> tiny_model() {
  static std::shared_ptr<const model::llama_model> m = [] {
    const std::string dir = std::string(EXA_TEST_TMPDIR) + "/device-test";
    std::filesystem::create_directories(dir);
    const std::string path = dir + "/tiny.gguf";
    auto spec = *model::preset_spec("tiny");
    REQUIRE(model::generate_model(spec, path).has_value());
    auto loaded = model::llama_model::load(path);
    REQUIRE(loaded.has_value());
    return *loaded;
  }();
  return m;
}

}  // namespace

TEST_CASE("device kinds parse from cpu, cuda and auto only", "[device]") {
  CHECK(parse_kind_request("cpu").value() == kind_request::cpu);
  CHECK(parse_kind_request("cuda").value() == kind_request::cuda);
  CHECK(parse_kind_request("auto").value() == kind_request::automatic);
  auto bad = parse_kind_request("gpu");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().code == errc::invalid_argument);
  CHECK_THAT(bad.error().message, Contains("cpu, cuda or auto") && Contains("'gpu'"));
  CHECK(to_string(kind_request::automatic) == "auto");
  CHECK(to_string(device_kind::cuda) == "cuda");
}

TEST_CASE("device kind: cpu never depends on CUDA", "[device]") {
  for (const auto& cuda : {cuda_reports(8), cuda_fails("no CUDA-capable device is detected")}) {
    auto c = choose_device_kind(kind_request::cpu, 4, cuda);
    REQUIRE(c);
    CHECK(c->kind == device_kind::cpu);
    CHECK(c->fallback_reason.empty());
  }
}

TEST_CASE("device kind: cuda without a usable GPU is unavailable naming the runtime's reason", "[device]") {
  auto c = choose_device_kind(kind_request::cuda, 1, cuda_fails("no usable CUDA device: CUDA driver version is insufficient"));
  REQUIRE_FALSE(c);
  CHECK(c.error().code == errc::unavailable);
  CHECK_THAT(c.error().message, Contains("CUDA driver version is insufficient"));
  auto few = choose_device_kind(kind_request::cuda, 4, cuda_reports(1));
  REQUIRE_FALSE(few);
  CHECK(few.error().code == errc::unavailable);
  CHECK_THAT(few.error().message, Contains("4 CUDA devices needed, 1 present"));
  auto ok = choose_device_kind(kind_request::cuda, 4, cuda_reports(4));
  REQUIRE(ok);
  CHECK(ok->kind == device_kind::cuda);
}

TEST_CASE("device kind: auto takes CUDA when enough GPUs are present, else CPU and says why", "[device]") {
  auto gpu = choose_device_kind(kind_request::automatic, 2, cuda_reports(8));
  REQUIRE(gpu);
  CHECK(gpu->kind == device_kind::cuda);
  CHECK(gpu->fallback_reason.empty());
  auto none = choose_device_kind(kind_request::automatic, 2, cuda_fails("no CUDA-capable device is detected"));
  REQUIRE(none);
  CHECK(none->kind == device_kind::cpu);
  CHECK_THAT(none->fallback_reason, Contains("no CUDA-capable device is detected"));
  auto few = choose_device_kind(kind_request::automatic, 2, cuda_reports(1));
  REQUIRE(few);
  CHECK(few->kind == device_kind::cpu);
  CHECK_THAT(few->fallback_reason, Contains("2 CUDA devices needed, 1 present"));
}

TEST_CASE("resolve_device_kind asks the injected CUDA query only when CUDA may be used", "[device]") {
  int asked = 0;
  const cuda_count_probe probe = [&]() -> expected<int> {
    ++asked;
    return 2;
  };
  CHECK(resolve_device_kind(kind_request::cpu, 2, probe)->kind == device_kind::cpu);
  CHECK(asked == 0);
  CHECK(resolve_device_kind(kind_request::automatic, 2, probe)->kind == device_kind::cuda);
  CHECK(resolve_device_kind(kind_request::cuda, 3, probe).error().code == errc::unavailable);
  CHECK(asked == 2);
}

TEST_CASE("this host's CUDA: cuda is unavailable with the runtime's reason, auto falls back", "[device]") {
  // On a host with a usable GPU there is nothing to check here (the GPU
  // program cuda_device_test covers it).
  if (cuda_device_count()) return;
  const auto reason = cuda_device_count().error().message;
  CHECK_FALSE(reason.empty());
  auto c = resolve_device_kind(kind_request::cuda, 1);
  REQUIRE_FALSE(c);
  CHECK(c.error().code == errc::unavailable);
  CHECK_THAT(c.error().message, Contains(reason));
  auto a = resolve_device_kind(kind_request::automatic, 1);
  REQUIRE(a);
  CHECK(a->kind == device_kind::cpu);
  auto d = open_cuda_device(0, {});
  REQUIRE_FALSE(d);
  CHECK(d.error().code == errc::unavailable);
}

TEST_CASE("NVML absent: no reading, not a zero", "[device]") {
  auto n = nvml::get();
  if (n) return;  // a host with the driver: readings are real there
  CHECK(nvml::get() == nullptr);
}

TEST_CASE("the CUDA budget is what was asked, cut to the card's free memory less 5 percent", "[device]") {
  constexpr std::uint64_t gib = 1ull << 30;
  CHECK(cuda_memory_budget(10 * gib, 100 * gib, 140 * gib) == 10 * gib);
  CHECK(cuda_memory_budget(200 * gib, 100 * gib, 140 * gib) == 93 * gib);
  CHECK(cuda_memory_budget(1 * gib, 1 * gib, 140 * gib) == 0);  // less free than the headroom
}

TEST_CASE("inline executor: the task runs and completes inside submit", "[device][executor]") {
  inline_executor ex;
  bool ran = false;
  std::optional<task_outcome> got;
  ex.submit([&] { ran = true; }, [&](task_outcome o) { got = std::move(o); });
  CHECK(ran);
  REQUIRE(got);
  CHECK_FALSE(got->failure);
  CHECK(got->seconds >= 0);
  ex.submit([] { throw std::runtime_error("boom"); }, [&](task_outcome o) { got = std::move(o); });
  REQUIRE(got->failure);
  CHECK(got->failure->code == errc::internal);
  CHECK_THAT(got->failure->message, Contains("boom"));
}

TEST_CASE("thread executor: tasks run in order on its thread, completions arrive, errors are reported",
          "[device][executor]") {
  thread_executor ex("test-exec", 8);
  outcome_box box;
  std::vector<int> order;
  std::thread::id worker;
  for (int i = 0; i < 5; ++i)
    ex.submit([&, i] {
      order.push_back(i);
      worker = std::this_thread::get_id();
    }, box.sink());
  ex.submit([] { throw std::runtime_error("kernel fault"); }, box.sink());
  REQUIRE(box.wait_for(6));
  std::lock_guard lock(box.mutex);
  CHECK(order == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(worker != std::this_thread::get_id());
  for (int i = 0; i < 5; ++i) CHECK_FALSE(box.outcomes[i].failure);
  REQUIRE(box.outcomes[5].failure);
  CHECK_THAT(box.outcomes[5].failure->message, Contains("kernel fault"));
}

TEST_CASE("thread executor: a full queue refuses at once, a closed one fails what is left", "[device][executor]") {
  outcome_box box;
  std::mutex gate;
  std::unique_lock hold(gate);
  {
    thread_executor ex("test-full", 2);
    std::atomic<bool> started{false};
    ex.submit([&] {
      started = true;
      std::lock_guard wait(gate);  // running, blocked on the gate
    }, box.sink());
    // Wait (bounded) until the worker took it off the queue, so the queue
    // holds exactly what follows.
    for (int i = 0; i < 10000 && !started; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(started);
    ex.submit([] {}, box.sink());
    ex.submit([] {}, box.sink());
    CHECK(ex.pending() == 3);
    ex.submit([] {}, box.sink());  // the queue holds 2: refused
    {
      std::lock_guard lock(box.mutex);
      REQUIRE(box.outcomes.size() == 1);
      REQUIRE(box.outcomes[0].failure);
      CHECK(box.outcomes[0].failure->code == errc::overloaded);
    }
    hold.unlock();  // the first task ends; the destructor closes the executor
  }
  REQUIRE(box.wait_for(4));
  std::lock_guard lock(box.mutex);
  // The blocked task completed; the two queued ones ran or failed as closed,
  // never silently dropped.
  for (std::size_t i = 1; i < box.outcomes.size(); ++i)
    if (box.outcomes[i].failure) CHECK(box.outcomes[i].failure->code == errc::unavailable);
}

TEST_CASE("completion latch: taken inline during submit, left to the message path after", "[device][executor]") {
  completion_latch inline_latch;
  task_outcome o;
  o.seconds = 2;
  CHECK(inline_latch.offer(o));
  auto early = inline_latch.close();
  REQUIRE(early);
  CHECK(early->seconds == 2);
  completion_latch late;
  CHECK_FALSE(late.close());
  task_outcome o2;
  CHECK_FALSE(late.offer(o2));
}

TEST_CASE("CPU device: pool, telemetry and an engine that runs a request on its executor", "[device]") {
  device_options o;
  o.memory_bytes = 8ull << 20;
  o.page_bytes = 64 * 1024;
  o.threads = 2;
  auto d = open_device(device_kind::cpu, 3, o);
  REQUIRE(d);
  auto dev = *d;
  CHECK(dev->kind() == device_kind::cpu);
  CHECK(dev->index() == 3);
  CHECK(dev->check_health());
  auto t = dev->read_telemetry();
  CHECK(t.memory_budget_bytes == o.memory_bytes);
  CHECK(t.memory_reserved_bytes == o.memory_bytes);
  CHECK(t.memory_used_bytes == 0);
  CHECK_FALSE(t.temperature_c);
  CHECK_FALSE(t.utilization_percent);
  CHECK(t.error.empty());

  engine_options eo;
  eo.kv_tokens = 256;
  auto eng = dev->make_engine(tiny_model(), eo);
  REQUIRE(eng);
  std::weak_ptr<device> weak = dev;
  engine::generation_request req;
  req.id = 1;
  req.prompt = {1, 2, 3, 4, 5};
  req.max_tokens = 4;
  REQUIRE((*eng)->submit(req));
  outcome_box box;
  std::vector<engine::step_result> results;
  for (int i = 0; i < 16 && !(*eng)->idle(); ++i) {
    auto r = std::make_shared<engine::step_result>();
    dev->exec().submit([e = *eng, r] { *r = e->step(); }, box.sink());
    REQUIRE(box.wait_for(static_cast<std::size_t>(i + 1)));
    results.push_back(*r);
  }
  std::uint32_t tokens = 0;
  for (const auto& r : results) tokens += static_cast<std::uint32_t>(r.tokens.size());
  CHECK(tokens == 4);
  CHECK((*eng)->idle());
  // The engine holds its device: dropping ours leaves it alive.
  dev.reset();
  d->reset();
  CHECK_FALSE(weak.expired());
  eng->reset();
  CHECK(weak.expired());
}

TEST_CASE("CPU device: refuses a page that cannot hold a token and a budget under one page", "[device]") {
  device_options o;
  o.memory_bytes = 1ull << 20;
  o.page_bytes = 64;
  auto dev = open_device(device_kind::cpu, 0, o);
  REQUIRE(dev);
  auto eng = (*dev)->make_engine(tiny_model(), {});
  REQUIRE_FALSE(eng);
  CHECK(eng.error().code == errc::invalid_argument);
  CHECK_THAT(eng.error().message, Contains("raise the page size"));
  o.page_bytes = 2ull << 20;
  auto none = open_device(device_kind::cpu, 0, o);
  REQUIRE_FALSE(none);
  CHECK(none.error().code == errc::invalid_argument);
}

// ---------------------------------------------------------------- tensor parallel

namespace {

// Greedy tokens of one request on `eng`, each step run on `dev`'s executor
// (as the device actor runs them), waiting for each completion (bounded).
std::vector<std::int32_t> run_on(device& dev, engine::inference_engine& eng, std::uint64_t id,
                                 std::vector<std::int32_t> prompt, std::uint32_t max_tokens) {
  engine::generation_request req;
  req.id = id;
  req.prompt = std::move(prompt);
  req.max_tokens = max_tokens;
  REQUIRE(eng.submit(req));
  std::vector<std::int32_t> out;
  for (int i = 0; i < 1000 && !eng.idle(); ++i) {
    outcome_box box;
    auto r = std::make_shared<engine::step_result>();
    dev.exec().submit([&eng, r] { *r = eng.step(); }, box.sink());
    REQUIRE(box.wait_for(1));
    REQUIRE_FALSE(box.outcomes[0].failure);
    for (const auto& t : r->tokens) out.push_back(t.token);
  }
  return out;
}

std::vector<std::shared_ptr<device>> cpu_devices(std::uint32_t n, bool inline_exec = false) {
  device_options o;
  o.memory_bytes = 8ull << 20;
  o.page_bytes = 64 * 1024;
  o.inline_executor = inline_exec;
  std::vector<std::shared_ptr<device>> out;
  for (std::uint32_t i = 0; i < n; ++i) out.push_back(*open_device(device_kind::cpu, i, o));
  return out;
}

const std::vector<std::int32_t> tp_prompt{1, 72, 101, 108, 108, 111, 44, 32, 84, 80};

}  // namespace

TEST_CASE("a tensor-parallel group over two CPU devices generates the same tokens run to run", "[device][tp]") {
  engine_options eo;
  eo.kv_tokens = 512;
  std::vector<std::int32_t> first;
  for (int run = 0; run < 2; ++run) {
    auto devs = cpu_devices(2);
    auto g = make_group_engine(devs, tiny_model(), eo, std::chrono::seconds(30));
    REQUIRE(g);
    REQUIRE(g->abort);
    const auto tokens = run_on(*devs[0], *g->engine, 1, tp_prompt, 24);
    CHECK(tokens.size() == 24);
    if (run == 0) first = tokens;
    else CHECK(tokens == first);
  }
  // The engine holds its devices: dropping the list leaves them alive.
  auto devs = cpu_devices(2);
  std::weak_ptr<device> second = devs[1];
  auto g = make_group_engine(devs, tiny_model(), eo, std::chrono::seconds(30));
  REQUIRE(g);
  devs.clear();
  CHECK_FALSE(second.expired());
  g->engine.reset();
  CHECK(second.expired());
}

TEST_CASE("a group shares a member device with a one-device replica: both stay exact", "[device][tp]") {
  engine_options eo;
  eo.kv_tokens = 512;
  // Alone first: what each must produce.
  std::vector<std::int32_t> tp_alone, single_alone;
  {
    auto devs = cpu_devices(2);
    auto g = make_group_engine(devs, tiny_model(), eo, std::chrono::seconds(30));
    REQUIRE(g);
    tp_alone = run_on(*devs[0], *g->engine, 1, tp_prompt, 32);
    auto single = devs[1]->make_engine(tiny_model(), eo);
    REQUIRE(single);
    single_alone = run_on(*devs[1], **single, 2, {1, 2, 3, 4, 5, 6}, 32);
  }
  // Then at once: the group's steps (on device 0's executor, using device 1's
  // threads) and the single engine's (on device 1's executor) interleave.
  auto devs = cpu_devices(2);
  auto g = make_group_engine(devs, tiny_model(), eo, std::chrono::seconds(30));
  REQUIRE(g);
  auto single = devs[1]->make_engine(tiny_model(), eo);
  REQUIRE(single);
  std::vector<std::int32_t> tp_now, single_now;
  std::thread other([&] { single_now = run_on(*devs[1], **single, 2, {1, 2, 3, 4, 5, 6}, 32); });
  tp_now = run_on(*devs[0], *g->engine, 1, tp_prompt, 32);
  other.join();
  CHECK(tp_now == tp_alone);
  CHECK(single_now == single_alone);
}

TEST_CASE("an aborted group fails its engine at once: no step hangs, nothing more is generated", "[device][tp]") {
  engine_options eo;
  eo.kv_tokens = 512;
  auto devs = cpu_devices(2);
  auto g = make_group_engine(devs, tiny_model(), eo, std::chrono::seconds(30));
  REQUIRE(g);
  engine::generation_request req;
  req.id = 7;
  req.prompt = tp_prompt;
  req.max_tokens = 16;
  REQUIRE(g->engine->submit(req));
  g->abort("device 1 lost (test)");
  outcome_box box;
  auto r = std::make_shared<engine::step_result>();
  const auto t0 = std::chrono::steady_clock::now();
  devs[0]->exec().submit([e = g->engine, r] { *r = e->step(); }, box.sink());
  REQUIRE(box.wait_for(1));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));  // far below the 30 s timeout
  CHECK(r->tokens.empty());
  auto fault = g->engine->fault();
  REQUIRE(fault);
  CHECK_THAT(*fault, Contains("device 1 lost (test)"));
}

TEST_CASE("a group needs two or more CPU devices, ascending, and a model that splits", "[device][tp]") {
  engine_options eo;
  auto devs = cpu_devices(3);
  auto one = make_group_engine({devs[0]}, tiny_model(), eo, std::chrono::seconds(1));
  REQUIRE_FALSE(one);
  CHECK(one.error().code == errc::invalid_argument);
  auto unordered = make_group_engine({devs[1], devs[0]}, tiny_model(), eo, std::chrono::seconds(1));
  REQUIRE_FALSE(unordered);
  CHECK_THAT(unordered.error().message, Contains("ascending"));
  // The tiny model has 4 heads and 2 KV heads: three members do not divide them.
  auto three = make_group_engine(devs, tiny_model(), eo, std::chrono::seconds(1));
  REQUIRE_FALSE(three);
  CHECK(three.error().code == errc::invalid_argument);
}

#include "cluster/event_log.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>

namespace exa::cluster {

std::string_view to_string(event_kind k) noexcept {
  switch (k) {
    case event_kind::request_accepted: return "request_accepted";
    case event_kind::request_tokens: return "request_tokens";
    case event_kind::request_finished: return "request_finished";
    case event_kind::replica_state: return "replica_state";
    case event_kind::node_state: return "node_state";
    case event_kind::fault_injected: return "fault_injected";
    case event_kind::fault_detected: return "fault_detected";
    case event_kind::fault_recovered: return "fault_recovered";
    case event_kind::fault_cleared: return "fault_cleared";
    case event_kind::clock_offset: return "clock_offset";
    case event_kind::rollout: return "rollout";
  }
  return "unknown";
}

namespace {

// Fields that a kind documents are always written, even at their default
// value (a first token index of 0, node 0), so a reader never has to guess
// whether a field was zero or absent; other fields appear only when set.
enum field : unsigned {
  f_request_id = 1u << 0,
  f_deployment = 1u << 1,
  f_replica = 1u << 2,
  f_slot = 1u << 3,
  f_epoch = 1u << 4,
  f_node = 1u << 5,
  f_device = 1u << 6,
  f_fault_id = 1u << 7,
  f_outcome = 1u << 8,
  f_detail = 1u << 9,
  f_index = 1u << 10,
  f_count = 1u << 11,
  f_value_ms = 1u << 12,
  f_value2_ms = 1u << 13,
  f_tokens = 1u << 14,
};

unsigned documented_fields(event_kind k) noexcept {
  switch (k) {
    case event_kind::request_accepted: return f_request_id | f_deployment | f_detail | f_count;
    case event_kind::request_tokens: return f_request_id | f_index | f_tokens;
    case event_kind::request_finished:
      return f_request_id | f_outcome | f_count | f_value_ms | f_value2_ms;
    case event_kind::replica_state: return f_replica | f_deployment | f_slot | f_epoch | f_node | f_detail;
    case event_kind::node_state: return f_node | f_detail;
    case event_kind::fault_injected: return f_fault_id | f_detail;
    case event_kind::fault_detected: return f_fault_id | f_detail;
    case event_kind::fault_recovered: return f_fault_id;
    case event_kind::fault_cleared: return f_fault_id;
    case event_kind::clock_offset: return f_node | f_value_ms | f_value2_ms;
    case event_kind::rollout: return f_deployment | f_detail | f_outcome;
  }
  return 0;
}

void append_escaped(std::string& out, std::string_view s) {
  out.push_back('"');
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

// Milliseconds with exactly three decimals: the same value always prints the
// same bytes. JSON has no NaN or infinity, so those become null.
void append_ms(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  fmt::format_to(std::back_inserter(out), "{:.3f}", v);
}

class line_writer {
 public:
  explicit line_writer(std::string& out) : out_(out) { out_.push_back('{'); }
  void key(std::string_view k) {
    if (!first_) out_.push_back(',');
    first_ = false;
    append_escaped(out_, k);
    out_.push_back(':');
  }
  void str(std::string_view k, std::string_view v) {
    key(k);
    append_escaped(out_, v);
  }
  template <class Int>
  void num(std::string_view k, Int v) {
    key(k);
    fmt::format_to(std::back_inserter(out_), "{}", v);
  }
  void ms(std::string_view k, double v) {
    key(k);
    append_ms(out_, v);
  }
  void finish() { out_.push_back('}'); }

 private:
  std::string& out_;
  bool first_ = true;
};

}  // namespace

std::string to_json_line(const event& e) {
  const unsigned doc = documented_fields(e.kind);
  auto want = [doc](field f, bool set) { return (doc & f) != 0 || set; };
  std::string out;
  out.reserve(128 + e.tokens.size() * 6);
  line_writer w(out);
  w.num("t_ns", e.t_ns);
  w.str("kind", to_string(e.kind));
  if (want(f_request_id, !e.request_id.empty())) w.str("request_id", e.request_id);
  if (want(f_deployment, !e.deployment.empty())) w.str("deployment", e.deployment);
  if (want(f_replica, e.replica != 0)) w.num("replica", e.replica);
  if (want(f_slot, e.slot >= 0)) w.num("slot", e.slot);
  if (want(f_epoch, e.epoch != 0)) w.num("epoch", e.epoch);
  if (want(f_node, e.node >= 0)) w.num("node", e.node);
  if (want(f_device, e.device >= 0)) w.num("device", e.device);
  if (want(f_fault_id, e.fault_id != 0)) w.num("fault_id", e.fault_id);
  if (want(f_outcome, !e.outcome.empty())) w.str("outcome", e.outcome);
  if (want(f_detail, !e.detail.empty())) w.str("detail", e.detail);
  if (want(f_index, e.index != 0)) w.num("index", e.index);
  if (want(f_count, e.count != 0)) w.num("count", e.count);
  if (want(f_value_ms, e.value_ms != 0)) w.ms("value_ms", e.value_ms);
  if (want(f_value2_ms, e.value2_ms != 0)) w.ms("value2_ms", e.value2_ms);
  if (want(f_tokens, !e.tokens.empty())) {
    w.key("tokens");
    out.push_back('[');
    for (std::size_t i = 0; i < e.tokens.size(); ++i) {
      if (i != 0) out.push_back(',');
      fmt::format_to(std::back_inserter(out), "{}", e.tokens[i]);
    }
    out.push_back(']');
  }
  w.finish();
  return out;
}

event_log::~event_log() {
  if (fd_ >= 0) ::close(fd_);
}

expected<std::shared_ptr<event_log>> event_log::to_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return make_error(errc::io_error, "cannot open event log " + path + ": " + std::strerror(errno));
  auto log = std::make_shared<event_log>();
  log->fd_ = fd;
  return log;
}

void event_log::append(event e) {
  if (fd_ < 0) {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(e));
    return;
  }
  e.t_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
               .count();
  std::string line = to_json_line(e);
  line.push_back('\n');
  std::lock_guard lock(mutex_);
  // A line cut short before (a full disk) is ended first, so this one
  // starts on its own line and readers lose only the cut one.
  if (torn_) line.insert(line.begin(), '\n');
  // One write per line (O_APPEND): lines from the threads of one process
  // never interleave. A full disk loses the line, never the process.
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  torn_ = done > 0 && done < line.size();
}

std::vector<event> event_log::events() const {
  std::lock_guard lock(mutex_);
  return events_;
}

void event_log::visit_since(std::size_t& cursor, const std::function<void(const event&)>& fn) const {
  std::lock_guard lock(mutex_);
  for (; cursor < events_.size(); ++cursor) fn(events_[cursor]);
}

std::size_t event_log::size() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

std::string event_log::to_jsonl() const {
  // Render from a copy so appenders are not held up by the formatting.
  const std::vector<event> copy = events();
  std::string out;
  for (const event& e : copy) {
    out += to_json_line(e);
    out.push_back('\n');
  }
  return out;
}

}  // namespace exa::cluster

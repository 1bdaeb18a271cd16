#include "cluster/journal.hpp"
#include "cluster/rollout.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

namespace exa::cluster {
namespace {

using json = nlohmann::json;

const char* log_name = "journal.log";
const char* snapshot_name = "snapshot.json";

error io_failure(const std::string& what, const std::string& path) {
  return {errc::io_error, what + " '" + path + "': " + std::strerror(errno)};
}

json to_json(const api::deploy_request& d) {
  return {{"name", d.name},       {"model_file", d.model_file}, {"replicas", d.replicas},
          {"kv_tokens", d.kv_tokens}, {"routing", d.routing},   {"max_replicas_per_node", d.max_replicas_per_node},
          {"model_sha256", d.model_sha256}, {"tenant", d.tenant}, {"warm_pool_percent", d.warm_pool_percent},
          {"autoscale_min", d.autoscale_min}, {"autoscale_max", d.autoscale_max},
          {"autoscale_metric", d.autoscale_metric}, {"autoscale_target", d.autoscale_target},
          {"idle_to_zero_s", d.idle_to_zero_s}, {"chat_template", d.chat_template},
          {"draft_model", d.draft_model}, {"draft_sha256", d.draft_sha256}, {"draft_tokens", d.draft_tokens},
          {"tensor_parallel", d.tensor_parallel}, {"prefix_slack_tokens", d.prefix_slack_tokens},
          {"prefix_slack_ratio", d.prefix_slack_ratio}, {"prefix_slack_s", d.prefix_slack_s}};
}

api::deploy_request deploy_from(const json& j) {
  api::deploy_request d;
  d.name = j.at("name").get<std::string>();
  d.model_file = j.at("model_file").get<std::string>();
  d.replicas = j.at("replicas").get<std::uint32_t>();
  d.kv_tokens = j.at("kv_tokens").get<std::uint32_t>();
  d.routing = j.at("routing").get<std::string>();
  d.max_replicas_per_node = j.at("max_replicas_per_node").get<std::uint32_t>();
  d.model_sha256 = j.value("model_sha256", std::string());  // journals written before it have none
  d.tenant = j.value("tenant", std::string());              // the same
  // Journals written before warm pools keep none: a restart adds no replicas.
  d.warm_pool_percent = j.value("warm_pool_percent", 0u);
  d.autoscale_min = j.value("autoscale_min", d.autoscale_min);
  d.autoscale_max = j.value("autoscale_max", d.autoscale_max);
  d.autoscale_metric = j.value("autoscale_metric", std::string());
  d.autoscale_target = j.value("autoscale_target", 0.0);
  d.idle_to_zero_s = j.value("idle_to_zero_s", 0u);
  d.chat_template = j.value("chat_template", std::string());  // journals before it: none
  d.draft_model = j.value("draft_model", std::string());      // journals before drafts: none
  d.draft_sha256 = j.value("draft_sha256", std::string());
  d.draft_tokens = j.value("draft_tokens", 0u);
  d.tensor_parallel = j.value("tensor_parallel", 0u);  // journals before TP groups: one device
  // Journals before per-deployment slack: the defaults, as they ran with.
  d.prefix_slack_tokens = j.value("prefix_slack_tokens", d.prefix_slack_tokens);
  d.prefix_slack_ratio = j.value("prefix_slack_ratio", d.prefix_slack_ratio);
  // Journals before the slack in time ran without it: they keep tokens alone.
  d.prefix_slack_s = j.value("prefix_slack_s", 0.0);
  return d;
}

json to_json(const journal_record& r) {
  switch (r.type) {
    case journal_record::kind::deploy: return {{"op", "deploy"}, {"deployment", to_json(r.deployment)}};
    case journal_record::kind::undeploy: return {{"op", "undeploy"}, {"name", r.name}};
    case journal_record::kind::scale: return {{"op", "scale"}, {"name", r.name}, {"replicas", r.replicas}};
    case journal_record::kind::epoch:
      return {{"op", "epoch"}, {"name", r.name}, {"slot", r.slot}, {"epoch", r.epoch}};
    case journal_record::kind::replica: return {{"op", "replica"}, {"id", r.replica}};
    case journal_record::kind::node_drain: return {{"op", "drain_node"}, {"node", r.node}};
    case journal_record::kind::node_undrain: return {{"op", "undrain_node"}, {"node", r.node}};
    case journal_record::kind::version_current: return {{"op", "version_current"}, {"name", r.name}, {"to", r.to}};
    case journal_record::kind::rollout_begin:
      return {{"op", "rollout_begin"}, {"name", r.name}, {"from", r.from}, {"to", r.to}, {"replicas", r.replicas}};
    case journal_record::kind::rollout_end: return {{"op", "rollout_end"}, {"name", r.name}};
  }
  return {};
}

// Throws nlohmann's exceptions on a malformed record (caught by the caller).
journal_record record_from(const json& j) {
  const auto op = j.at("op").get<std::string>();
  if (op == "deploy") return journal_record::deploy(deploy_from(j.at("deployment")));
  if (op == "undeploy") return journal_record::undeploy(j.at("name").get<std::string>());
  if (op == "scale") return journal_record::scale(j.at("name").get<std::string>(), j.at("replicas").get<std::uint32_t>());
  if (op == "epoch")
    return journal_record::slot_epoch(j.at("name").get<std::string>(), j.at("slot").get<std::uint32_t>(),
                                      j.at("epoch").get<epoch_t>());
  if (op == "replica") return journal_record::replica_taken(j.at("id").get<replica_id>());
  if (op == "drain_node") return journal_record::drain_node(j.at("node").get<node_id>());
  if (op == "undrain_node") return journal_record::undrain_node(j.at("node").get<node_id>());
  if (op == "version_current")
    return journal_record::version_current(j.at("name").get<std::string>(), j.at("to").get<std::string>());
  if (op == "rollout_begin")
    return journal_record::rollout_begin(j.at("name").get<std::string>(), j.at("from").get<std::string>(),
                                         j.at("to").get<std::string>(), j.at("replicas").get<std::uint32_t>());
  if (op == "rollout_end") return journal_record::rollout_end(j.at("name").get<std::string>());
  throw std::invalid_argument("unknown op '" + op + "'");
}

json state_to_json(const durable_state& s) {
  json deployments = json::array();
  for (const auto& [name, d] : s.deployments) deployments.push_back(to_json(d));
  json epochs = json::array();
  for (const auto& [slot, e] : s.epochs) epochs.push_back({{"name", slot.deployment}, {"slot", slot.index}, {"epoch", e}});
  json rollouts = json::array();
  for (const auto& [base, r] : s.rollouts)
    rollouts.push_back({{"name", base}, {"from", r.from}, {"to", r.to}, {"replicas", r.replicas}});
  return {{"version", 1},
          {"deployments", deployments},
          {"epochs", epochs},
          {"next_replica_id", s.next_replica_id},
          {"drained_nodes", s.drained_nodes},
          {"current_versions", s.current_versions},
          {"rollouts", rollouts},
          {"used_versions", s.used_versions}};
}

durable_state state_from(const json& j) {
  if (j.at("version").get<int>() != 1) throw std::invalid_argument("unknown snapshot version");
  durable_state s;
  for (const auto& d : j.at("deployments")) {
    auto req = deploy_from(d);
    s.deployments[req.name] = req;
  }
  for (const auto& e : j.at("epochs"))
    s.epochs[{e.at("name").get<std::string>(), e.at("slot").get<std::uint32_t>()}] = e.at("epoch").get<epoch_t>();
  s.next_replica_id = j.at("next_replica_id").get<replica_id>();
  if (j.contains("drained_nodes"))  // snapshots written before drains have none
    for (const auto& n : j.at("drained_nodes")) s.drained_nodes.insert(n.get<node_id>());
  if (j.contains("current_versions"))  // nor versions
    s.current_versions = j.at("current_versions").get<std::map<std::string, std::string>>();
  if (j.contains("used_versions"))
    s.used_versions = j.at("used_versions").get<std::map<std::string, std::set<std::string>>>();
  if (j.contains("rollouts"))
    for (const auto& r : j.at("rollouts"))
      s.rollouts[r.at("name").get<std::string>()] = {r.at("from").get<std::string>(), r.at("to").get<std::string>(),
                                                     r.at("replicas").get<std::uint32_t>()};
  return s;
}

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
std::uint32_t get_u32(const unsigned char* p) {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 | std::uint32_t{p[3]} << 24;
}

bool write_all(int fd, const std::string& bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

bool fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return false;
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  return ok;
}

std::string read_file(const std::string& path, bool* exists) {
  std::ifstream in(path, std::ios::binary);
  *exists = static_cast<bool>(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Replays the log in `bytes` onto `state`. Returns the byte length of the
// valid prefix; sets the report's torn fields; errors on corruption.
expected<std::uint64_t> replay(const std::string& bytes, const std::string& path, durable_state& state,
                               journal_recovery& report) {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  std::uint64_t at = 0;
  for (std::size_t number = 1;; ++number) {
    const std::uint64_t left = bytes.size() - at;
    if (left == 0) return at;
    const auto torn = [&] {
      report.torn_tail = true;
      report.torn_record = number;
      report.torn_offset = at;
      return at;
    };
    if (left < 8) return torn();
    const std::uint32_t length = get_u32(data + at), crc = get_u32(data + at + 4);
    const std::string where = path + " record " + std::to_string(number) + " at byte " + std::to_string(at);
    if (length == 0 || length > journal::record_bytes_max)
      return make_error(errc::corrupt_data, where + " has an impossible length " + std::to_string(length));
    if (left - 8 < length) return torn();
    const bool last = left - 8 == length;
    if (crc32(data + at + 8, length) != crc) {
      if (last) return torn();  // a write the crash cut short
      return make_error(errc::corrupt_data,
                        where + " fails its checksum and records follow it: the journal is damaged, not torn; "
                                "refusing to start without it (move the file away to start from the snapshot)");
    }
    try {
      apply(state, record_from(json::parse(bytes.begin() + static_cast<std::ptrdiff_t>(at + 8),
                                           bytes.begin() + static_cast<std::ptrdiff_t>(at + 8 + length))));
    } catch (const std::exception& e) {
      return make_error(errc::corrupt_data, where + " is not a valid record: " + e.what());
    }
    ++report.records_replayed;
    at += 8 + length;
  }
}

}  // namespace

journal_record journal_record::deploy(api::deploy_request r) {
  journal_record out;
  out.type = kind::deploy;
  out.name = r.name;
  out.deployment = std::move(r);
  return out;
}
journal_record journal_record::undeploy(std::string name) {
  journal_record out;
  out.type = kind::undeploy;
  out.name = std::move(name);
  return out;
}
journal_record journal_record::scale(std::string name, std::uint32_t replicas) {
  journal_record out;
  out.type = kind::scale;
  out.name = std::move(name);
  out.replicas = replicas;
  return out;
}
journal_record journal_record::slot_epoch(std::string name, std::uint32_t slot, epoch_t epoch) {
  journal_record out;
  out.type = kind::epoch;
  out.name = std::move(name);
  out.slot = slot;
  out.epoch = epoch;
  return out;
}
journal_record journal_record::replica_taken(replica_id id) {
  journal_record out;
  out.type = kind::replica;
  out.replica = id;
  return out;
}

journal_record journal_record::drain_node(node_id node) {
  journal_record out;
  out.type = kind::node_drain;
  out.node = node;
  return out;
}
journal_record journal_record::undrain_node(node_id node) {
  journal_record out;
  out.type = kind::node_undrain;
  out.node = node;
  return out;
}

journal_record journal_record::version_current(std::string base, std::string deployment) {
  journal_record out;
  out.type = kind::version_current;
  out.name = std::move(base);
  out.to = std::move(deployment);
  return out;
}
journal_record journal_record::rollout_begin(std::string base, std::string from, std::string to,
                                             std::uint32_t replicas) {
  journal_record out;
  out.type = kind::rollout_begin;
  out.name = std::move(base);
  out.from = std::move(from);
  out.to = std::move(to);
  out.replicas = replicas;
  return out;
}
journal_record journal_record::rollout_end(std::string base) {
  journal_record out;
  out.type = kind::rollout_end;
  out.name = std::move(base);
  return out;
}

void apply(durable_state& s, const journal_record& r) {
  switch (r.type) {
    case journal_record::kind::deploy: s.deployments[r.deployment.name] = r.deployment; break;
    case journal_record::kind::undeploy:
      s.deployments.erase(r.name);
      // Epochs stay: a deployment of the same name later must not reuse them,
      // or a straggler of the old one could pass for current.
      break;
    case journal_record::kind::scale:
      if (auto it = s.deployments.find(r.name); it != s.deployments.end()) it->second.replicas = r.replicas;
      break;
    case journal_record::kind::epoch: {
      auto& e = s.epochs[{r.name, r.slot}];
      e = std::max(e, r.epoch);  // epochs only grow
      break;
    }
    case journal_record::kind::replica: s.next_replica_id = std::max(s.next_replica_id, r.replica + 1); break;
    case journal_record::kind::node_drain: s.drained_nodes.insert(r.node); break;
    case journal_record::kind::node_undrain: s.drained_nodes.erase(r.node); break;
    case journal_record::kind::version_current:
      if (r.to == r.name) s.current_versions.erase(r.name);
      else s.current_versions[r.name] = r.to;
      break;
    case journal_record::kind::rollout_begin:
      s.rollouts[r.name] = {r.from, r.to, r.replicas};
      s.used_versions[r.name].insert(version_of(r.to));
      break;
    case journal_record::kind::rollout_end: s.rollouts.erase(r.name); break;
  }
}

expected<journal> journal::open(const std::string& dir, journal_recovery* report) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(errc::io_error, "cannot create the state directory '" + dir + "': " + ec.message());
  journal j;
  j.dir_ = dir;
  journal_recovery local;
  journal_recovery& rep = report ? *report : local;
  rep = {};
  const std::string snap_path = dir + "/" + snapshot_name, log_path = dir + "/" + log_name;
  bool exists = false;
  const std::string snap = read_file(snap_path, &exists);
  if (exists) {
    try {
      j.state_ = state_from(json::parse(snap));
    } catch (const std::exception& e) {
      return make_error(errc::corrupt_data, snap_path + " is not a valid snapshot: " + e.what());
    }
    rep.from_snapshot = true;
    j.empty_ = false;
  }
  const std::string log = read_file(log_path, &exists);
  auto valid = replay(log, log_path, j.state_, rep);
  if (!valid) return std::unexpected(valid.error());
  if (rep.records_replayed > 0) j.empty_ = false;
  j.fd_ = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (j.fd_ < 0) return std::unexpected(io_failure("cannot open the journal", log_path));
  if (rep.torn_tail && (::ftruncate(j.fd_, static_cast<off_t>(*valid)) != 0 || ::fsync(j.fd_) != 0))
    return std::unexpected(io_failure("cannot cut the torn tail of", log_path));
  j.since_snapshot_ = rep.records_replayed;
  return j;
}

journal::journal(journal&& o) noexcept
    : dir_(std::move(o.dir_)), fd_(o.fd_), state_(std::move(o.state_)), since_snapshot_(o.since_snapshot_), empty_(o.empty_) {
  o.fd_ = -1;
}

journal& journal::operator=(journal&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    dir_ = std::move(o.dir_);
    fd_ = o.fd_;
    state_ = std::move(o.state_);
    since_snapshot_ = o.since_snapshot_;
    empty_ = o.empty_;
    o.fd_ = -1;
  }
  return *this;
}

journal::~journal() {
  if (fd_ >= 0) ::close(fd_);
}

expected<void> journal::append(const journal_record& r) {
  const std::string payload = to_json(r).dump();
  std::string frame;
  put_u32(frame, static_cast<std::uint32_t>(payload.size()));
  put_u32(frame, crc32(payload.data(), payload.size()));
  frame += payload;
  const std::string path = dir_ + "/" + log_name;
  if (!write_all(fd_, frame) || ::fsync(fd_) != 0) return std::unexpected(io_failure("cannot append to", path));
  apply(state_, r);
  empty_ = false;
  if (++since_snapshot_ >= snapshot_every) return snapshot();
  return {};
}

expected<void> journal::snapshot() {
  const std::string path = dir_ + "/" + snapshot_name, tmp = path + ".tmp", log_path = dir_ + "/" + log_name;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return std::unexpected(io_failure("cannot write", tmp));
  const bool ok = write_all(fd, state_to_json(state_).dump(1)) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) return std::unexpected(io_failure("cannot write", tmp));
  // The rename makes the new snapshot whole at once; only then is the log
  // it covers emptied.
  if (::rename(tmp.c_str(), path.c_str()) != 0 || !fsync_dir(dir_))
    return std::unexpected(io_failure("cannot replace", path));
  if (::ftruncate(fd_, 0) != 0 || ::fsync(fd_) != 0) return std::unexpected(io_failure("cannot empty", log_path));
  since_snapshot_ = 0;
  empty_ = false;
  return {};
}

std::uint32_t crc32(const void* data, std::size_t n) {
  static const auto table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t c = 0xFFFFFFFFu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

}  // namespace exa::cluster

#include "chaos/host_link.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>

namespace exa::chaos {
namespace {

// Runs an iproute2/tc command quietly; true on success.
bool sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

}  // namespace

std::unique_ptr<host_link> host_link::create(unsigned tag, std::uint32_t node) {
  std::unique_ptr<host_link> h(new host_link());
  h->ns_ = fmt::format("exa-chaos-{}-{}", tag, node);
  h->host_if_ = fmt::format("ec{}h{}", tag, node);
  h->ns_if_ = fmt::format("ec{}n{}", tag, node);
  const unsigned net = 200 + tag % 50;  // 10.200-249.<node>.0/30 for this run
  h->host_ip_ = fmt::format("10.{}.{}.1", net, node);
  h->ns_ip_ = fmt::format("10.{}.{}.2", net, node);
  sh("ip netns del " + h->ns_);
  h->made_ = true;  // from here the destructor removes whatever was made
  const bool ok = sh("ip netns add " + h->ns_) && sh("ip link add " + h->host_if_ + " type veth peer name " + h->ns_if_) &&
                  sh("ip link set " + h->ns_if_ + " netns " + h->ns_) &&
                  sh("ip addr add " + h->host_ip_ + "/30 dev " + h->host_if_) && sh("ip link set " + h->host_if_ + " up") &&
                  h->in_ns("ip addr add " + h->ns_ip_ + "/30 dev " + h->ns_if_) &&
                  h->in_ns("ip link set " + h->ns_if_ + " up") && h->in_ns("ip link set lo up");
  if (!ok) return nullptr;
  return h;
}

bool host_link::available() {
  if (::geteuid() != 0) return false;
  const std::string probe = fmt::format("exa-probe-{}", ::getpid());
  const bool ok = sh("ip netns add " + probe);
  sh("ip netns del " + probe);
  return ok;
}

host_link::~host_link() {
  if (!made_) return;
  sh("ip link del " + host_if_);
  sh("ip netns del " + ns_);
}

bool host_link::in_ns(const std::string& cmd) { return sh("ip netns exec " + ns_ + " " + cmd); }
bool host_link::link_up() { return sh("ip link set " + host_if_ + " up") && in_ns("ip link set " + ns_if_ + " up"); }

bool host_link::cut() {
  if (cuts_ > 0) return ++cuts_, true;
  if (sh("ip link set " + host_if_ + " down") && in_ns("ip link set " + ns_if_ + " down")) return ++cuts_, true;
  link_up();  // never leave one end down when the cut is reported as not applied
  return false;
}

bool host_link::heal() {
  if (cuts_ > 1) return --cuts_, true;
  cuts_ = 0;
  return link_up();
}

bool host_link::netem(std::uint32_t delay_ms, double loss) {
  std::string args = "netem";
  if (delay_ms > 0) args += fmt::format(" delay {}ms", delay_ms);
  if (loss > 0) args += fmt::format(" loss {:.2f}%", loss * 100);
  if (sh("tc qdisc replace dev " + host_if_ + " root " + args) && in_ns("tc qdisc replace dev " + ns_if_ + " root " + args))
    return true;
  netem_off();  // never leave one end shaped when netem is reported as not applied
  return false;
}

bool host_link::netem_off() {
  const bool host = sh("tc qdisc del dev " + host_if_ + " root");
  return in_ns("tc qdisc del dev " + ns_if_ + " root") && host;
}

bool host_link::netem_works() {
  if (!sh("tc qdisc add dev " + host_if_ + " root netem delay 1ms")) return false;
  sh("tc qdisc del dev " + host_if_ + " root");
  return true;
}

}  // namespace exa::chaos

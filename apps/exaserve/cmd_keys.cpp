// exaserve keys add|revoke|list --file FILE: manages a keys file. `add`
// prints the new key once on stdout (the file keeps only its SHA-256);
// `list` shows ids, tenants and roles, never a key. A running gateway or
// serve re-reads the file on SIGHUP.

#include <cstdio>
#include <ctime>
#include <filesystem>

#include "args.hpp"
#include "auth/api_keys.hpp"
#include "cli_util.hpp"
#include "commands.hpp"

namespace exa::app {
namespace {

const std::vector<flag_spec> flags = {
    {"file", true, "the keys file (created by the first `add`)"},
    {"tenant", true, "add: the tenant the key belongs to"},
    {"admin", false, "add: the key may also administer the cluster (deploy, scale, undeploy)"},
    {"requests-per-s", true, "limit: requests per second (token bucket; 0 = unlimited)"},
    {"tokens-per-min", true, "limit: prompt + generated tokens per minute (0 = unlimited)"},
    {"max-concurrent", true, "limit: requests in flight (0 = unlimited)"},
    {"max-tokens", true, "limit: max_tokens of one request (0 = unlimited)"},
    {"weight", true, "share of the replicas when tenants compete for them (default 1; 2 = twice the tokens)"},
    {"help", false, "show this help"},
};

const char* usage =
    "usage: exaserve keys add --file FILE --tenant T [--admin]   print a new key once; the file keeps its hash\n"
    "       exaserve keys revoke ID --file FILE                   remove the key with this id (or id prefix)\n"
    "       exaserve keys list --file FILE                        ids, tenants, roles and dates; never a key\n"
    "       exaserve keys limit --file FILE --tenant T [--requests-per-s X] [--tokens-per-min X]\n"
    "                           [--max-concurrent N] [--max-tokens N] [--weight W]\n"
    "                           set a tenant's limits (0 = unlimited) and its fair-share weight\n";

}  // namespace

int cmd_keys(int argc, char** argv) {
  if (argc < 3) return fail("keys", {errc::invalid_argument, std::string("give a subcommand\n") + usage});
  const std::string sub = argv[2];
  auto a = args::parse(argc, argv, 3, flags);
  if (!a) return fail("keys", a.error());
  if (a->has("help") || sub == "--help" || sub == "help") {
    std::printf("%s%s", usage, describe_flags(flags).c_str());
    return 0;
  }
  const auto file = a->get("file");
  if (!file) return fail("keys", {errc::invalid_argument, "--file FILE is required"});
  if (sub == "add") {
    const auto tenant = a->get("tenant");
    if (!tenant) return fail("keys add", {errc::invalid_argument, "--tenant T is required"});
    auth::key_set keys;
    if (std::filesystem::exists(*file)) {
      auto loaded = auth::load_keys(*file);
      if (!loaded) return fail("keys add", loaded.error());
      keys = std::move(*loaded);
    }
    auto key = keys.add(*tenant, a->has("admin"), static_cast<std::int64_t>(std::time(nullptr)));
    if (!key) return fail("keys add", key.error());
    if (auto ok = auth::save_keys(*file, keys); !ok) return fail("keys add", ok.error());
    std::printf("%s\n", key->c_str());
    std::fprintf(stderr, "added key %s for tenant %s%s to %s; the key is shown only now\n",
                 keys.entries().back().id.c_str(), tenant->c_str(), a->has("admin") ? " (admin)" : "", file->c_str());
    return 0;
  }
  auto keys = auth::load_keys(*file);
  if (!keys) return fail(("keys " + sub).c_str(), keys.error());
  if (sub == "limit") {
    const auto tenant = a->get("tenant");
    if (!tenant) return fail("keys limit", {errc::invalid_argument, "--tenant T is required"});
    auth::tenant_limits l = keys->limits_for(*tenant);
    auto rps = a->get_double("requests-per-s", l.requests_per_s, 0, 1e9);
    auto tpm = a->get_double("tokens-per-min", l.tokens_per_min, 0, 1e12);
    auto conc = a->get_int("max-concurrent", l.max_concurrent, 0, 1000000000);
    auto maxt = a->get_int("max-tokens", l.max_tokens, 0, 1000000000);
    auto weight = a->get_double("weight", l.weight, 1e-6, 1e6);
    if (!weight) return fail("keys limit", weight.error());
    if (!rps) return fail("keys limit", rps.error());
    if (!tpm) return fail("keys limit", tpm.error());
    if (!conc) return fail("keys limit", conc.error());
    if (!maxt) return fail("keys limit", maxt.error());
    l = {*rps, *tpm, static_cast<std::uint32_t>(*conc), static_cast<std::uint32_t>(*maxt), *weight};
    if (auto ok = keys->set_limits(*tenant, l); !ok) return fail("keys limit", ok.error());
    if (auto ok = auth::save_keys(*file, *keys); !ok) return fail("keys limit", ok.error());
    std::printf("tenant %s: requests_per_s=%g tokens_per_min=%g max_concurrent=%u max_tokens=%u weight=%g; running "
                "gateways apply it on SIGHUP\n",
                tenant->c_str(), l.requests_per_s, l.tokens_per_min, l.max_concurrent, l.max_tokens, l.weight);
    return 0;
  }
  if (sub == "list") {
    for (const auto& [t, l] : keys->limits())
      std::printf("limits of %s: requests_per_s=%g tokens_per_min=%g max_concurrent=%u max_tokens=%u weight=%g\n",
                  t.c_str(), l.requests_per_s, l.tokens_per_min, l.max_concurrent, l.max_tokens, l.weight);
    std::printf("%-12s  %-24s  %-5s  %s\n", "ID", "TENANT", "ROLE", "CREATED");
    for (const auto& e : keys->entries()) {
      char when[32] = "-";
      const std::time_t t = static_cast<std::time_t>(e.created_unix_s);
      if (std::tm tm{}; gmtime_r(&t, &tm)) std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
      std::printf("%-12s  %-24s  %-5s  %s\n", e.id.c_str(), e.tenant.c_str(), e.admin ? "admin" : "user", when);
    }
    return 0;
  }
  if (sub == "revoke") {
    if (a->positional().size() != 1)
      return fail("keys revoke", {errc::invalid_argument, "give the key's id: exaserve keys revoke ID --file FILE"});
    auto gone = keys->revoke(a->positional().front());
    if (!gone) return fail("keys revoke", gone.error());
    if (auto ok = auth::save_keys(*file, *keys); !ok) return fail("keys revoke", ok.error());
    std::printf("revoked key %s of tenant %s; running gateways drop it on SIGHUP\n", gone->id.c_str(),
                gone->tenant.c_str());
    return 0;
  }
  return fail("keys", {errc::invalid_argument, "unknown subcommand '" + sub + "'\n" + usage});
}

}  // namespace exa::app

// exaserve gen-certs DIR: a cluster CA and one certificate per role, for
// first-time users and tests. DIR/ca.pem (+ ca.key, to sign more later) and
// DIR/ROLE.pem + DIR/ROLE.key for ROLE = controller, node, gateway. Keys are
// EC P-256, certificates SHA-256 signed, valid for ten years; private keys
// are written mode 0600.

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <arpa/inet.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "args.hpp"
#include "cli_util.hpp"
#include "commands.hpp"

namespace exa::app {
namespace {

struct pkey_free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct x509_free {
  void operator()(X509* x) const { X509_free(x); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, pkey_free>;
using x509_ptr = std::unique_ptr<X509, x509_free>;

const std::vector<flag_spec> flags = {
    {"cluster", true, "cluster name put in the certificates' organization (default exaserve)"},
    {"hosts", true, "extra names and IP addresses the certificates are valid for, comma-separated "
                    "(localhost and 127.0.0.1 always are): what HTTPS clients check"},
    {"force", false, "overwrite files that exist"},
    {"help", false, "show this help"},
};

bool add_ext(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (!ext) return false;
  const bool ok = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return ok;
}

// A certificate for `cn` with `key`, signed by (issuer, issuer_key), or
// self-signed as a CA when issuer is null.
expected<x509_ptr> make_cert(const std::string& cn, const std::string& org, EVP_PKEY* key, X509* issuer,
                             EVP_PKEY* issuer_key, const std::string& alt_names = {}) {
  x509_ptr cert(X509_new());
  unsigned char serial[16];
  if (!cert || RAND_bytes(serial, sizeof serial) != 1) return make_error(errc::internal, "OpenSSL: out of memory or entropy");
  serial[0] &= 0x7F;  // a positive serial
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_set_version(cert.get(), 2);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 10L * 365 * 24 * 3600);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(org.c_str()), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509* signer = issuer ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  const bool ca = issuer == nullptr;
  if (!add_ext(cert.get(), signer, NID_basic_constraints, ca ? "critical,CA:TRUE" : "critical,CA:FALSE") ||
      !add_ext(cert.get(), signer, NID_key_usage, ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature") ||
      !add_ext(cert.get(), signer, NID_subject_key_identifier, "hash") ||
      (!ca && !add_ext(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth")) ||
      (!ca && !alt_names.empty() && !add_ext(cert.get(), signer, NID_subject_alt_name, alt_names.c_str())))
    return make_error(errc::internal, "OpenSSL: cannot add certificate extensions");
  if (X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256()) == 0)
    return make_error(errc::internal, "OpenSSL: cannot sign the certificate for " + cn);
  return cert;
}

expected<void> write_pem(const std::string& path, X509* cert, EVP_PKEY* key) {
  // Keys are secrets: created 0600 before anything is written into them.
  const mode_t old = ::umask(key ? 077 : 022);
  FILE* f = std::fopen(path.c_str(), "w");
  ::umask(old);
  if (!f) return make_error(errc::io_error, "cannot write '" + path + "'");
  const bool ok = cert ? PEM_write_X509(f, cert) == 1 : PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) return make_error(errc::io_error, "cannot write '" + path + "'");
  return {};
}

}  // namespace

int cmd_gen_certs(int argc, char** argv) {
  auto a = args::parse(argc, argv, 2, flags);
  if (!a) return fail("gen-certs", a.error());
  if (a->has("help")) {
    std::printf("usage: exaserve gen-certs DIR [--cluster NAME] [--force]\n"
                "writes DIR/ca.pem, DIR/ca.key and DIR/ROLE.pem + DIR/ROLE.key for controller, node, gateway\n%s",
                describe_flags(flags).c_str());
    return 0;
  }
  if (a->positional().size() != 1)
    return fail("gen-certs", {errc::invalid_argument, "give one directory: exaserve gen-certs DIR"});
  const std::string dir = a->positional().front();
  const std::string org = a->get_or("cluster", "exaserve");
  // Subject alternative names: what a TLS client (curl, an OpenAI SDK)
  // checks the server's certificate against.
  std::string alt = "DNS:localhost,IP:127.0.0.1";
  for (std::size_t at = 0; auto h = a->get("hosts"); ) {
    const std::string list = *h;
    while (at <= list.size()) {
      const auto comma = std::min(list.find(',', at), list.size());
      const std::string one = list.substr(at, comma - at);
      at = comma + 1;
      if (one.empty()) continue;
      unsigned char buf[16];
      const bool ip = ::inet_pton(AF_INET, one.c_str(), buf) == 1 || ::inet_pton(AF_INET6, one.c_str(), buf) == 1;
      alt += (ip ? ",IP:" : ",DNS:") + one;
    }
    break;
  }
  const std::vector<std::string> roles = {"controller", "node", "gateway"};
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return fail("gen-certs", {errc::io_error, "cannot create '" + dir + "': " + ec.message()});
  if (!a->has("force"))
    for (const auto& n : std::vector<std::string>{"ca", "controller", "node", "gateway"})
      if (std::filesystem::exists(dir + "/" + n + ".pem") || std::filesystem::exists(dir + "/" + n + ".key"))
        return fail("gen-certs", {errc::invalid_argument, dir + "/" + n + ".pem exists; --force overwrites it"});

  pkey_ptr ca_key(EVP_EC_gen("P-256"));
  if (!ca_key) return fail("gen-certs", {errc::internal, "OpenSSL: cannot generate a key"});
  auto ca = make_cert(org + " cluster CA", org, ca_key.get(), nullptr, nullptr);
  if (!ca) return fail("gen-certs", ca.error());
  if (auto ok = write_pem(dir + "/ca.pem", ca->get(), nullptr); !ok) return fail("gen-certs", ok.error());
  if (auto ok = write_pem(dir + "/ca.key", nullptr, ca_key.get()); !ok) return fail("gen-certs", ok.error());
  for (const auto& role : roles) {
    pkey_ptr key(EVP_EC_gen("P-256"));
    if (!key) return fail("gen-certs", {errc::internal, "OpenSSL: cannot generate a key"});
    auto cert = make_cert(org + " " + role, org, key.get(), ca->get(), ca_key.get(), alt);
    if (!cert) return fail("gen-certs", cert.error());
    if (auto ok = write_pem(dir + "/" + role + ".pem", cert->get(), nullptr); !ok) return fail("gen-certs", ok.error());
    if (auto ok = write_pem(dir + "/" + role + ".key", nullptr, key.get()); !ok) return fail("gen-certs", ok.error());
  }
  std::printf("wrote %s/ca.pem and a certificate and key for controller, node and gateway\n", dir.c_str());
  return 0;
}

}  // namespace exa::app

// OpenSSL's error queue is per thread: an error one connection left there
// made the next connection's harmless "want read" look fatal, and CAF's
// OpenSSL module closed it (one gateway's kill -9 cut the controller off from
// every node). The guard clears the queue before each TLS call.

#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "actors/tls_error_queue.hpp"

namespace {

// A client and a server session joined by an in-memory BIO pair, with the
// handshake done: an established connection with nothing left to read.
struct tls_pair {
  SSL_CTX* server_ctx = SSL_CTX_new(TLS_server_method());
  SSL_CTX* client_ctx = SSL_CTX_new(TLS_client_method());
  SSL* server = nullptr;
  SSL* client = nullptr;

  tls_pair() {
    EVP_PKEY* key = EVP_EC_gen("P-256");
    X509* cert = X509_new();
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), 0);
    X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("test"), -1, -1, 0);
    X509_set_issuer_name(cert, name);
    X509_sign(cert, key, EVP_sha256());
    SSL_CTX_use_certificate(server_ctx, cert);
    SSL_CTX_use_PrivateKey(server_ctx, key);
    X509_free(cert);
    EVP_PKEY_free(key);
    SSL_CTX_set_verify(client_ctx, SSL_VERIFY_NONE, nullptr);
    server = SSL_new(server_ctx);
    client = SSL_new(client_ctx);
    BIO *a = nullptr, *b = nullptr;
    BIO_new_bio_pair(&a, 0, &b, 0);
    SSL_set_bio(client, a, a);
    SSL_set_bio(server, b, b);
    SSL_set_connect_state(client);
    SSL_set_accept_state(server);
    for (int i = 0; i < 20 && !(SSL_is_init_finished(client) && SSL_is_init_finished(server)); ++i) {
      SSL_do_handshake(client);
      SSL_do_handshake(server);
    }
    // One record each way: the client also takes in the server's session
    // tickets (handled by the handshake state machine, which clears the
    // queue itself), so what follows is the plain read path.
    char buf[8];
    SSL_write(server, "x", 1);
    SSL_read(client, buf, sizeof buf);
    SSL_write(client, "y", 1);
    SSL_read(server, buf, sizeof buf);
    ERR_clear_error();
  }
  ~tls_pair() {
    SSL_free(client);
    SSL_free(server);
    SSL_CTX_free(client_ctx);
    SSL_CTX_free(server_ctx);
  }
  bool established() const { return SSL_is_init_finished(client) && SSL_is_init_finished(server); }
};

// What a peer that died mid-record leaves in the queue (OpenSSL 3).
void leave_dead_peers_error() { ERR_raise(ERR_LIB_SSL, SSL_R_UNEXPECTED_EOF_WHILE_READING); }

}  // namespace

TEST_CASE("another connection's leftover OpenSSL error does not make this one's want-read fatal", "[actors][tls]") {
  // Shared libraries (libcaf-openssl) bind to the guard, not to libssl.
  REQUIRE(exa::actors::tls_error_queue_guarded());
  tls_pair p;
  REQUIRE(p.established());
  char buf[64];
  leave_dead_peers_error();
  const int read = SSL_read(p.client, buf, sizeof buf);  // nothing sent: wants more
  CHECK(read == -1);
  CHECK(SSL_get_error(p.client, read) == SSL_ERROR_WANT_READ);
  // And the connection still carries data both ways.
  leave_dead_peers_error();
  CHECK(SSL_write(p.server, "ping", 4) == 4);
  leave_dead_peers_error();
  CHECK(SSL_read(p.client, buf, sizeof buf) == 4);
  ERR_clear_error();
}

TEST_CASE("without the guard libssl reports the leftover error as this connection's", "[actors][tls]") {
  // The behaviour the guard exists for, on libssl's own SSL_read: if OpenSSL
  // ever stops doing this, the guard can go.
  using read_fn = int (*)(SSL*, void*, int);
  auto real_read = reinterpret_cast<read_fn>(::dlvsym(RTLD_NEXT, "SSL_read", "OPENSSL_3.0.0"));
  REQUIRE(real_read);
  REQUIRE(real_read != &SSL_read);
  tls_pair p;
  REQUIRE(p.established());
  char buf[64];
  leave_dead_peers_error();
  const int read = real_read(p.client, buf, sizeof buf);
  CHECK(read == -1);
  CHECK(SSL_get_error(p.client, read) == SSL_ERROR_SSL);
  ERR_clear_error();
}

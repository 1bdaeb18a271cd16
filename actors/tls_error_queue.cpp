#include "actors/tls_error_queue.hpp"

#include <dlfcn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <cstdio>
#include <cstdlib>

namespace {

// libssl's own definition of `name`: the next one after this executable.
void* real(const char* name) {
  void* f = ::dlvsym(RTLD_NEXT, name, "OPENSSL_3.0.0");
  if (!f) f = ::dlsym(RTLD_NEXT, name);
  if (!f) {
    std::fprintf(stderr, "exaserve: fatal: libssl's %s not found (%s)\n", name, ::dlerror());
    std::abort();
  }
  return f;
}

template <class Fn>
Fn real_fn(const char* name) {
  return reinterpret_cast<Fn>(real(name));
}

}  // namespace

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static const auto fn = real_fn<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return fn(ssl, buf, num);
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static const auto fn = real_fn<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return fn(ssl, buf, num);
}

int SSL_connect(SSL* ssl) {
  static const auto fn = real_fn<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return fn(ssl);
}

int SSL_accept(SSL* ssl) {
  static const auto fn = real_fn<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return fn(ssl);
}

}  // extern "C"

namespace exa::actors {

bool tls_error_queue_guarded() {
  return ::dlsym(RTLD_DEFAULT, "SSL_read") == reinterpret_cast<void*>(&::SSL_read);
}

}  // namespace exa::actors

#pragma once
// OpenSSL keeps one error queue per thread, and SSL_get_error() reads it:
// an error left there by one connection makes the next connection's
// harmless "want read" look like a fatal error. CAF 0.17's OpenSSL module
// (libcaf-openssl) never clears the queue, so one peer dying abruptly (its
// "unexpected eof" left queued) made every other TLS connection on the same
// multiplexer thread close within milliseconds: a gateway's kill -9 cut the
// controller off from every node and gateway.
//
// This object defines SSL_read, SSL_write, SSL_connect and SSL_accept in
// the executable; they clear the calling thread's queue and call libssl's
// own (found with dlvsym(RTLD_NEXT)), which is what OpenSSL's manual asks of
// every caller. The dynamic linker binds libcaf-openssl's (and libkj-tls')
// calls to them because an executable's definitions come first.

namespace exa::actors {

/// True when the SSL_read that shared libraries call is this guard's. Calling
/// it also keeps the guard linked into every program that uses TLS.
bool tls_error_queue_guarded();

}  // namespace exa::actors

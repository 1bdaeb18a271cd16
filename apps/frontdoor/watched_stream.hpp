#pragma once
// A connection wrapper that notices when an HTTP client goes away while its
// request is being served.
//
// KJ's HttpServer (0.9.2) does not read the socket while a request handler
// runs, so a client that disconnects while waiting for a long completion, or
// during a stream that has not produced its next token yet, would go
// unnoticed until the next write: the backend would keep generating for no
// one. A handler calls when_peer_closed() once it has read its request body;
// that reads ahead on the socket. EOF or an error means the client is gone.
// Bytes that arrive instead (a pipelined next request) are kept and handed to
// the HTTP parser on its next read, so nothing is lost, and watching stops:
// a client that sends its next request is evidently still there.

#include <kj/async-io.h>

#include <array>

namespace exa::door {

class watched_stream final : public kj::AsyncIoStream {
 public:
  explicit watched_stream(kj::Own<kj::AsyncIoStream> inner) : inner_(kj::mv(inner)) {}

  /// Resolves when the peer closed the connection (or it broke); never
  /// resolves if the peer sent more data instead.
  kj::Promise<void> when_peer_closed();

  kj::Promise<size_t> tryRead(void* buffer, size_t min_bytes, size_t max_bytes) override;
  kj::Promise<void> write(const void* buffer, size_t size) override { return inner_->write(buffer, size); }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return inner_->write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override { inner_->shutdownWrite(); }
  void abortRead() override { inner_->abortRead(); }
  void getsockopt(int level, int option, void* value, kj::uint* length) override {
    inner_->getsockopt(level, option, value, length);
  }
  void setsockopt(int level, int option, const void* value, kj::uint length) override {
    inner_->setsockopt(level, option, value, length);
  }
  void getsockname(struct sockaddr* addr, kj::uint* length) override { inner_->getsockname(addr, length); }
  void getpeername(struct sockaddr* addr, kj::uint* length) override { inner_->getpeername(addr, length); }
  kj::Maybe<int> getFd() const override { return inner_->getFd(); }

 private:
  size_t take_ahead(kj::byte* out, size_t max_bytes);

  // Declaration order is destruction order reversed: the pending read-ahead
  // (peek_) goes first, while the buffer and socket it uses still exist.
  kj::Own<kj::AsyncIoStream> inner_;
  std::array<kj::byte, 4096> ahead_{};
  size_t ahead_begin_ = 0;
  size_t ahead_end_ = 0;
  bool eof_ = false;
  kj::Maybe<kj::Exception> error_;
  bool peek_done_ = false;
  // Forked so that the read completes (and its bytes are kept) even when the
  // handler that asked stops listening; owned here, not by the handler.
  kj::Maybe<kj::ForkedPromise<void>> peek_;
};

}  // namespace exa::door

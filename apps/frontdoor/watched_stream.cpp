#include "watched_stream.hpp"

#include <kj/debug.h>

#include <algorithm>
#include <cstring>

namespace exa::door {

kj::Promise<void> watched_stream::when_peer_closed() {
  if (peek_done_) {
    peek_ = nullptr;
    peek_done_ = false;
  }
  if (eof_ || error_ != nullptr) return kj::READY_NOW;
  if (ahead_begin_ < ahead_end_) return kj::NEVER_DONE;
  if (peek_ == nullptr) {
    ahead_begin_ = ahead_end_ = 0;
    peek_ = inner_->tryRead(ahead_.data(), 1, ahead_.size())
                .then(
                    [this](size_t n) {
                      ahead_end_ = n;
                      eof_ = n == 0;
                      peek_done_ = true;
                    },
                    [this](kj::Exception&& e) {
                      error_ = kj::mv(e);
                      peek_done_ = true;
                    })
                .fork();
  }
  return KJ_ASSERT_NONNULL(peek_).addBranch().then([this]() -> kj::Promise<void> {
    if (eof_ || error_ != nullptr) return kj::READY_NOW;
    return kj::NEVER_DONE;
  });
}

size_t watched_stream::take_ahead(kj::byte* out, size_t max_bytes) {
  const size_t n = std::min(max_bytes, ahead_end_ - ahead_begin_);
  std::memcpy(out, ahead_.data() + ahead_begin_, n);
  ahead_begin_ += n;
  return n;
}

kj::Promise<size_t> watched_stream::tryRead(void* buffer, size_t min_bytes, size_t max_bytes) {
  KJ_IF_MAYBE(p, peek_) {
    // The HTTP parser only reads after the handler finished, but a read-ahead
    // may still be in flight then: wait for it so bytes stay in order.
    if (!peek_done_) {
      return p->addBranch().then(
          [this, buffer, min_bytes, max_bytes]() { return tryRead(buffer, min_bytes, max_bytes); });
    }
    peek_ = nullptr;
    peek_done_ = false;
  }
  auto* out = static_cast<kj::byte*>(buffer);
  const size_t n = take_ahead(out, max_bytes);
  if (n >= min_bytes || eof_) return n;
  KJ_IF_MAYBE(e, error_) {
    if (n > 0) return n;
    return kj::cp(*e);
  }
  if (n == 0) return inner_->tryRead(buffer, min_bytes, max_bytes);
  return inner_->tryRead(out + n, min_bytes - n, max_bytes - n).then([n](size_t more) { return n + more; });
}

}  // namespace exa::door

#pragma once
// Invariant checks that stay on in every build. A failed invariant is a bug in
// ExaServe: it aborts the process (or, inside an actor, the actor) so that its
// supervisor decides what happens next. Caller mistakes are errors, not asserts.

namespace exa::detail {
[[noreturn]] void assertion_failed(const char* expr, const char* file, int line,
                                   const char* message) noexcept;
}  // namespace exa::detail

#define EXA_ASSERT(expr)                                                         \
  do {                                                                           \
    if (!(expr)) [[unlikely]]                                                    \
      ::exa::detail::assertion_failed(#expr, __FILE__, __LINE__, nullptr);       \
  } while (false)

#define EXA_ASSERT_MSG(expr, msg)                                                \
  do {                                                                           \
    if (!(expr)) [[unlikely]]                                                    \
      ::exa::detail::assertion_failed(#expr, __FILE__, __LINE__, (msg));         \
  } while (false)

#pragma once
// The probes' positional numbers, read strictly: the whole argument a decimal
// number within [lo, hi], or the probe prints its usage and exits 2 (so
// `attn_probe --help` or a typo no longer runs with 0).

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace exa::bench {

/// True for -h / --help: print the usage to stdout and exit 0.
inline bool wants_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) return true;
  return false;
}

/// argv[i] as an integer in [lo, hi]; `fallback` when the argument is absent.
/// On anything else: "NAME: WHAT must be an integer in [lo, hi], got 'ARG'",
/// the usage, exit 2.
inline unsigned long count_arg(int argc, char** argv, int i, unsigned long fallback, unsigned long lo,
                               unsigned long hi, const char* what, const char* usage) {
  if (i >= argc) return fallback;
  const char* s = argv[i];
  char* end = nullptr;
  errno = 0;
  const unsigned long v = std::strtoul(s, &end, 10);
  if (*s == '\0' || *s == '-' || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
    std::fprintf(stderr, "%s must be an integer in [%lu, %lu], got '%s'\n%s\n", what, lo, hi, s, usage);
    std::exit(2);
  }
  return v;
}

}  // namespace exa::bench

// What the fuzz targets share: a check that stops the run as a crash, which libFuzzer keeps as
// a finding with the input that caused it.
#pragma once

#include <cstdio>

// A broken invariant: says which, then traps (an abort could be caught by a handler; a trap
// cannot), so that libFuzzer writes the input out as crash-<sha1>.
#define OROCHI_FUZZ_CHECK(condition, message)                                                    \
  do {                                                                                           \
    if (!(condition)) [[unlikely]] {                                                             \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s: %s\n", __FILE__, __LINE__, #condition, \
                   message);                                                                     \
      __builtin_trap();                                                                          \
    }                                                                                            \
  } while (false)

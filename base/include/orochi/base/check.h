// Internal invariant checks. A failed OROCHI_INTERNAL_ASSERT is a bug in Orochi, never a user
// error: it prints where and why, then aborts. User errors are reported with Status instead.
#pragma once

namespace orochi::detail {
[[noreturn]] void InternalAssertFailed(const char* condition, const char* file, int line,
                                       const char* message);
}  // namespace orochi::detail

#define OROCHI_INTERNAL_ASSERT(condition, message)                                     \
  do {                                                                                 \
    if (!(condition)) [[unlikely]]                                                     \
      ::orochi::detail::InternalAssertFailed(#condition, __FILE__, __LINE__, message); \
  } while (false)

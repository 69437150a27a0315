// Errors of the engine's tensor API.
//
// Ops report user errors (bad shapes, unsupported dtypes, writes to read-only tensors) by
// throwing orochi::engine::Error, which carries a Status; OROCHI_CHECK is the one way to raise
// it. Functions that do I/O (safetensors) return Result<T> instead. Broken internal invariants
// are OROCHI_INTERNAL_ASSERT failures, never Errors.
#pragma once

#include <exception>
#include <sstream>
#include <string>

#include "orochi/base/status.h"
#include "orochi/engine/export.h"

namespace orochi::engine {

class OROCHI_ENGINE_API Error : public std::exception {
 public:
  explicit Error(Status status);
  const char* what() const noexcept override;
  const Status& status() const { return status_; }

 private:
  Status status_;
};

namespace detail {
[[noreturn]] OROCHI_ENGINE_API void Throw(StatusCode code, const std::string& message);
}  // namespace detail

}  // namespace orochi::engine

// OROCHI_CHECK(condition, code, message parts...) throws Error(code, "message parts") when the
// condition is false; the parts are streamed, so any printable value may be given.
#define OROCHI_CHECK(condition, code, ...)                               \
  do {                                                                   \
    if (!(condition)) [[unlikely]] {                                     \
      std::ostringstream orochi_check_message;                           \
      orochi_check_message << __VA_ARGS__;                               \
      ::orochi::engine::detail::Throw(code, orochi_check_message.str()); \
    }                                                                    \
  } while (false)

#define OROCHI_CHECK_ARG(condition, ...) \
  OROCHI_CHECK(condition, ::orochi::StatusCode::kInvalidArgument, __VA_ARGS__)

// A dimension or an index outside its range: kOutOfRange, which Python sees as IndexError (as
// PyTorch raises it), where other argument errors are RuntimeError.
#define OROCHI_CHECK_RANGE(condition, ...) \
  OROCHI_CHECK(condition, ::orochi::StatusCode::kOutOfRange, __VA_ARGS__)

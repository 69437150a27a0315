#include "orochi/base/status.h"

#include <cstdio>
#include <cstdlib>

#include "orochi/base/check.h"

namespace orochi {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case StatusCode::kOutOfRange:
      return "OUT_OF_RANGE";
    case StatusCode::kNotFound:
      return "NOT_FOUND";
    case StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case StatusCode::kPythonError:
      return "PYTHON_ERROR";
    case StatusCode::kInternal:
      return "INTERNAL";
    case StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string text(StatusCodeName(code_));
  text += ": ";
  text += message_;
  if (!detail_.empty()) {
    text += '\n';
    text += detail_;
  }
  return text;
}

void DieOnBadResultAccess(const Status& status) {
  detail::InternalAssertFailed("result.ok()", __FILE__, __LINE__, status.ToString().c_str());
}

namespace detail {

void InternalAssertFailed(const char* condition, const char* file, int line, const char* message) {
  std::fprintf(stderr, "orochi: internal assertion failed: %s at %s:%d: %s\n", condition, file,
               line, message);
  std::fflush(stderr);
  std::abort();
}

}  // namespace detail
}  // namespace orochi

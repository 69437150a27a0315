// Status and Result<T>: the one error type of Orochi's library APIs.
//
// A Status is a code and a human-readable message, plus an optional detail (for Python errors,
// the formatted traceback). Library functions that can fail for reasons outside the caller's
// control (bad input, a Python exception, an unloaded interpreter) return a Status or a
// Result<T>; broken internal invariants are not Statuses but OROCHI_INTERNAL_ASSERT failures.
//
// Both types are plain values: copyable, movable, and safe to share between threads once built.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace orochi {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller's input is malformed
  kOutOfRange,       // a dimension or an index outside its range (IndexError in Python)
  kNotFound,         // a named thing (model, module, function) does not exist
  kAlreadyExists,
  kFailedPrecondition,  // the system is not in a state where the call can succeed
  kUnavailable,         // temporarily unable to serve, e.g. an unloaded interpreter copy
  kResourceExhausted,   // a limit was hit (queue, memory, size)
  kDeadlineExceeded,
  kPythonError,  // user Python code raised; detail() holds the traceback
  kInternal,     // a bug or an unexpected failure of the system
  kUnimplemented,
};

// Returns the stable name of `code`, e.g. "INVALID_ARGUMENT".
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message, std::string detail = {})
      : code_(code), message_(std::move(message)), detail_(std::move(detail)) {}

  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  const std::string& detail() const { return detail_; }

  // "CODE: message", followed by the detail on its own lines when there is one.
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  std::string detail_;
};

// One factory per error code, so that call sites read as the failure they report.
inline Status InvalidArgument(std::string message) {
  return {StatusCode::kInvalidArgument, std::move(message)};
}
inline Status OutOfRange(std::string message) {
  return {StatusCode::kOutOfRange, std::move(message)};
}
inline Status NotFound(std::string message) { return {StatusCode::kNotFound, std::move(message)}; }
inline Status AlreadyExists(std::string message) {
  return {StatusCode::kAlreadyExists, std::move(message)};
}
inline Status FailedPrecondition(std::string message) {
  return {StatusCode::kFailedPrecondition, std::move(message)};
}
inline Status Unavailable(std::string message) {
  return {StatusCode::kUnavailable, std::move(message)};
}
inline Status ResourceExhausted(std::string message) {
  return {StatusCode::kResourceExhausted, std::move(message)};
}
inline Status DeadlineExceeded(std::string message) {
  return {StatusCode::kDeadlineExceeded, std::move(message)};
}
// `traceback`: the formatted Python traceback, kept as the Status's detail.
inline Status PythonError(std::string message, std::string traceback = {}) {
  return {StatusCode::kPythonError, std::move(message), std::move(traceback)};
}
inline Status Internal(std::string message) { return {StatusCode::kInternal, std::move(message)}; }
inline Status Unimplemented(std::string message) {
  return {StatusCode::kUnimplemented, std::move(message)};
}

// Either a value or a non-OK Status. Accessing value() of an error is an internal-assert
// failure, so callers test ok() first (or use OROCHI_ASSIGN_OR_RETURN).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : state_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(state_).ok()) {
      state_ = Internal("Result built from an OK Status without a value");
    }
  }

  bool ok() const { return std::holds_alternative<T>(state_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(state_);
  }
  T& value() & { return Checked(); }
  const T& value() const& { return const_cast<Result*>(this)->Checked(); }
  T&& value() && { return std::move(Checked()); }
  T& operator*() & { return Checked(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(Checked()); }
  T* operator->() { return &Checked(); }
  const T* operator->() const { return &const_cast<Result*>(this)->Checked(); }

 private:
  T& Checked();
  std::variant<T, Status> state_;
};

[[noreturn]] void DieOnBadResultAccess(const Status& status);

template <typename T>
T& Result<T>::Checked() {
  if (!ok()) DieOnBadResultAccess(std::get<Status>(state_));
  return std::get<T>(state_);
}

}  // namespace orochi

#define OROCHI_STATUS_CONCAT_INNER(a, b) a##b
#define OROCHI_STATUS_CONCAT(a, b) OROCHI_STATUS_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function when it is not OK.
#define OROCHI_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::orochi::Status orochi_status_ = (expr);        \
    if (!orochi_status_.ok()) return orochi_status_; \
  } while (false)

// NOLINTBEGIN(bugprone-macro-parentheses): `lhs` may be a declaration, so it stays bare.
// Evaluates a Result-returning `expr`; returns its Status on error, else moves the value into
// `lhs` (which may be a declaration: OROCHI_ASSIGN_OR_RETURN(auto x, F());).
#define OROCHI_ASSIGN_OR_RETURN(lhs, expr)                          \
  auto OROCHI_STATUS_CONCAT(orochi_result_, __LINE__) = (expr);     \
  if (!OROCHI_STATUS_CONCAT(orochi_result_, __LINE__).ok())         \
    return OROCHI_STATUS_CONCAT(orochi_result_, __LINE__).status(); \
  lhs = std::move(OROCHI_STATUS_CONCAT(orochi_result_, __LINE__)).value()
// NOLINTEND(bugprone-macro-parentheses)

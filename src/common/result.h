// Result<T>: the value of an operation that can fail for a reason the caller must handle
// (untrusted input, environment failures). Broken invariants are not Results: they abort.
// A small hand-written type because C++20 has no std::expected and boost::system::result
// ties every error to an error_category, while our errors carry a stable code and a message
// meant for people.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace space {

// Names (errorCodeName) match the Connect protocol's codes, so the guest agent's errors keep
// their identity through every layer up to the API.
enum class ErrorCode {
  kInvalidArgument,     // the request itself is wrong; retrying will not help
  kNotFound,            // a named thing does not exist
  kAlreadyExists,       // it exists and the request wanted to create it
  kPermissionDenied,    // the caller may not do this
  kFailedPrecondition,  // not possible in the current state
  kResourceExhausted,   // a limit, the disk or the host's capacity would be exceeded
  kDeadlineExceeded,    // something did not happen in time
  kUnavailable,         // a peer (QEMU, the guest) went away or misbehaved
  kUnimplemented,       // no such operation
  kCanceled,            // the caller gave up
  kInternal,            // an environment failure: a syscall, a file, a process
};

const char* errorCodeName(ErrorCode code);

struct Error {
  ErrorCode code;
  std::string message;
  // A finer, stable name for clients where the code is too coarse (e.g. "too_many_sandboxes"
  // vs "insufficient_capacity", both kResourceExhausted). Empty: the code's name serves.
  std::string reason;
};

inline Error makeError(ErrorCode code, std::string message, std::string reason = {}) {
  return Error{code, std::move(message), std::move(reason)};
}

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  T* operator->() { return &value(); }
  T& operator*() & { return value(); }

  const Error& error() const {
    assert(!ok());
    return std::get<1>(v_);
  }

 private:
  std::variant<T, Error> v_;
};

// Result<void> as a Result of an empty value, so one template serves both.
struct Ok {};
using Status = Result<Ok>;
inline Status okStatus() { return Ok{}; }

}  // namespace space

// Propagates the error of an expression returning Result/Status from the enclosing function.
#define SPACE_TRY(expr)                                            \
  do {                                                             \
    auto space_try_result_ = (expr);                               \
    if (!space_try_result_.ok()) return space_try_result_.error(); \
  } while (0)

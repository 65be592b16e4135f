// A streaming reader of multipart/form-data bodies (RFC 7578): part headers are parsed, part
// contents are handed out as they arrive, so a large file upload never sits in memory whole.
// Written here because Boost.Beast has no multipart support and the Debian-packaged
// alternatives parse whole bodies in memory.
//
// Clients are not trusted: the preamble, each part's header block and the number of parts are
// bounded, and every malformation is an invalid_argument error naming what was wrong.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"

namespace space::http {

// The boundary parameter of a multipart/form-data Content-Type; nullopt for another type or a
// missing or invalid boundary (1-70 characters, RFC 2046).
std::optional<std::string> multipartBoundary(std::string_view content_type);

class MultipartReader {
 public:
  // Up to `max` bytes of the body; 0 at its end.
  using ReadFn = std::function<Result<size_t>(char* out, size_t max)>;

  static constexpr size_t kMaxPreamble = 16 * 1024;
  static constexpr size_t kMaxPartHeader = 16 * 1024;
  static constexpr size_t kMaxParts = 1000;

  MultipartReader(std::string boundary, ReadFn read);

  struct Part {
    std::string name;                     // Content-Disposition's name
    std::optional<std::string> filename;  // its filename, when it has one
    std::string content_type;             // "" when not given
  };
  // Moves to the next part (skipping what is left of the current one) and returns its
  // headers; nullopt after the closing delimiter.
  Result<std::optional<Part>> next();
  // Up to `max` (> 0) bytes of the current part's content; 0 at the end of the part.
  Result<size_t> readSome(char* out, size_t max);

 private:
  enum class State { kPreamble, kPartHeaders, kPartBody, kAfterDelimiter, kDone };
  // Reads more of the body into buffer_; false at the body's end.
  Result<bool> fill();
  Status skipToFirstDelimiter();
  Result<std::optional<Part>> readHeaders();

  std::string delimiter_;  // "\r\n--" + boundary
  ReadFn read_;
  std::string buffer_;
  size_t pos_ = 0;
  bool eof_ = false;
  State state_ = State::kPreamble;
  size_t parts_ = 0;
};

}  // namespace space::http

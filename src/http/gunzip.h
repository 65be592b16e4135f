// Decompresses a gzip body as it is read (zlib), for uploads a client sends with
// `Content-Encoding: gzip`: nothing is held but zlib's window and one buffer of input.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/result.h"

namespace space::http {

class GunzipReader {
 public:
  // Up to `max` bytes of the compressed body; 0 at its end.
  using ReadFn = std::function<Result<size_t>(char* out, size_t max)>;

  explicit GunzipReader(ReadFn read);
  ~GunzipReader();
  GunzipReader(const GunzipReader&) = delete;
  GunzipReader& operator=(const GunzipReader&) = delete;

  // Up to `max` (> 0) decompressed bytes; 0 at the end of the body. Several gzip members one
  // after another are read as one. Errors (invalid_argument): data that is not gzip, a corrupt
  // or truncated member, bytes after the last one that are not a member.
  Result<size_t> readSome(char* out, size_t max);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace space::http

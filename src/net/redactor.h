// Masks secret values in a stream of bytes (a credentialed request's answer, on its way to the
// guest): a server that echoes request headers back (many do, for debugging) must not hand the
// guest the value the gateway added. Each occurrence of a value becomes as many '*' (the length
// stays, so Content-Length and chunk sizes still hold). A value split across two reads is found
// too: the last (longest value - 1) bytes are held back until more come or the stream ends.
// Not found: a value the server transformed (compressed, encoded, split by chunk framing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace space::net {

class Redactor {
 public:
  // Values shorter than kMinValueBytes are not masked: they would mask ordinary text.
  static constexpr size_t kMinValueBytes = 8;
  explicit Redactor(std::vector<std::string> values);
  ~Redactor();
  Redactor(const Redactor&) = delete;
  Redactor& operator=(const Redactor&) = delete;

  // The next bytes of the stream in; what can be passed on now out (appended to `out`).
  void feed(std::span<const uint8_t> in, std::vector<uint8_t>& out);
  // The stream ended: whatever was held back, masked.
  void finish(std::vector<uint8_t>& out);
  size_t masked() const { return masked_; }  // occurrences masked so far
  bool holding() const { return !held_.empty(); }

 private:
  void mask(std::vector<uint8_t>& bytes);
  std::vector<std::string> values_;
  size_t longest_ = 0;
  std::vector<uint8_t> held_;
  size_t masked_ = 0;
};

}  // namespace space::net

// Masks secret values in a credentialed request's answer on its way to the guest: a server that
// echoes request headers back (many do, for debugging) must not hand the guest the value the
// gateway added. Each occurrence becomes as many '*' (lengths stay, so Content-Length and chunk
// sizes still hold). The answer is followed as HTTP/1.1: its head is held until complete; a
// chunked body is matched with its chunk framing taken out (a value split by a chunk boundary is
// found too); an answer with a Content-Encoding (compressed: unreadable here) is refused. A value
// split across reads is found: the last (longest value - 1) text bytes wait for more or the end.
// Not found: a value the server transformed otherwise (escaped, encoded, truncated).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace space::net {

class Redactor {
 public:
  // Values shorter than this are not masked (they would mask ordinary text); the gateway does
  // not send secrets that short.
  static constexpr size_t kMinValueBytes = 8;
  static constexpr size_t kMaxHeadBytes = 64 * 1024;

  // `head_request`: the request was HEAD, so a final answer has no body.
  Redactor(std::vector<std::string> values, bool head_request);
  ~Redactor();
  Redactor(const Redactor&) = delete;
  Redactor& operator=(const Redactor&) = delete;

  // The next bytes of the answer in; what can be passed on now out (appended to `out`). Nothing
  // more comes out once refused().
  void feed(std::span<const uint8_t> in, std::vector<uint8_t>& out);
  // The answer ended: whatever was held back, masked.
  void finish(std::vector<uint8_t>& out);
  size_t masked() const { return masked_; }  // occurrences masked so far
  bool holding() const { return !held_.empty(); }
  // Why the answer cannot be passed on (empty: it can).
  const std::string& refused() const { return refused_; }

 private:
  enum class Phase {
    kHead,
    kBody,
    kChunkSize,
    kChunkExt,
    kChunkSizeLf,
    kChunkData,
    kChunkDataCr,
    kChunkDataLf,
    kTrailer
  };
  void classify(size_t from);  // sets text_ for held_[from..]
  void startBody(size_t head_end);
  void mask();
  void release(std::vector<uint8_t>& out, bool all);

  std::vector<std::string> values_;
  size_t longest_ = 0;
  bool head_request_;
  std::vector<uint8_t> held_;
  std::vector<uint8_t> text_;  // per held byte: 1 if it is the answer's text (not chunk framing)
  Phase phase_ = Phase::kHead;
  size_t head_start_ = 0;       // where the head being read starts (in held_)
  size_t head_scan_ = 0;        // where to look for its end next (in held_)
  uint64_t chunk_left_ = 0;     // bytes of the current chunk's data still to come
  size_t chunk_ext_bytes_ = 0;  // of the current size line's extension
  int trailer_line_bytes_ = 0;  // of the current trailer line (0: at a line's start)
  size_t masked_ = 0;
  std::string refused_;
};

}  // namespace space::net

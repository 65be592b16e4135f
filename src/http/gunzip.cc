#include "http/gunzip.h"

#include <zlib.h>

namespace space::http {

struct GunzipReader::State {
  ReadFn read;
  z_stream zs{};
  bool initialized = false;
  bool input_done = false;   // the compressed body ended
  bool stream_done = false;  // the gzip stream ended
  char in[16 * 1024];

  // When zlib has taken all input: reads more, or notes the body's end.
  Status refill() {
    if (zs.avail_in > 0 || input_done) return okStatus();
    auto n = read(in, sizeof in);
    if (!n.ok()) return n.error();
    if (n.value() == 0) {
      input_done = true;
    } else {
      zs.next_in = reinterpret_cast<Bytef*>(in);
      zs.avail_in = static_cast<uInt>(n.value());
    }
    return okStatus();
  }
};

namespace {
Error corrupt(const std::string& what) { return makeError(ErrorCode::kInvalidArgument, "gzip body: " + what); }
}  // namespace

GunzipReader::GunzipReader(ReadFn read) : state_(std::make_unique<State>()) {
  state_->read = std::move(read);
  // 16 + MAX_WBITS: a gzip wrapper (header and CRC checked), not raw deflate or zlib.
  state_->initialized = inflateInit2(&state_->zs, 16 + MAX_WBITS) == Z_OK;
}

GunzipReader::~GunzipReader() {
  if (state_->initialized) inflateEnd(&state_->zs);
}

Result<size_t> GunzipReader::readSome(char* out, size_t max) {
  State& s = *state_;
  if (!s.initialized) return makeError(ErrorCode::kInternal, "gzip: zlib could not start");
  if (max == 0) return size_t{0};
  while (true) {
    if (s.stream_done) {
      // More after a member is another member (RFC 1952 allows several); anything else fails
      // its header check below.
      if (auto st = s.refill(); !st.ok()) return st.error();
      if (s.zs.avail_in == 0) return size_t{0};
      if (inflateReset(&s.zs) != Z_OK) return corrupt("cannot read the next member");
      s.stream_done = false;
    }
    if (auto st = s.refill(); !st.ok()) return st.error();
    s.zs.next_out = reinterpret_cast<Bytef*>(out);
    s.zs.avail_out = static_cast<uInt>(std::min<size_t>(max, 1 << 30));
    const int rc = inflate(&s.zs, Z_NO_FLUSH);
    const size_t produced = std::min<size_t>(max, 1 << 30) - s.zs.avail_out;
    if (rc == Z_STREAM_END) {
      s.stream_done = true;
    } else if (rc == Z_BUF_ERROR) {
      if (s.input_done && produced == 0) return corrupt("truncated");
    } else if (rc != Z_OK) {
      return corrupt(s.zs.msg ? s.zs.msg : "not gzip data");
    }
    if (produced > 0) return produced;
    if (s.input_done && !s.stream_done) return corrupt("truncated");
  }
}

}  // namespace space::http

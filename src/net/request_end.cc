#include "net/request_end.h"

#include <algorithm>

#include "net/sniff.h"

namespace space::net {

namespace http = boost::beast::http;

RequestEnd::RequestEnd() {
  // The rewritten head: the guest's (kMaxSniffBytes at most) with the rule's headers and the
  // placeholders' values added (each field at most 64 KiB, Beast's own limit).
  parser_.header_limit(kMaxHeadBytes);
  parser_.body_limit(boost::none);  // an upload of any size is one request
  parser_.eager(true);
}

size_t RequestEnd::take(std::span<const uint8_t> bytes) {
  const uint64_t start = fed_;
  fed_ += bytes.size();
  if (ended_ || failed_) return 0;
  pending_.insert(pending_.end(), bytes.begin(), bytes.end());
  while (!pending_.empty() && !parser_.is_done()) {
    parser_.get().body().data = scratch_.data();
    parser_.get().body().size = scratch_.size();
    boost::system::error_code ec;
    size_t n = parser_.put(boost::asio::buffer(pending_.data(), pending_.size()), ec);
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n));
    consumed_ += n;
    if (ec == http::error::need_buffer) continue;  // the scratch buffer was full: dropped, go on
    if (ec == http::error::need_more) break;
    if (ec) {
      failed_ = true;
      return 0;
    }
    if (n == 0) break;
  }
  if (pending_.size() > kMaxPendingBytes) {
    failed_ = true;
    return 0;
  }
  if (!parser_.is_done()) return bytes.size();
  ended_ = true;
  pending_.clear();
  // The end lies in this call's bytes (the parser consumed nothing beyond what it was fed).
  return static_cast<size_t>(std::min<uint64_t>(bytes.size(), consumed_ - std::min(consumed_, start)));
}

}  // namespace space::net

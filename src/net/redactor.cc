#include "net/redactor.h"

#include <algorithm>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <cctype>
#include <cstring>

namespace space::net {

namespace http = boost::beast::http;

Redactor::Redactor(std::vector<std::string> values, bool head_request) : head_request_(head_request) {
  for (auto& value : values) {
    if (value.size() >= kMinValueBytes) {
      longest_ = std::max(longest_, value.size());
      values_.push_back(std::move(value));
    } else {
      explicit_bzero(value.data(), value.size());
    }
  }
  // Longest first: a value that contains another is masked whole.
  std::sort(values_.begin(), values_.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
}

Redactor::~Redactor() {
  for (auto& value : values_) explicit_bzero(value.data(), value.size());
  explicit_bzero(held_.data(), held_.size());
}

// The head is complete at held_[0..head_end): its status and framing say what follows.
void Redactor::startBody(size_t head_end) {
  http::response_parser<http::empty_body> parser;
  parser.eager(false);
  parser.skip(head_request_);
  boost::system::error_code ec;
  parser.put(boost::asio::buffer(held_.data() + head_start_, head_end - head_start_), ec);
  if ((ec && ec != http::error::need_more) || !parser.is_header_done()) {
    refused_ = "the server's answer is not an HTTP/1.x response head";
    return;
  }
  const auto& response = parser.get();
  const unsigned status = response.result_int();
  if (status >= 100 && status < 200 && status != 101) {
    phase_ = Phase::kHead;  // an interim answer (100 Continue): the final head follows
    head_start_ = head_end;
    head_scan_ = head_end;
    return;
  }
  if (auto encoding = response.find(http::field::content_encoding);
      encoding != response.end() && !boost::beast::iequals(encoding->value(), "identity")) {
    refused_ = "the server's answer is encoded (" + std::string(encoding->value().substr(0, 32)) +
               ") though identity was asked for: a secret in it could not be masked";
    return;
  }
  const bool no_body = head_request_ || status == 204 || status == 304;
  phase_ = !no_body && parser.chunked() ? Phase::kChunkSize : Phase::kBody;
}

// Marks which of held_[from..] are text, following the answer's framing.
void Redactor::classify(size_t from) {
  text_.resize(held_.size(), 1);
  for (size_t i = from; i < held_.size() && refused_.empty(); ++i) {
    const uint8_t c = held_[i];
    switch (phase_) {
      case Phase::kHead: text_[i] = 1; break;
      case Phase::kBody:
      case Phase::kTrailer: text_[i] = 1; break;
      case Phase::kChunkSize:
        text_[i] = 0;
        if (std::isxdigit(c)) {
          if (chunk_left_ > (uint64_t{1} << 40)) refused_ = "a chunk size out of range";
          chunk_left_ =
              chunk_left_ * 16 + static_cast<uint64_t>(std::isdigit(c) ? c - '0' : (std::tolower(c) - 'a' + 10));
        } else if (c == ';' || c == ' ' || c == '\t') {
          phase_ = Phase::kChunkExt;
          chunk_ext_bytes_ = 0;
        } else if (c == '\r') {
          phase_ = Phase::kChunkSizeLf;
        } else {
          refused_ = "a malformed chunk size line";
        }
        break;
      case Phase::kChunkExt:
        text_[i] = 0;
        if (c == '\r') {
          phase_ = Phase::kChunkSizeLf;
        } else if (++chunk_ext_bytes_ > 4096) {
          refused_ = "a chunk extension over 4 KiB";
        }
        break;
      case Phase::kChunkSizeLf:
        text_[i] = 0;
        if (c != '\n') {
          refused_ = "a malformed chunk size line";
        } else if (chunk_left_ == 0) {
          phase_ = Phase::kTrailer;
        } else {
          phase_ = Phase::kChunkData;
        }
        break;
      case Phase::kChunkData:
        text_[i] = 1;
        if (--chunk_left_ == 0) phase_ = Phase::kChunkDataCr;
        break;
      case Phase::kChunkDataCr:
        text_[i] = 0;
        if (c != '\r') refused_ = "a chunk without its CRLF";
        phase_ = Phase::kChunkDataLf;
        break;
      case Phase::kChunkDataLf:
        text_[i] = 0;
        if (c != '\n') refused_ = "a chunk without its CRLF";
        phase_ = Phase::kChunkSize;
        break;
    }
  }
}

void Redactor::mask() {
  // The text alone (chunk framing taken out), with where each of its bytes is in held_.
  std::string text;
  std::vector<size_t> at;
  text.reserve(held_.size());
  at.reserve(held_.size());
  for (size_t i = 0; i < held_.size(); ++i) {
    if (text_[i]) {
      text.push_back(static_cast<char>(held_[i]));
      at.push_back(i);
    }
  }
  for (const std::string& value : values_) {
    for (size_t found = text.find(value); found != std::string::npos; found = text.find(value, found + value.size())) {
      for (size_t k = found; k < found + value.size(); ++k) {
        held_[at[k]] = '*';
        text[k] = '*';
      }
      ++masked_;
    }
  }
  explicit_bzero(text.data(), text.size());
}

// Passes on what no value can still be part of: all but the last (longest - 1) text bytes (and
// the framing between them), or everything when `all`.
void Redactor::release(std::vector<uint8_t>& out, bool all) {
  size_t pass = held_.size();
  if (!all && longest_ > 1) {
    size_t need = longest_ - 1;
    for (size_t i = held_.size(); i > 0 && need > 0; --i) {
      if (text_[i - 1]) {
        pass = i - 1;
        --need;
      }
    }
    if (need > 0) pass = 0;  // fewer text bytes than that: all wait
  }
  out.insert(out.end(), held_.begin(), held_.begin() + static_cast<std::ptrdiff_t>(pass));
  held_.erase(held_.begin(), held_.begin() + static_cast<std::ptrdiff_t>(pass));
  text_.erase(text_.begin(), text_.begin() + static_cast<std::ptrdiff_t>(pass));
  head_scan_ = head_scan_ > pass ? head_scan_ - pass : 0;
  head_start_ = head_start_ > pass ? head_start_ - pass : 0;
}

void Redactor::feed(std::span<const uint8_t> in, std::vector<uint8_t>& out) {
  if (!refused_.empty()) return;
  size_t from = held_.size();
  held_.insert(held_.end(), in.begin(), in.end());
  // Heads are held whole: their end decides how the rest is read.
  while (phase_ == Phase::kHead && refused_.empty()) {
    const uint8_t kEnd[] = {'\r', '\n', '\r', '\n'};
    size_t start = head_scan_ >= 3 ? head_scan_ - 3 : 0;
    auto end =
        std::search(held_.begin() + static_cast<std::ptrdiff_t>(start), held_.end(), std::begin(kEnd), std::end(kEnd));
    if (end == held_.end()) {
      head_scan_ = held_.size();
      if (held_.size() > kMaxHeadBytes) refused_ = "the server's answer head is over 64 KiB";
      classify(from);
      return;
    }
    const size_t head_end = static_cast<size_t>(end - held_.begin()) + 4;
    text_.resize(held_.size(), 1);
    for (size_t i = from; i < head_end; ++i) text_[i] = 1;
    from = std::max(from, head_end);
    startBody(head_end);
  }
  if (!refused_.empty()) return;
  classify(from);
  if (!refused_.empty()) return;
  if (values_.empty()) return release(out, true);
  mask();
  release(out, false);
}

void Redactor::finish(std::vector<uint8_t>& out) {
  if (!refused_.empty()) return;
  text_.resize(held_.size(), 1);
  mask();
  release(out, true);
}

}  // namespace space::net

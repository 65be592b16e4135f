#include "net/redactor.h"

#include <algorithm>
#include <cstring>

namespace space::net {

Redactor::Redactor(std::vector<std::string> values) {
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

void Redactor::mask(std::vector<uint8_t>& bytes) {
  for (const std::string& value : values_) {
    auto from = bytes.begin();
    for (;;) {
      auto at = std::search(from, bytes.end(), value.begin(), value.end());
      if (at == bytes.end()) break;
      std::fill(at, at + static_cast<std::ptrdiff_t>(value.size()), '*');
      ++masked_;
      from = at + static_cast<std::ptrdiff_t>(value.size());
    }
  }
}

void Redactor::feed(std::span<const uint8_t> in, std::vector<uint8_t>& out) {
  if (values_.empty()) {
    out.insert(out.end(), in.begin(), in.end());
    return;
  }
  held_.insert(held_.end(), in.begin(), in.end());
  mask(held_);
  // The tail may be the start of a value whose rest comes next: kept (a whole value there was
  // masked already, so no unmasked value ends inside it).
  const size_t keep = std::min(held_.size(), longest_ - 1);
  const size_t pass = held_.size() - keep;
  out.insert(out.end(), held_.begin(), held_.begin() + static_cast<std::ptrdiff_t>(pass));
  held_.erase(held_.begin(), held_.begin() + static_cast<std::ptrdiff_t>(pass));
}

void Redactor::finish(std::vector<uint8_t>& out) {
  mask(held_);
  out.insert(out.end(), held_.begin(), held_.end());
  held_.clear();
}

}  // namespace space::net

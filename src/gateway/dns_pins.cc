#include "gateway/dns_pins.h"

#include <algorithm>

namespace space::gateway {

void DnsPins::unindex(const std::string& name, uint32_t ip) {
  auto it = by_ip_.find(ip);
  if (it == by_ip_.end()) return;
  it->second.erase(name);
  if (it->second.empty()) by_ip_.erase(it);
}

void DnsPins::evict(const std::string& name) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return;
  for (const auto& [ip, expiry] : it->second.ips) unindex(name, ip);
  order_.erase(it->second.order);
  by_name_.erase(it);
}

void DnsPins::pin(const std::string& name, const std::vector<uint32_t>& ips, Clock::time_point expiry,
                  Clock::time_point now) {
  if (ips.empty() || max_names_ == 0 || max_ips_per_name_ == 0) return;
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    while (by_name_.size() >= max_names_) evict(order_.front());
    order_.push_back(name);
    it = by_name_.emplace(name, Entry{std::prev(order_.end()), {}}).first;
  } else {
    order_.splice(order_.end(), order_, it->second.order);
  }
  auto& pinned = it->second.ips;
  // Expired addresses go first, so they never crowd out live ones.
  std::erase_if(pinned, [&](const auto& p) {
    if (p.second > now) return false;
    unindex(name, p.first);
    return true;
  });
  for (uint32_t ip : ips) {
    auto same = std::find_if(pinned.begin(), pinned.end(), [&](const auto& p) { return p.first == ip; });
    if (same != pinned.end()) {
      same->second = std::max(same->second, expiry);
      continue;
    }
    if (pinned.size() >= max_ips_per_name_) {
      // Full: the address closest to its expiry makes room.
      auto soonest = std::min_element(pinned.begin(), pinned.end(),
                                      [](const auto& a, const auto& b) { return a.second < b.second; });
      unindex(name, soonest->first);
      pinned.erase(soonest);
    }
    pinned.emplace_back(ip, expiry);
    by_ip_[ip].insert(name);
  }
}

std::vector<std::string> DnsPins::namesFor(uint32_t ip, Clock::time_point now) const {
  std::vector<std::string> out;
  auto it = by_ip_.find(ip);
  if (it == by_ip_.end()) return out;
  for (const auto& name : it->second) {
    const auto& pinned = by_name_.at(name).ips;
    bool live =
        std::any_of(pinned.begin(), pinned.end(), [&](const auto& p) { return p.first == ip && p.second > now; });
    if (live) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace space::gateway

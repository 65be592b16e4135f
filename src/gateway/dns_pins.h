// The DNS answers the gateway gave its guest, by name: a connection may claim a name (SNI, Host)
// only towards an address that name was answered with (no domain fronting), and a connection to
// an address is credited with the names that resolved to it. Bounded, since the guest chooses
// the names: at most max_names names of max_ips_per_name addresses; the oldest go first.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace space::gateway {

class DnsPins {
 public:
  using Clock = std::chrono::steady_clock;

  explicit DnsPins(size_t max_names = 4096, size_t max_ips_per_name = 32)
      : max_names_(max_names), max_ips_per_name_(max_ips_per_name) {}

  // Pins `ips` for `name` until `expiry`. Addresses pinned earlier for the name stay until their
  // own expiry (round-robin DNS: the guest may still hold an older answer).
  void pin(const std::string& name, const std::vector<uint32_t>& ips, Clock::time_point expiry, Clock::time_point now);
  // The names with an unexpired pin on `ip`, sorted.
  std::vector<std::string> namesFor(uint32_t ip, Clock::time_point now) const;
  size_t names() const { return by_name_.size(); }

 private:
  struct Entry {
    std::list<std::string>::iterator order;
    std::vector<std::pair<uint32_t, Clock::time_point>> ips;
  };
  void unindex(const std::string& name, uint32_t ip);
  void evict(const std::string& name);

  size_t max_names_;
  size_t max_ips_per_name_;
  std::list<std::string> order_;  // least recently pinned first
  std::unordered_map<std::string, Entry> by_name_;
  std::unordered_map<uint32_t, std::unordered_set<std::string>> by_ip_;
};

}  // namespace space::gateway

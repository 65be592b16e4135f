// A node-wide cap with a per-tenant share, for what the API hands out by the connection.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>

namespace space::api {

// Places (open connections, terminal sessions) of a node and of each tenant, under a cap for
// the node and a quarter of it for each tenant, so one tenant cannot take them all.
// Thread-safe; a place may outlive the counter.
class TenantPlaces {
 public:
  explicit TenantPlaces(size_t node_cap);
  // A place, given back when its last reference goes; null when the node or the tenant is at
  // its cap (`over_node` says which).
  std::shared_ptr<void> enter(const std::string& tenant, bool& over_node);
  size_t nodeCap() const { return node_cap_; }
  size_t tenantCap() const { return std::max<size_t>(1, node_cap_ / 4); }

 private:
  struct State;
  size_t node_cap_;
  std::shared_ptr<State> state_;
};

}  // namespace space::api

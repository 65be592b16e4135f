// A node-wide cap with a per-tenant share, for what the API hands out by the connection.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>

namespace space::api {

// Places (open connections, terminal sessions) of a node and of each tenant. A tenant holds at
// most a quarter of the node's cap, and takes one more only while it holds less than half of the
// places still free. So a busy node keeps room for the next tenant: each tenant that fills its
// share leaves at least two thirds of what was free, and a tenant holding none is refused only by
// a full node. Colluding tenants need about log1.5(cap) of them (17 at 1024), not four, to take
// every place. The price: two or three of them leave the next tenant less than its quarter (at
// 1024, 171 or 114 places instead of 256). A tenant learns roughly how busy the node is from
// where its share ends (free <= 2 x what it holds), not what the errors say (shareText).
// Thread-safe; a place may outlive the counter.
class TenantPlaces {
 public:
  // Why enter() gave no place.
  struct Refusal {
    bool over_node = false;   // the node holds its cap; else the tenant holds its share
    size_t tenant_holds = 0;  // the places the tenant held then
    bool busy_node = false;   // its share was less than a quarter: half of the free places
  };
  explicit TenantPlaces(size_t node_cap);
  // A place, given back when its last reference goes; null when the node is at its cap or the
  // tenant at its share (`refusal` says which).
  std::shared_ptr<void> enter(const std::string& tenant, Refusal& refusal);
  // Why a tenant was refused, for its own error, without the node's figures (how many places
  // are free would tell it what the other tenants hold): "holds 12 terminals, its share while
  // the node is this busy" (`what`: " terminals").
  std::string shareText(const Refusal& refusal, const std::string& what) const;
  size_t nodeCap() const { return node_cap_; }
  size_t tenantCap() const { return std::max<size_t>(1, node_cap_ / 4); }

 private:
  struct State;
  size_t node_cap_;
  std::shared_ptr<State> state_;
};

}  // namespace space::api

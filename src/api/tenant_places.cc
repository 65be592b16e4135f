#include "api/tenant_places.h"

#include <map>
#include <mutex>

namespace space::api {

struct TenantPlaces::State {
  std::mutex mu;
  size_t open = 0;                          // guarded by mu
  std::map<std::string, size_t> by_tenant;  // guarded by mu; no zero entries
};

TenantPlaces::TenantPlaces(size_t node_cap) : node_cap_(node_cap), state_(std::make_shared<State>()) {}

std::shared_ptr<void> TenantPlaces::enter(const std::string& tenant, Refusal& refusal) {
  struct Place {
    Place(std::shared_ptr<State> s, std::string t) : state(std::move(s)), tenant(std::move(t)) {}
    Place(const Place&) = delete;
    Place& operator=(const Place&) = delete;
    std::shared_ptr<State> state;
    std::string tenant;
    bool counted = false;
    ~Place() {
      if (!counted) return;
      std::lock_guard lock(state->mu);
      --state->open;
      auto it = state->by_tenant.find(tenant);
      if (--it->second == 0) state->by_tenant.erase(it);
    }
  };
  auto place = std::make_shared<Place>(state_, tenant);
  std::lock_guard lock(state_->mu);
  refusal = Refusal{};
  refusal.over_node = state_->open >= node_cap_;
  if (refusal.over_node) return nullptr;
  const size_t free = node_cap_ - state_->open;
  size_t& of_tenant = state_->by_tenant[tenant];  // may throw: before anything is counted
  refusal.tenant_holds = of_tenant;
  // Less than half of the free places: 0 < free for a tenant holding none, so only a full
  // node refuses it.
  if (of_tenant >= tenantCap() || 2 * of_tenant >= free) {
    refusal.busy_node = of_tenant < tenantCap();
    if (of_tenant == 0) state_->by_tenant.erase(tenant);
    return nullptr;
  }
  ++of_tenant;
  ++state_->open;
  place->counted = true;
  return place;
}

std::string TenantPlaces::shareText(const Refusal& refusal, const std::string& what) const {
  const std::string held = "holds " + std::to_string(refusal.tenant_holds) + what;
  if (refusal.busy_node) return held + ", its share while the node is this busy";
  // A node of fewer than 4 places still gives each tenant one: not a quarter then.
  const std::string most = node_cap_ >= 4 ? "a quarter of the node's " + std::to_string(node_cap_)
                                          : "1 of the node's " + std::to_string(node_cap_);
  return held + ", its most: " + most;
}

}  // namespace space::api

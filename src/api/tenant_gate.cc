#include "api/tenant_gate.h"

namespace space::api {

TenantGate::Ticket TenantGate::enter(const std::string& tenant) {
  std::lock_guard lock(mutex_);
  size_t& count = in_flight_[tenant];
  if (count >= max_in_flight_) {
    if (count == 0) in_flight_.erase(tenant);
    return Ticket();
  }
  ++count;
  return Ticket(this, tenant);
}

size_t TenantGate::inFlight(const std::string& tenant) const {
  std::lock_guard lock(mutex_);
  auto it = in_flight_.find(tenant);
  return it == in_flight_.end() ? 0 : it->second;
}

void TenantGate::leave(const std::string& tenant) {
  std::lock_guard lock(mutex_);
  auto it = in_flight_.find(tenant);
  if (it == in_flight_.end()) return;
  if (--it->second == 0) in_flight_.erase(it);
}

}  // namespace space::api

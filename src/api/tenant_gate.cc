#include "api/tenant_gate.h"

#include <algorithm>
#include <cmath>
#include <exception>

namespace space::api {

TenantRates::Rate TenantRates::rateOf(const std::string& tenant) {
  if (!source_) return node_;
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mutex_);
    auto it = rates_.find(tenant);
    if (it != rates_.end() && (it->second.asking || now - it->second.asked < std::chrono::seconds(1))) {
      return it->second.own.value_or(node_);
    }
    if (it != rates_.end()) it->second.asking = true;  // the others use what is known meanwhile
  }
  Result<std::optional<Rate>> answer = makeError(ErrorCode::kInternal, "not asked");
  try {
    answer = source_(tenant);
  } catch (const std::exception& e) {  // bad_alloc: the flag below must not stay set
    answer = makeError(ErrorCode::kInternal, e.what());
  }
  std::lock_guard lock(mutex_);
  KnownRate& known = rates_[tenant];
  known.asking = false;
  known.asked = now;
  if (answer.ok()) known.own = answer.value();
  return known.own.value_or(node_);
}

int TenantRates::take(const std::string& tenant, const Rate& rate) {
  if (rate.rate_per_s <= 0) return 0;
  const double burst = std::max(rate.burst, std::max(rate.rate_per_s, 1.0));
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(mutex_);
  auto [bucket, fresh] = buckets_.try_emplace(tenant, Bucket{burst, now});
  Bucket& b = bucket->second;
  if (!fresh) {
    b.tokens = std::min(burst, b.tokens + std::chrono::duration<double>(now - b.refilled).count() * rate.rate_per_s);
    b.refilled = now;
  }
  if (b.tokens < 1) {
    // Clamped before the cast: a tiny configured rate must not overflow the int.
    const double wait_s = std::min(std::ceil((1 - b.tokens) / rate.rate_per_s), 3600.0);
    return std::max(1, static_cast<int>(wait_s));
  }
  b.tokens -= 1;
  return 0;
}

TenantGate::Ticket TenantGate::enter(const std::string& tenant) {
  const Rate rate = rates_->rateOf(tenant);
  std::lock_guard lock(mutex_);
  auto it = in_flight_.find(tenant);
  if (it != in_flight_.end() && it->second >= limits_.max_in_flight) return Ticket(Refusal::kTooManyRunning, 1);
  if (const int wait_s = rates_->take(tenant, rate); wait_s > 0) return Ticket(Refusal::kRateLimited, wait_s);
  ++in_flight_[tenant];
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

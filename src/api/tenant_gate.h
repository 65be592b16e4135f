// How many requests each tenant may have running at once, and how many it may start per second.
// The HTTP server bounds connections per client address, but one tenant can use many addresses;
// without this, one tenant's long-running calls (streamed execs, uploads, branches) could hold
// every connection thread and lock the other tenants out, and a tight loop of cheap calls could
// take the daemon's time from everyone else. The rate is a token bucket per tenant: `burst`
// requests at once, refilled at `rate_per_s`.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace space::api {

class TenantGate {
 public:
  struct Limits {
    size_t max_in_flight = 64;
    double rate_per_s = 0;  // 0: no rate limit
    double burst = 0;       // bucket size; below 1 means rate_per_s
  };
  explicit TenantGate(Limits limits) : limits_(limits) {}
  explicit TenantGate(size_t max_in_flight) : TenantGate(Limits{max_in_flight, 0, 0}) {}
  TenantGate(const TenantGate&) = delete;
  TenantGate& operator=(const TenantGate&) = delete;

  enum class Refusal { kNone, kTooManyRunning, kRateLimited };

  // Held while the request runs; releases its place when destroyed. An empty ticket (admitted()
  // false) means the tenant was at a limit: refusal() says which, retryAfterS() when to retry.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept
        : gate_(other.gate_),
          tenant_(std::move(other.tenant_)),
          refusal_(other.refusal_),
          retry_after_s_(other.retry_after_s_) {
      other.gate_ = nullptr;
    }
    Ticket& operator=(Ticket&& other) noexcept {
      if (this != &other) {
        release();
        gate_ = other.gate_;
        tenant_ = std::move(other.tenant_);
        refusal_ = other.refusal_;
        retry_after_s_ = other.retry_after_s_;
        other.gate_ = nullptr;
      }
      return *this;
    }
    Ticket(const Ticket&) = delete;
    ~Ticket() { release(); }
    bool admitted() const { return gate_ != nullptr; }
    Refusal refusal() const { return refusal_; }
    int retryAfterS() const { return retry_after_s_; }

   private:
    friend class TenantGate;
    void release() {
      if (gate_) gate_->leave(tenant_);
      gate_ = nullptr;
    }
    Ticket(TenantGate* gate, std::string tenant) : gate_(gate), tenant_(std::move(tenant)) {}
    Ticket(Refusal refusal, int retry_after_s) : refusal_(refusal), retry_after_s_(retry_after_s) {}
    TenantGate* gate_ = nullptr;
    std::string tenant_;
    Refusal refusal_ = Refusal::kNone;
    int retry_after_s_ = 0;
  };

  // A tenant's own request rate, where the operator gave it one: {rate_per_s, burst}, 0 rate
  // meaning none. nullopt: the gate's own. Asked at most once a second per tenant (it may read
  // the state database), so a change applies within a second.
  struct Rate {
    double rate_per_s = 0;
    double burst = 0;
  };
  using RateSource = std::function<std::optional<Rate>(const std::string& tenant)>;
  // Set once, before the first enter().
  void setRateSource(RateSource source) { rate_source_ = std::move(source); }

  Ticket enter(const std::string& tenant);
  size_t maxInFlight() const { return limits_.max_in_flight; }
  double ratePerS() const { return limits_.rate_per_s; }
  // The rate that applies to `tenant` (its own, else the gate's).
  Rate rateOf(const std::string& tenant);
  size_t inFlight(const std::string& tenant) const;

 private:
  void leave(const std::string& tenant);

  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point refilled;
  };
  struct KnownRate {
    std::optional<Rate> own;
    std::chrono::steady_clock::time_point asked;
  };
  const Limits limits_;
  mutable std::mutex mutex_;
  std::map<std::string, size_t> in_flight_;  // only tenants with requests running
  std::map<std::string, Bucket> buckets_;    // tenants authenticated since start (the operator's few)
  RateSource rate_source_;
  std::mutex rates_mutex_;                  // taken before mutex_, never inside it
  std::map<std::string, KnownRate> rates_;  // guarded by rates_mutex_
};

}  // namespace space::api

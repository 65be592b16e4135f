// How many requests each tenant may have running at once, and how many it may start per second.
// The HTTP server bounds connections per client address, but one tenant can use many addresses;
// without this, one tenant's long-running calls (streamed execs, uploads, branches) could hold
// every connection thread and lock the other tenants out, and a tight loop of cheap calls could
// take the daemon's time from everyone else. The rate is a token bucket per tenant: `burst`
// requests at once, refilled at `rate_per_s`; one bucket per tenant for the whole daemon
// (TenantRates, shared by every front end's gates), so a tenant cannot multiply its rate by
// spreading its requests over SPACE's API and E2B's.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/result.h"

namespace space::api {

// Each tenant's token bucket and the rate that fills it: its own where the operator gave it
// one, else the node's.
class TenantRates {
 public:
  struct Rate {
    double rate_per_s = 0;  // 0: no rate limit
    double burst = 0;       // bucket size; below 1 means rate_per_s
  };
  // A tenant's own rate, where the operator gave it one (nullopt: the node's), or the error
  // that kept it from being read. Asked at most once a second per tenant, never under a lock
  // (it may read the state database): others use the last value meanwhile.
  using RateSource = std::function<Result<std::optional<Rate>>(const std::string& tenant)>;

  explicit TenantRates(Rate node) : node_(node) {}
  // Set once, before the first take().
  void setRateSource(RateSource source) { source_ = std::move(source); }
  // The rate that applies to `tenant`: its own, else the node's. A read that fails keeps the
  // last one known, so a tenant the operator throttled is not let go by a busy database.
  Rate rateOf(const std::string& tenant);
  // Spends one of `tenant`'s tokens: 0, or (none left) the seconds until one is back.
  int take(const std::string& tenant, const Rate& rate);

 private:
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point refilled;
  };
  struct KnownRate {
    std::optional<Rate> own;
    std::chrono::steady_clock::time_point asked;
    bool asking = false;
  };
  const Rate node_;
  RateSource source_;
  std::mutex mutex_;
  // Keys are tenants that authenticated: the operator's few, not what a client names.
  std::map<std::string, Bucket> buckets_;
  std::map<std::string, KnownRate> rates_;
};

class TenantGate {
 public:
  struct Limits {
    size_t max_in_flight = 64;
    double rate_per_s = 0;  // 0: no rate limit
    double burst = 0;       // bucket size; below 1 means rate_per_s
  };
  explicit TenantGate(Limits limits)
      : limits_(limits), rates_(std::make_shared<TenantRates>(TenantRates::Rate{limits.rate_per_s, limits.burst})) {}
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

  using Rate = TenantRates::Rate;
  using RateSource = TenantRates::RateSource;
  // Its own buckets' source (see TenantRates). Set once, before the first enter().
  void setRateSource(RateSource source) { rates_->setRateSource(std::move(source)); }
  // Buckets shared with other gates instead of its own (Limits' rate is then unused). Set once,
  // before the first enter().
  void shareRates(std::shared_ptr<TenantRates> rates) { rates_ = std::move(rates); }

  Ticket enter(const std::string& tenant);
  size_t maxInFlight() const { return limits_.max_in_flight; }
  // The rate that applies to `tenant` (its own, else the node's).
  Rate rateOf(const std::string& tenant) { return rates_->rateOf(tenant); }
  size_t inFlight(const std::string& tenant) const;

 private:
  void leave(const std::string& tenant);

  const Limits limits_;
  mutable std::mutex mutex_;                 // taken before rates_'s, never inside it
  std::map<std::string, size_t> in_flight_;  // only tenants with requests running
  std::shared_ptr<TenantRates> rates_;
};

}  // namespace space::api

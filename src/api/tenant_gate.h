// How many requests each tenant may have running at once. The HTTP server bounds connections
// per client address, but one tenant can use many addresses; without this, one tenant's
// long-running calls (streamed execs, uploads, branches) could hold every connection thread and
// lock the other tenants out.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <string>

namespace space::api {

class TenantGate {
 public:
  explicit TenantGate(size_t max_in_flight) : max_in_flight_(max_in_flight) {}
  TenantGate(const TenantGate&) = delete;
  TenantGate& operator=(const TenantGate&) = delete;

  // Held while the request runs; releases its place when destroyed. An empty ticket (admitted()
  // false) means the tenant was at its limit.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept : gate_(other.gate_), tenant_(std::move(other.tenant_)) { other.gate_ = nullptr; }
    Ticket& operator=(Ticket&& other) noexcept {
      if (this != &other) {
        release();
        gate_ = other.gate_;
        tenant_ = std::move(other.tenant_);
        other.gate_ = nullptr;
      }
      return *this;
    }
    Ticket(const Ticket&) = delete;
    ~Ticket() { release(); }
    bool admitted() const { return gate_ != nullptr; }

   private:
    friend class TenantGate;
    void release() {
      if (gate_) gate_->leave(tenant_);
      gate_ = nullptr;
    }
    Ticket(TenantGate* gate, std::string tenant) : gate_(gate), tenant_(std::move(tenant)) {}
    TenantGate* gate_ = nullptr;
    std::string tenant_;
  };

  Ticket enter(const std::string& tenant);
  size_t maxInFlight() const { return max_in_flight_; }
  size_t inFlight(const std::string& tenant) const;

 private:
  void leave(const std::string& tenant);

  const size_t max_in_flight_;
  mutable std::mutex mutex_;
  std::map<std::string, size_t> in_flight_;  // only tenants with requests running
};

}  // namespace space::api

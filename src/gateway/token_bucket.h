// A token bucket: `rate` tokens a second, at most `burst` saved up. Bounds what a guest may ask
// of the gateway per second (DNS questions, bytes relayed).
#pragma once

#include <algorithm>
#include <chrono>

namespace space::gateway {

class TokenBucket {
 public:
  using Clock = std::chrono::steady_clock;

  TokenBucket(double rate, double burst) : rate_(rate), burst_(burst), tokens_(burst), last_(Clock::now()) {}

  // Takes `n` tokens if there are that many.
  bool tryTake(double n, Clock::time_point now = Clock::now()) {
    refill(now);
    if (tokens_ < n) return false;
    tokens_ -= n;
    return true;
  }

  // Takes `n` tokens, going into debt if needed; returns how long to wait for the debt to be
  // paid back (zero when there was enough).
  Clock::duration take(double n, Clock::time_point now = Clock::now()) {
    refill(now);
    tokens_ -= n;
    if (tokens_ >= 0 || rate_ <= 0) return Clock::duration::zero();
    // Capped before the conversion to integer nanoseconds: a debt past about 292 years would
    // overflow it (undefined; negative on x86, which a caller reads as "no need to wait").
    constexpr double kMaxWaitSeconds = 365.0 * 24 * 3600;
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(std::min(-tokens_ / rate_, kMaxWaitSeconds)));
  }

 private:
  void refill(Clock::time_point now) {
    double elapsed = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    tokens_ = std::min(burst_, tokens_ + elapsed * rate_);
  }

  double rate_;
  double burst_;
  double tokens_;
  Clock::time_point last_;
};

}  // namespace space::gateway

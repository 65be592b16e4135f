#include "http/stream_drain.h"

#include <algorithm>
#include <utility>

namespace space::http {

std::shared_ptr<StreamDrain> StreamDrain::make(std::shared_ptr<ResponseStream> out, std::function<bool()> drain,
                                               int drains_per_turn) {
  return std::shared_ptr<StreamDrain>(new StreamDrain(std::move(out), std::move(drain), std::max(1, drains_per_turn)));
}

void StreamDrain::kick() {
  {
    std::lock_guard lock(m_);
    if (running_) {
      again_ = true;
      return;
    }
    running_ = true;
  }
  if (!queue()) {
    std::lock_guard lock(m_);
    running_ = false;
  }
}

bool StreamDrain::queue() {
  if (out_->runBlocking([self = shared_from_this()] { self->drainWhileKicked(); })) return true;
  out_->abort();  // closed already, or the server stops: the stream cannot go on
  return false;
}

void StreamDrain::drainWhileKicked() {
  for (int drains = 1;; ++drains) {
    const bool over = drain_();
    std::lock_guard lock(m_);
    if (again_ && !over) {
      again_ = false;
      if (drains < drains_per_turn_) continue;
      if (queue()) return;  // back in line, still running
    }
    running_ = false;
    return;
  }
}

}  // namespace space::http

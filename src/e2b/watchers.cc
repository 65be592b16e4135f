#include "e2b/watchers.h"

#include <openssl/rand.h>

#include <condition_variable>
#include <cstdlib>

#include "common/digest.h"

namespace space::e2b {

using json = nlohmann::json;

struct WatcherTable::Watcher {
  std::string tenant;
  std::string sandbox_id;
  std::shared_ptr<agentproto::AgentStream> stream;
  // Filled on the agent client's I/O thread; read under `mu`.
  std::mutex mu;
  std::condition_variable cv;
  bool started = false;
  // Each event as JSON text: what is counted is what is held (a parsed tree of the guest's
  // making could be many times larger than its text).
  std::deque<std::string> events;
  size_t bytes = 0;  // of `events`
  bool overflow = false;
  std::optional<Status> ended;
  std::chrono::steady_clock::time_point ended_at;
};

namespace {

std::string newWatcherId() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof bytes) != 1) abort();  // no entropy: nothing safe to do
  return hexEncode(bytes, sizeof bytes);
}

constexpr std::chrono::seconds kEndedGrace{60};

Error watcherNotFound(const std::string& id) {
  return makeError(ErrorCode::kNotFound, "watcher " + id.substr(0, 64) + " not found");
}

}  // namespace

WatcherTable::~WatcherTable() {
  std::lock_guard lock(mu_);
  for (auto& [id, w] : watchers_) {
    if (w->stream && !w->stream->done()) w->stream->cancel();
  }
}

size_t WatcherTable::size() {
  std::lock_guard lock(mu_);
  return watchers_.size();
}

Result<std::string> WatcherTable::create(const std::string& tenant, const std::string& sandbox_id,
                                         agentproto::AgentClient& agent, const json& request,
                                         const agentproto::CallOptions& options, std::chrono::milliseconds wait) {
  auto w = std::make_shared<Watcher>();
  w->tenant = tenant;
  w->sandbox_id = sandbox_id;
  const std::string id = newWatcherId();
  {
    std::lock_guard lock(mu_);
    // Watchers whose stream ended and that nobody polls (their sandbox went away) are dropped
    // before counting: they hold nothing in the guest.
    size_t mine = 0;
    const auto now = std::chrono::steady_clock::now();
    for (auto it = watchers_.begin(); it != watchers_.end();) {
      if (it->second->tenant != tenant) {
        ++it;
        continue;
      }
      bool ended = false;
      {
        std::lock_guard wl(it->second->mu);
        // Events left by a stream that ended cleanly wait a minute for their poll: its sandbox
        // may be gone, and then nobody could ever take them.
        ended =
            it->second->ended.has_value() && (it->second->events.empty() || now - it->second->ended_at > kEndedGrace);
      }
      if (ended) {
        it = watchers_.erase(it);
      } else {
        ++mine;
        ++it;
      }
    }
    if (mine >= limits_.per_tenant) {
      return makeError(ErrorCode::kResourceExhausted, "this tenant already has " + std::to_string(mine) +
                                                          " watchers; remove one (RemoveWatcher) first");
    }
    watchers_.emplace(id, w);  // counted from now on, so concurrent creates cannot pass the limit
  }
  const size_t max_events = limits_.events_per_watcher;
  const size_t max_bytes = limits_.bytes_per_watcher;
  // The callbacks own what they touch (the watcher), never this table.
  std::weak_ptr<Watcher> weak = w;
  auto stream = agent.stream(
      "/filesystem.Filesystem/WatchDir", request, options,
      [weak, max_events, max_bytes](const json& m) {
        auto self = weak.lock();
        if (!self) return;
        auto ev = m.find("filesystem");
        std::string text;
        if (ev != m.end() && ev->is_object()) text = ev->dump(-1, ' ', false, json::error_handler_t::replace);
        std::lock_guard lock(self->mu);
        if (m.contains("start")) {
          self->started = true;
        } else if (!text.empty() && !self->overflow) {
          if (self->events.size() >= max_events || self->bytes + text.size() > max_bytes) {
            self->overflow = true;
            self->events.clear();  // the client gets the error; the memory goes now
            self->bytes = 0;
          } else {
            self->bytes += text.size();
            self->events.push_back(std::move(text));
          }
        }
        self->cv.notify_all();
      },
      [weak](const Status& end) {
        auto self = weak.lock();
        if (!self) return;
        std::lock_guard lock(self->mu);
        self->ended = end;
        self->ended_at = std::chrono::steady_clock::now();
        // A watch that failed (its sandbox went away, most often) may never be polled again:
        // what it holds goes now, and the table drops it at the next count.
        if (!end.ok()) {
          self->events.clear();
          self->bytes = 0;
        }
        self->cv.notify_all();
      });
  std::optional<Error> failed;
  {
    std::unique_lock lock(w->mu);
    w->stream = stream;
    if (!w->cv.wait_for(lock, wait, [&] { return w->started || w->ended.has_value(); })) {
      failed = makeError(ErrorCode::kDeadlineExceeded, "the guest did not start the watch in time");
    } else if (!w->started) {
      failed = w->ended->ok() ? makeError(ErrorCode::kUnavailable, "the watch ended at once") : w->ended->error();
    }
  }
  if (failed) {
    if (!stream->done()) stream->cancel();
    std::lock_guard lock(mu_);
    watchers_.erase(id);
    return *failed;
  }
  return id;
}

Result<std::shared_ptr<WatcherTable::Watcher>> WatcherTable::find(const std::string& tenant,
                                                                  const std::string& sandbox_id,
                                                                  const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = watchers_.find(id);
  if (it == watchers_.end() || it->second->tenant != tenant || it->second->sandbox_id != sandbox_id) {
    return watcherNotFound(id);
  }
  return it->second;
}

Result<std::string> WatcherTable::events(const std::string& tenant, const std::string& sandbox_id,
                                         const std::string& id) {
  auto w = find(tenant, sandbox_id, id);
  if (!w.ok()) return w.error();
  std::string out = "[";
  bool empty = true;
  std::optional<Error> gone;
  {
    std::lock_guard lock(w.value()->mu);
    for (const auto& ev : w.value()->events) {
      if (!empty) out += ',';
      out += ev;
      empty = false;
    }
    w.value()->events.clear();
    w.value()->bytes = 0;
    if (w.value()->overflow) {
      gone = makeError(ErrorCode::kResourceExhausted,
                       "more than " + std::to_string(limits_.events_per_watcher) + " events or " +
                           std::to_string(limits_.bytes_per_watcher) +
                           " bytes waited between two polls; the watcher is gone (create it again)");
    } else if (w.value()->ended && empty) {
      gone = w.value()->ended->ok() ? makeError(ErrorCode::kUnavailable, "the watch ended") : w.value()->ended->error();
    }
  }
  if (gone) {
    (void)remove(tenant, sandbox_id, id);
    return *gone;
  }
  return out + "]";
}

Status WatcherTable::remove(const std::string& tenant, const std::string& sandbox_id, const std::string& id) {
  std::shared_ptr<Watcher> w;
  {
    std::lock_guard lock(mu_);
    auto it = watchers_.find(id);
    if (it == watchers_.end() || it->second->tenant != tenant || it->second->sandbox_id != sandbox_id) {
      return watcherNotFound(id);
    }
    w = std::move(it->second);
    watchers_.erase(it);
  }
  std::shared_ptr<agentproto::AgentStream> stream;
  {
    std::lock_guard lock(w->mu);
    stream = w->stream;
  }
  if (stream && !stream->done()) stream->cancel();
  return okStatus();
}

}  // namespace space::e2b

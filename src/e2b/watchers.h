// envd's polling watchers (filesystem.Filesystem/CreateWatcher, GetWatcherEvents,
// RemoveWatcher), which E2B's Python sync SDK uses for watch_dir: each is a WatchDir stream to
// the guest agent held here, its events kept until polled. Bounded per tenant and per watcher,
// since a client may create watchers and never poll them.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "agentproto/agent_client.h"
#include "common/result.h"

namespace space::e2b {

struct WatcherLimits {
  size_t per_tenant = 64;
  // More between two polls: the watcher fails and goes. Bytes too: the guest writes the events.
  size_t events_per_watcher = 1024;
  size_t bytes_per_watcher = 256 << 10;
};

class WatcherTable {
 public:
  explicit WatcherTable(WatcherLimits limits = {}) : limits_(limits) {}
  ~WatcherTable();
  WatcherTable(const WatcherTable&) = delete;
  WatcherTable& operator=(const WatcherTable&) = delete;

  // Starts watching as `request` (CreateWatcherRequest, which is WatchDir's request) says, and
  // returns the watcher's id once the guest confirmed the watch (or its error). `wait` bounds
  // that confirmation.
  Result<std::string> create(const std::string& tenant, const std::string& sandbox_id, agentproto::AgentClient& agent,
                             const nlohmann::json& request, const agentproto::CallOptions& options,
                             std::chrono::milliseconds wait);
  // The events since the last poll: a JSON array of FilesystemEvent objects, oldest first, as
  // text. A watcher whose stream ended or overflowed answers its error once and is gone.
  Result<std::string> events(const std::string& tenant, const std::string& sandbox_id, const std::string& id);
  Status remove(const std::string& tenant, const std::string& sandbox_id, const std::string& id);

  size_t size();

 private:
  struct Watcher;
  // The watcher `id` of this tenant and sandbox; kNotFound otherwise (ids are unguessable, and
  // another tenant's is reported as missing).
  Result<std::shared_ptr<Watcher>> find(const std::string& tenant, const std::string& sandbox_id,
                                        const std::string& id);

  WatcherLimits limits_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Watcher>> watchers_;  // guarded by mu_
};

}  // namespace space::e2b

// What the files of SandboxManager share and nothing else sees: the per-sandbox object the
// manager works with (Live) and the messages and names its parts agree on.
#pragma once

#include <openssl/rand.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "agentproto/base64.h"
#include "sandbox/manager.h"
#include "sandbox/metrics.h"
#include "sandbox/runtime.h"

namespace space::sandbox {

struct SandboxManager::Live {
  // Serialises lifecycle operations (and QMP use) on this sandbox. Timed: a caller that only
  // reports (agentFailed) gives up rather than wait out a snapshot or a boot.
  std::timed_mutex control;
  std::string id;
  std::string tenant;
  uint32_t cpus = 0;
  uint64_t memory_mb = 0;
  // What its VM holds of the node's memory beyond memory_mb: its QEMU's own memory and, under
  // TCG, its translation buffer (vmm::qemuShareMib in liveFromRecord; an adopted QEMU's buffer as
  // recovery.cc counts it). Fixed while it is counted in.
  uint64_t qemu_mb = 0;
  std::atomic<int64_t> expires_at_ms{0};
  int64_t timeout_s = 0;
  int64_t idle_suspend_s = 0;
  std::string on_timeout = "delete";
  std::atomic<int64_t> last_active_ms{0};
  std::atomic<int> active_calls{0};  // leases alive: exec streams, file transfers
  // Guarded by `control`.
  SandboxState state = SandboxState::kCreating;
  std::unique_ptr<SandboxRuntime> runtime;  // its VM and everything else it holds on the host
  bool finished = false;                    // ended (deleted/failed) and out of live_
  // Paused because QEMU stopped the guest on a disk error: what QEMU said (else empty).
  // Written under the manager's `mu_` too, so that get() reads it without waiting for `control`.
  std::string disk_error;
  // The certificate of its credential CA while its policy has credential rules (what its guest
  // must trust), else empty. Set by syncCredentials.
  std::string credential_ca_cert;
  // The env vars its guest gets for its policy's placeholders (NAME -> space-secret-...).
  std::map<std::string, std::string> credential_env;
  // What it costs the host, sampled by housekeeping while it runs (thread-safe itself); the
  // last sample's CPU time and time, guarded by `control`.
  MetricsSeries metrics;
  uint64_t sampled_cpu_ticks = 0;
  int64_t sampled_at_ms = 0;
  pid_t sampled_pid = 0;  // a new QEMU (a resume) starts its CPU time at 0
  // What its guest last said of itself (housekeeping asks; the agent client's thread answers,
  // maybe after the sandbox is gone: hence shared).
  std::shared_ptr<GuestStatsCell> guest_stats = std::make_shared<GuestStatsCell>();

  vmm::Vm& vm() { return runtime->vm(); }
};

namespace internal {
inline constexpr const char* kSuspendedState = "/suspended.state";
inline constexpr size_t kConsoleMaxBytes = 8 << 20;
inline constexpr size_t kConsoleKeepBytes = 1 << 20;

// Sandbox ids have '_', which hostnames may not.
inline std::string hostnameFor(const std::string& id) {
  std::string name = id;
  for (char& c : name) {
    if (c == '_') c = '-';
  }
  return name;
}

inline std::string freshEntropy() {
  unsigned char bytes[64];
  if (RAND_bytes(bytes, sizeof bytes) != 1) abort();  // no entropy: nothing safe to do
  return agentproto::base64Encode(std::string(reinterpret_cast<char*>(bytes), sizeof bytes));
}

inline std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

inline Error notFound(const std::string& id) {
  return makeError(ErrorCode::kNotFound, "sandbox " + id + " not found", "sandbox_not_found");
}

inline Error snapshotNotFound(const std::string& id) {
  return makeError(ErrorCode::kNotFound, "snapshot " + id + " not found", "snapshot_not_found");
}

inline constexpr const char* kIdleSuspendReasonPrefix = "idle: ";
inline constexpr const char* kTimeoutSuspendReason = "timeout: suspended (on_timeout is suspend)";

// What a sandbox whose guest QEMU stopped on a disk error says, as its state_reason and to calls.
inline std::string diskStopReason(const std::string& error) {
  return "disk error: the VM was stopped because it could not write to the node's disk (" + error +
         "); free space on the node, then resume it";
}

inline Error diskStopped(const std::string& id, const std::string& error) {
  return makeError(ErrorCode::kResourceExhausted, "sandbox " + id + " is paused: " + diskStopReason(error));
}

// The last non-empty line of the console: usually what the guest said before it died.
inline std::string lastConsoleLine(const vmm::Vm& vm) {
  std::string tail = vm.consoleTail(2048);
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r')) tail.pop_back();
  auto at = tail.find_last_of('\n');
  std::string line = at == std::string::npos ? tail : tail.substr(at + 1);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

}  // namespace internal
}  // namespace space::sandbox

// QmpClient: QEMU Machine Protocol over the VM's Unix socket (JSON, one message per line).
// Synchronous, deadline-bounded calls; asynchronous events are queued as they are read.
// QEMU runs guest code, so its replies are treated as untrusted: bounded line size, parse
// failures are errors, a peer that stops answering hits the deadline.
#pragma once

#include <chrono>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/result.h"
#include "common/unix_socket.h"

namespace space::vmm {

struct QmpEvent {
  std::string name;  // e.g. "STOP", "RESUME", "SHUTDOWN", "GUEST_PANICKED"
  nlohmann::json data;
};

class QmpClient {
 public:
  static constexpr size_t kMaxMessageBytes = 1 << 20;
  static constexpr size_t kMaxQueuedEvents = 256;

  // Connects (retrying until the socket appears, or until QEMU behind `qemu_pidfd`, when given,
  // has exited: connectUnix), reads the greeting, enables commands.
  static Result<QmpClient> connect(const std::string& socket_path, Clock::time_point deadline, int qemu_pidfd = -1);

  QmpClient(QmpClient&&) = default;
  QmpClient& operator=(QmpClient&&) = default;

  // Runs one command; returns its "return" value or the error QEMU gave.
  Result<nlohmann::json> execute(const std::string& command, const nlohmann::json& arguments = nullptr,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // The same, with descriptor `fd` sent along (SCM_RIGHTS, with the command's first bytes): what
  // QMP's getfd names, so that QEMU is given a file or socket instead of opening a path.
  Result<nlohmann::json> executeWithFd(const std::string& command, const nlohmann::json& arguments, int fd,
                                       std::chrono::milliseconds timeout = std::chrono::seconds(10));

  // Reads whatever QEMU has sent without blocking and queues events. Returns false once QEMU
  // closed the socket.
  Result<bool> pump();
  int fd() const { return fd_.get(); }
  bool hasEvents() const { return !events_.empty(); }
  QmpEvent popEvent();

  // Parses one QMP line into an event / return / error (exposed for tests and the fuzz target).
  struct Message {
    enum class Kind { kGreeting, kEvent, kReturn, kError } kind;
    nlohmann::json id;
    nlohmann::json body;  // event: {name,data}; return: value; error: {class, desc}
  };
  static Result<Message> parseMessage(const std::string& line);

 private:
  explicit QmpClient(UniqueFd fd) : fd_(std::move(fd)), reader_(fd_.get(), kMaxMessageBytes) {}
  // Queues an event and returns nullopt, or returns the reply.
  Result<std::optional<Message>> handleLine(const std::string& line);

  UniqueFd fd_;
  LineReader reader_;
  std::deque<QmpEvent> events_;
  uint64_t next_id_ = 1;
};

}  // namespace space::vmm

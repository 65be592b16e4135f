#include "vmm/qmp_client.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "common/bounded_json.h"

namespace space::vmm {

using nlohmann::json;

Result<QmpClient::Message> QmpClient::parseMessage(const std::string& line) {
  auto parsed = parseJsonBounded(line);
  if (!parsed.ok())
    return makeError(ErrorCode::kUnavailable, "QMP: malformed message from QEMU: " + parsed.error().message);
  json j = std::move(parsed.value());
  if (!j.is_object()) return makeError(ErrorCode::kUnavailable, "QMP: malformed message from QEMU");
  Message m;
  if (j.contains("QMP")) {
    m.kind = Message::Kind::kGreeting;
    m.body = j["QMP"];
    return m;
  }
  if (auto it = j.find("event"); it != j.end()) {
    if (!it->is_string()) return makeError(ErrorCode::kUnavailable, "QMP: event name is not a string");
    m.kind = Message::Kind::kEvent;
    m.body = json{{"name", *it}, {"data", j.value("data", json::object())}};
    return m;
  }
  m.id = j.value("id", json());
  if (auto it = j.find("return"); it != j.end()) {
    m.kind = Message::Kind::kReturn;
    m.body = *it;
    return m;
  }
  if (auto it = j.find("error"); it != j.end() && it->is_object()) {
    m.kind = Message::Kind::kError;
    m.body = *it;
    return m;
  }
  return makeError(ErrorCode::kUnavailable, "QMP: message is neither event, return nor error");
}

Result<QmpClient> QmpClient::connect(const std::string& socket_path, Clock::time_point deadline, int qemu_pidfd) {
  auto fd = connectUnix(socket_path, deadline, qemu_pidfd);
  if (!fd.ok()) return fd.error();
  QmpClient client(std::move(fd.value()));
  auto greeting_line = client.reader_.readLine(deadline);
  if (!greeting_line.ok())
    return makeError(greeting_line.error().code, "QMP greeting: " + greeting_line.error().message);
  auto greeting = parseMessage(greeting_line.value());
  if (!greeting.ok()) return greeting.error();
  if (greeting->kind != Message::Kind::kGreeting) return makeError(ErrorCode::kUnavailable, "QMP: no greeting");
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  auto caps = client.execute("qmp_capabilities", nullptr, std::max(left, std::chrono::milliseconds(1000)));
  if (!caps.ok()) return caps.error();
  return client;
}

Result<std::optional<QmpClient::Message>> QmpClient::handleLine(const std::string& line) {
  auto msg = parseMessage(line);
  if (!msg.ok()) return msg.error();
  if (msg->kind == Message::Kind::kEvent) {
    if (events_.size() >= kMaxQueuedEvents) events_.pop_front();  // nobody is reading them: keep the newest
    events_.push_back(QmpEvent{msg->body["name"].get<std::string>(), msg->body["data"]});
    return std::optional<Message>();
  }
  return std::optional<Message>(std::move(msg.value()));
}

Result<json> QmpClient::execute(const std::string& command, const json& arguments, std::chrono::milliseconds timeout) {
  return executeWithFd(command, arguments, -1, timeout);
}

Result<json> QmpClient::executeWithFd(const std::string& command, const json& arguments, int pass_fd,
                                      std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  uint64_t id = next_id_++;
  json request{{"execute", command}, {"id", id}};
  if (!arguments.is_null()) request["arguments"] = arguments;
  const std::string text = request.dump() + "\n";
  size_t sent = 0;
  if (pass_fd >= 0) {
    // QEMU takes the descriptor with the bytes it arrives with: both in one sendmsg.
    iovec iov{const_cast<char*>(text.data()), text.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), &pass_fd, sizeof(int));
    ssize_t n;
    while (true) {
      n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);
      if (n >= 0 || (errno != EINTR && errno != EAGAIN)) break;
      if (errno == EINTR) continue;
      pollfd out{fd_.get(), POLLOUT, 0};
      int ready;
      do {
        ready = ::poll(&out, 1, pollTimeoutMs(deadline));
      } while (ready < 0 && errno == EINTR);
      if (ready <= 0) return makeError(ErrorCode::kDeadlineExceeded, "QMP " + command + ": timed out");
    }
    if (n <= 0) {
      return makeError(ErrorCode::kUnavailable, "QMP " + command + ": send: " + std::string(std::strerror(errno)));
    }
    sent = static_cast<size_t>(n);
  }
  SPACE_TRY(writeAll(fd_.get(), text.substr(sent), deadline));
  while (true) {
    // Checked here too: a QEMU that keeps sending events must not stretch the call.
    if (Clock::now() > deadline) return makeError(ErrorCode::kDeadlineExceeded, "QMP " + command + ": timed out");
    auto line = reader_.readLine(deadline);
    if (!line.ok()) return makeError(line.error().code, "QMP " + command + ": " + line.error().message);
    auto handled = handleLine(line.value());
    if (!handled.ok()) return handled.error();
    const std::optional<Message>& reply = handled.value();
    if (!reply || reply->id != json(id)) continue;  // an event, or a stale reply
    if (reply->kind == Message::Kind::kError) {
      auto desc = reply->body.find("desc");
      return makeError(
          ErrorCode::kUnavailable,
          "QMP " + command + " failed: " +
              (desc != reply->body.end() && desc->is_string() ? desc->get<std::string>() : "unknown error"));
    }
    return reply->body;
  }
}

Result<bool> QmpClient::pump() {
  std::string line;
  while (true) {
    auto got = reader_.takeBuffered(&line);
    if (!got.ok()) return got.error();
    if (got.value()) {
      auto handled = handleLine(line);  // a reply nobody waits for any more is dropped
      if (!handled.ok()) return handled.error();
      continue;
    }
    auto filled = reader_.fill();
    if (!filled.ok()) return filled.error();
    if (filled.value() == LineReader::FillResult::kEof) return false;
    if (filled.value() == LineReader::FillResult::kWouldBlock) return true;
  }
}

QmpEvent QmpClient::popEvent() {
  QmpEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

}  // namespace space::vmm

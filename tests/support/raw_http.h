// Test helpers for what an HTTP client library will not do: raw bytes on a loopback socket
// (malformed or endless requests, silence, pipelining) and a process's peak memory. Shared by
// the HTTP server's, the API's and the daemon's tests.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <future>
#include <string>
#include <string_view>
#include <thread>

#include "common/unix_socket.h"

namespace space::testsupport {

// A blocking socket connected to 127.0.0.1:port whose reads give up after `read_limit`, so a
// server that never answers fails the test instead of hanging it.
inline UniqueFd connectRaw(uint16_t port, std::chrono::seconds read_limit = std::chrono::seconds(5)) {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  timeval limit{static_cast<time_t>(read_limit.count()), 0};
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  return fd;
}

inline void sendRaw(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    ASSERT_GT(n, 0);
    data.remove_prefix(static_cast<size_t>(n));
  }
}

// Everything until the peer closes (or the socket's read limit passes).
inline std::string readUntilClosed(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

// Polls `done` every 5 ms until it holds or `limit` passed; its last answer.
inline bool waitUntil(const std::function<bool()>& done, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  for (auto until = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < until;) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

struct Flood {
  size_t sent = 0;     // bytes that went out, `head` included
  std::string answer;  // what the server sent back before closing
};

// Sends `head`, then `filler` over and over until `max_bytes` went out or the server stops
// taking it, while reading its answer (a server may answer and close long before); then
// half-closes and waits for the server to close.
inline Flood flood(uint16_t port, const std::string& head, const std::string& filler, size_t max_bytes) {
  auto fd = connectRaw(port, std::chrono::seconds(20));
  auto reader = std::async(std::launch::async, [&] { return readUntilClosed(fd.get()); });
  Flood out;
  if (send(fd.get(), head.data(), head.size(), MSG_NOSIGNAL) > 0) out.sent = head.size();
  while (!filler.empty() && out.sent < max_bytes) {
    ssize_t n = send(fd.get(), filler.data(), std::min(filler.size(), max_bytes - out.sent), MSG_NOSIGNAL);
    if (n <= 0) break;
    out.sent += static_cast<size_t>(n);
  }
  shutdown(fd.get(), SHUT_WR);
  out.answer = reader.get();
  return out;
}

// A process's peak resident memory (VmHWM) since the last resetPeakResident: memory a burst
// allocated and already freed still counts, which the current RSS would not show. pid 0 is
// this process; another process's peak can be reset by root.
inline std::string procFile(pid_t pid, const char* name) {
  return "/proc/" + (pid == 0 ? std::string("self") : std::to_string(pid)) + "/" + name;
}
inline void resetPeakResident(pid_t pid = 0) {
  FILE* f = fopen(procFile(pid, "clear_refs").c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("5", f);
  fclose(f);
}
inline size_t peakResidentBytes(pid_t pid = 0) {
  FILE* f = fopen(procFile(pid, "status").c_str(), "r");
  if (!f) return 0;
  char line[256];
  size_t kb = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "VmHWM: %zu kB", &kb) == 1) break;
  }
  fclose(f);
  return kb * 1024;
}
// How far the peak rose above `before` (0 if it did not).
inline size_t peakGrowth(size_t before, pid_t pid = 0) {
  size_t peak = peakResidentBytes(pid);
  return peak > before ? peak - before : 0;
}

}  // namespace space::testsupport

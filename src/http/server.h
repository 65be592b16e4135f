// HTTP/1.1 server for the daemon's REST API.
//
// One thread accepts; each connection gets its own thread running synchronous Beast I/O. API
// handlers block for seconds (booting a VM, waiting for a command) and the number of clients
// of a local daemon is small, so a thread per connection keeps handlers plain sequential code
// without starving other requests; max_connections bounds the threads.
//
// Every socket operation has a timeout, so a client that stops sending or reading (slowloris)
// only holds its thread for read_timeout / write_timeout. The server answers on its own, as
// errorBody JSON: 400 for malformed HTTP, 431 for a header over the limit, 413 when the handler
// refused a body as too large, 500 when the handler threw or did not respond, 503 over
// max_connections. A connection is kept alive only if the handler consumed the request body.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/result.h"
#include "common/unix_socket.h"
#include "http/message.h"

namespace space::http {

namespace detail {
class SocketStream;
}

struct ServerLimits {
  size_t max_header_bytes = 16 * 1024;  // request line and fields; over it: 431
  size_t max_connections = 256;         // open connections; over it: 503 and close
  // For each read: a client silent for longer is dropped. The whole request header must also
  // arrive within it, so a client trickling header bytes cannot hold the thread either.
  std::chrono::milliseconds read_timeout{30000};
  std::chrono::milliseconds write_timeout{30000};  // for each write: a client not reading is dropped
  std::chrono::milliseconds idle_timeout{60000};   // keep-alive between requests
};

class Server {
 public:
  // Listens on "ip:port" ("127.0.0.1:8080", "[::1]:8080"; port 0 picks a free one) and serves
  // requests with `handler` until stop().
  static Result<std::unique_ptr<Server>> start(const std::string& listen, Handler handler, ServerLimits limits = {});

  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  // stop() with no grace if stop() was not called.
  ~Server();

  // The bound "host:port", with the actual port.
  std::string address() const { return address_; }
  uint16_t port() const { return port_; }

  // Stops accepting and closes idle keep-alive connections at once; running handlers get up to
  // `grace` to finish their response, then their sockets fail every operation. Returns when all
  // connection threads have ended, which includes waiting for handlers to return: a handler must
  // give up when its reads or writes fail.
  void stop(std::chrono::milliseconds grace);

 private:
  struct Connection;

  Server(UniqueFd listener, Handler handler, ServerLimits limits);
  void acceptLoop();
  void serveConnection(detail::SocketStream& stream, const std::string& remote);
  void reapFinished();
  void rejectOverloaded(UniqueFd fd);

  UniqueFd listener_;
  Handler handler_;
  ServerLimits limits_;
  std::string address_;
  uint16_t port_ = 0;
  // eventfds that stay readable once signalled: stop_fd_ wakes idle connections and the
  // acceptor, abort_fd_ fails every socket operation once the grace period is over.
  UniqueFd stop_fd_;
  UniqueFd abort_fd_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::once_flag stop_once_;

  std::mutex mutex_;
  std::condition_variable connection_ended_;
  std::list<Connection> connections_;  // guarded by mutex_
  size_t open_connections_ = 0;        // guarded by mutex_
};

}  // namespace space::http

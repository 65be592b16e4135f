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
// refused a body as too large (or a chunk header or trailer overflowed the buffer), 500 when the
// handler threw or did not respond, 503 when the connection limits are reached and no idle
// connection can make room. A connection is kept alive only if the handler consumed the request
// body, and never after a 401.
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
  // What one connection may buffer beyond the header: a chunk header (size and extensions) or
  // a request trailer larger than this fails the request (413) and closes the connection.
  size_t max_buffered_bytes = 64 * 1024;
  size_t max_connections = 512;  // open connections
  // Open connections of one client address. A new connection over either limit takes the place
  // of the one that has waited longest for its next request (sent nothing, or a header still
  // incomplete); when every connection is running a request, the new one gets 503. Idle
  // sockets therefore cannot lock out a client with a request to make.
  size_t max_connections_per_client = 64;
  // For each read: a client silent for longer is dropped. The whole request header must also
  // arrive within it, so a client trickling header bytes cannot hold the thread either.
  std::chrono::milliseconds read_timeout{30000};
  std::chrono::milliseconds write_timeout{30000};  // for each write: a client not reading is dropped
  std::chrono::milliseconds idle_timeout{60000};   // keep-alive between requests
  // A new connection must complete its first request header within this (and read_timeout):
  // a client that has not yet shown a key holds a thread only briefly.
  std::chrono::milliseconds first_request_timeout{10000};
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
  void serveConnection(Connection& connection, detail::SocketStream& stream, const std::string& remote);
  void reapFinished();
  void rejectOverloaded(UniqueFd fd, const std::string& why);
  // Under mutex_: makes room for a connection from `client`; false when none can be made.
  bool admit(const std::string& client, std::string& why);
  // Under mutex_: the connection marks itself idle (evictable) or running a request; false
  // when it was evicted meanwhile and must close.
  bool setBusy(Connection& connection, bool busy);

  UniqueFd listener_;
  Handler handler_;
  ServerLimits limits_;
  std::string address_;
  uint16_t port_ = 0;
  // An eventfd that stays readable once signalled: wakes idle connections and the acceptor.
  // Each connection has its own abort eventfd (evicted, or the grace period is over).
  UniqueFd stop_fd_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::once_flag stop_once_;

  std::mutex mutex_;
  std::condition_variable connection_ended_;
  std::list<Connection> connections_;  // guarded by mutex_
  size_t open_connections_ = 0;        // guarded by mutex_; includes evicted ones still closing
};

}  // namespace space::http

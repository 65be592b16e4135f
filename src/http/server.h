// HTTP/1.1 server for the daemon's REST API.
//
// An event loop (one Asio thread) accepts connections, waits for their requests and reads
// request headers; only then does a request get a thread from a pool, where its handler runs
// as plain blocking code with Beast's synchronous I/O. API handlers block for seconds (booting
// a VM, waiting for a command), so they keep a thread while they run; a connection between
// requests (keep-alive, a client still sending its header, a slowloris) holds no thread, only
// its socket and buffer. max_running_requests bounds the threads, max_connections the sockets.
//
// A handler whose response streams for long (a process's output, a watch) detaches it
// (Response::detach): the handler returns, and its thread with it, while the event loop writes
// what producers push, with the write timeout, and notices a client that hangs up. Such a stream
// holds its connection and queued bytes, no thread; max_streams bounds them. A handler that
// proxies a connection to another socket hands both to the loop the same way (Response::relay;
// max_relays bounds them).
//
// Every socket operation has a timeout, so a client that stops sending or reading only holds
// its connection for read_timeout / write_timeout. The server answers on its own, as errorBody
// JSON: 400 for malformed HTTP, 431 for a header over the limit, 413 when the handler refused a
// body as too large (or a chunk header or trailer overflowed the buffer), 500 when the handler
// threw or did not respond, 503 when the connection or request limits are reached and no idle
// connection can make room. A connection is kept alive only if the handler consumed the request
// body, and never after a 401.
//
// With a TLS context, the listener speaks HTTPS: the event loop completes each handshake and
// relays the connection's plaintext to the same HTTP path (http/tls_relay.h), so every limit
// and timeout above applies unchanged, per client address as before.
#pragma once

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "common/result.h"
#include "common/unix_socket.h"
#include "http/message.h"
#include "http/worker_pool.h"

namespace space::http {

namespace detail {
class SocketStream;
class DetachedStream;
}  // namespace detail
class TlsRelays;

struct ServerLimits {
  size_t max_header_bytes = 16 * 1024;  // request line and fields; over it: 431
  // What one connection may buffer beyond the header: a chunk header (size and extensions) or
  // a request trailer larger than this fails the request (413) and closes the connection.
  size_t max_buffered_bytes = 64 * 1024;
  // Open connections. Each costs a descriptor and its buffer, and a thread only while it runs
  // a request (see max_running_requests).
  size_t max_connections = 4096;
  // The part of the process's descriptors (RLIMIT_NOFILE, less a reserve) this server's
  // connections may take: max_connections is lowered to fit it. Several servers in one process
  // split it, or together they could use every descriptor and starve the rest of the process.
  double descriptor_share = 1.0;
  // Open connections of one client address. A new connection over either limit takes the place
  // of the one that has waited longest for its next request (sent nothing, or a header still
  // incomplete); when every connection is running a request, the new one gets 503. Idle
  // sockets therefore cannot lock out a client with a request to make.
  size_t max_connections_per_client = 1024;
  // Requests running at once, each on its own thread (a stream holds one for its life); a
  // request over it gets 503. Threads idle for a minute exit.
  size_t max_running_requests = 1024;
  // Of those, what one client address may run (as counted for max_connections_per_client): a
  // single address, even without a key, cannot take every thread.
  size_t max_running_requests_per_client = 128;
  // Detached streams (Response::detach) open at once, and of one client address; over either,
  // detach() fails and the handler answers 503. Each holds its connection (counted above) and
  // what its producer queued (which the producer bounds), but no thread.
  size_t max_streams = 4096;
  size_t max_streams_per_client = 1024;
  // Relays (Response::relay) open at once, apart from the streams: their handlers bound them
  // per tenant (a proxied port's), and many tenants may share one address (a proxy). Over it,
  // relay() fails. Each holds its connection, its peer's socket and up to two 64 KiB buffers.
  size_t max_relays = 4096;
  // Threads for the blocking steps of detached streams (ResponseStream::runBlocking), apart from
  // the request threads, so streams keep going while requests fill those. A step that finds them
  // all busy waits its turn (as many as max_streams wait at most) instead of failing its stream;
  // one taken after its stream closed is skipped. Started on demand and gone after a minute
  // idle.
  size_t max_stream_step_threads = 256;
  // Of those, what one party's steps may hold at once: a tenant's, where the handler names it
  // (ResponseStream::shareStepsWith), else a client address's (as counted for
  // max_connections_per_client). Its further steps wait, in order, for one of its own to finish
  // (at most max_streams_per_client wait), so a party whose steps block cannot take the pool
  // from the others, and its own streams still take turns.
  size_t max_stream_steps_per_client = 64;
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
  // requests with `handler` until stop(); over TLS with `tls` (serverTlsContext()).
  static Result<std::unique_ptr<Server>> start(const std::string& listen, Handler handler, ServerLimits limits = {},
                                               std::shared_ptr<boost::asio::ssl::context> tls = nullptr);

  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  // stop() with no grace if stop() was not called.
  ~Server();

  // The bound "host:port", with the actual port.
  std::string address() const { return address_; }
  // "https://host:port" or "http://host:port" for clients on this node (loopback for a wildcard).
  std::string url() const;
  uint16_t port() const { return port_; }
  // The limits in force: as given, max_connections lowered to the descriptors it may use.
  const ServerLimits& limits() const { return limits_; }

  // Stops accepting and closes idle keep-alive connections at once; running handlers get up to
  // `grace` to finish their response, then their sockets fail every operation. Returns when all
  // connections have closed, which includes waiting for handlers to return: a handler must
  // give up when its reads or writes fail.
  void stop(std::chrono::milliseconds grace);

  // Requests whose handler has not yet returned. A client can read a response before its
  // handler returns, so a request sent right after may still find the previous one counted.
  size_t runningRequests();
  // Detached streams not yet closed.
  size_t openStreams();
  // Relays not yet closed.
  size_t openRelays();

 private:
  struct Connection;
  using ConnectionPtr = std::shared_ptr<Connection>;
  struct Stream;
  using StreamPtr = std::shared_ptr<Stream>;
  struct Relay;
  using RelayPtr = std::shared_ptr<Relay>;

  Server(Handler handler, ServerLimits limits);
  // On the event loop.
  void acceptNext();
  // `remote`: the client's address when the socket is a TLS relay's end, not the client's.
  void onAccepted(boost::asio::ip::tcp::socket socket, std::string remote = "");
  void acceptTls(boost::asio::ip::tcp::socket socket);
  void waitForRequest(const ConnectionPtr& connection);
  void readHeader(const ConnectionPtr& connection);
  // Arms the connection's timer to cancel its socket's operation at `deadline`.
  void armDeadline(const ConnectionPtr& connection, Clock::time_point deadline);
  // Moves the connection to a worker: `early` is an answer the server gives without a handler.
  void dispatch(const ConnectionPtr& connection, std::optional<std::pair<int, Error>> early);
  // On a worker.
  void serveRequest(const ConnectionPtr& connection, UniqueFd fd, std::optional<std::pair<int, Error>> early);
  // On the loop: after a response that closes the connection, reads and drops what the client
  // still sends until it closes or the linger ends, so closing does not reset the connection
  // over the response; no worker waits for it.
  void linger(const ConnectionPtr& connection, UniqueFd fd);
  void postWaitForNext(const ConnectionPtr& connection, const std::shared_ptr<UniqueFd>& back);
  void closeOnLoop(Connection& connection);  // ends any operation of the loop's on it at once
  // Logs a rejection, at most once a second (a flood must not flood the log from the loop).
  void logRejection(const std::string& remote, const std::string& why);
  // Either side: the connection is done; closes what it still holds.
  void finish(const ConnectionPtr& connection);
  void rejectOverloaded(UniqueFd fd, const std::string& remote, const std::string& why);
  // Under mutex_: makes room for a connection from `client`; false when none can be made.
  bool admit(const std::string& client, std::string& why);
  // Detached streams. On the worker, from Response::detach: counts a stream for the connection.
  Result<std::shared_ptr<detail::DetachedStream>> reserveStream(const ConnectionPtr& connection);
  // On the loop, from here on.
  void startStreaming(const StreamPtr& stream, UniqueFd fd);
  void pumpStream(const StreamPtr& stream);
  void writeStreamSome(const StreamPtr& stream);
  void watchStreamClient(const StreamPtr& stream);
  void pollStreamClient(const StreamPtr& stream);
  void armStreamKeepAlive(const StreamPtr& stream);
  // Once per stream: counts it out, and the connection waits for its next request, lingers or
  // closes; then the stream's onClose callback runs.
  void closeStream(const StreamPtr& stream, bool completed);
  // Relays (Response::relay). On the worker: counts a relay for the connection; and counts it
  // out when it never starts.
  Status reserveRelay(const ConnectionPtr& connection);
  void uncountRelayLocked(Connection& connection);
  // On the loop, from here on.
  void startRelay(const RelayPtr& relay, UniqueFd fd);
  // One direction: reads from `from`, writes to `to`, until an end, an error or the relay's close.
  template <class From, class To>
  void pumpRelay(const RelayPtr& relay, From& from, To& to, bool down);
  // Writes relay->pending to `to` a piece at a time (each piece is activity for the idle timeout).
  template <class To>
  void writeRelay(const RelayPtr& relay, To& to, bool down, std::function<void()> done);
  // While a write to the client is stalled, notices the peer's owner ending the peer.
  void watchRelayPeer(const RelayPtr& relay);
  void watchRelayClient(const RelayPtr& relay);
  void pollRelayClient(const RelayPtr& relay);
  void armRelayIdle(const RelayPtr& relay);
  // Once per relay: counts it out; the connection lingers (completed) or closes; `keep` goes.
  void closeRelay(const RelayPtr& relay, bool completed, const char* why);
  // After a response that closes the connection, with the socket already on the loop.
  void lingerOnLoop(const ConnectionPtr& connection);
  // Stream steps (ResponseStream::runBlocking), from the stream with its lock held: runs `task`
  // on a step thread under its party's share, or queues it behind the party's running steps.
  bool runStep(const StreamPtr& stream, std::function<void()> task, std::string& why);
  // On a step thread: runs `task` unless its stream closed, then the party's next waiting
  // steps, until none waits; then the party's share has a place free.
  void runStepsOfParty(const std::string& party, StreamPtr stream, std::function<void()> task);
  // Under mutex_: the handler returned, but the connection stays busy (a stream): no longer
  // counted among the running requests.
  void stopCountingRunningLocked(Connection& connection);
  // Under mutex_: the connection marks itself idle (evictable) or running a request; false
  // when it was evicted meanwhile and must close.
  bool setBusyLocked(Connection& connection, bool busy);

  Handler handler_;
  ServerLimits limits_;
  std::string address_;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::once_flag stop_once_;

  boost::asio::io_context io_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer accept_backoff_;
  std::unique_ptr<TlsRelays> tls_;  // null: plain HTTP; used on the event loop only
  std::thread event_loop_;
  std::unique_ptr<detail::WorkerPool> workers_;
  std::unique_ptr<detail::WorkerPool> stream_steps_;

  std::mutex mutex_;
  std::condition_variable connection_ended_;
  std::list<ConnectionPtr> connections_;                       // guarded by mutex_
  size_t open_connections_ = 0;                                // guarded by mutex_; includes evicted ones still closing
  size_t running_ = 0;                                         // guarded by mutex_: connections marked busy
  std::unordered_map<std::string, size_t> running_by_client_;  // guarded by mutex_; no zero entries
  size_t streams_ = 0;                                         // guarded by mutex_: detached streams open
  size_t relays_ = 0;                                          // guarded by mutex_: relays open
  std::unordered_map<std::string, size_t> streams_by_client_;  // guarded by mutex_; no zero entries
  // Stream steps per party: those running (or queued for a step thread), at most
  // max_stream_steps_per_client, and those waiting for one of them to finish.
  struct PartySteps {
    size_t running = 0;
    std::deque<std::pair<StreamPtr, std::function<void()>>> waiting;
  };
  std::mutex steps_mutex_;                                      // taken after a stream's lock, never before
  std::unordered_map<std::string, PartySteps> steps_by_party_;  // guarded by steps_mutex_; no empty entries
  Clock::time_point last_rejection_log_{};                      // guarded by mutex_
  size_t rejections_unlogged_ = 0;                              // guarded by mutex_
};

}  // namespace space::http

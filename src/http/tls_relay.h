// TLS for the HTTP server's listeners: the server's event loop completes each connection's TLS
// handshake and then relays its plaintext through a socketpair to the server's ordinary HTTP
// path, which sees the socketpair's other end as the connection.
//
// Why a relay rather than TLS inside the HTTP code: that code hands a connection's descriptor
// between the event loop (Asio), worker threads (SocketStream, poll-based, with an abort fd) and
// handlers that take the connection over (WebSocket terminals, ingress proxying), and each reads
// and writes the descriptor directly. One plaintext path for all of them keeps the TLS state in
// one place, on one thread, at the cost of a copy and two descriptors per connection.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>

#include "common/result.h"
#include "common/unix_socket.h"

namespace space::http {

// The other way: a client of the server above (spacectl, the tests) verifies its certificate
// against `ca_file` (PEM), or the system's trust store when empty, and relays the same way, on a
// thread of its own per connection (connectTls).

// A certificate chain and its private key, both PEM files.
struct TlsFiles {
  std::string cert_file;
  std::string key_file;
};

// A server context: TLS 1.2 or newer, the chain and key loaded and checked against each other.
Result<std::shared_ptr<boost::asio::ssl::context>> serverTlsContext(const TlsFiles& files);

// A client context that verifies the server: TLS 1.2 or newer.
Result<std::shared_ptr<boost::asio::ssl::context>> clientTlsContext(const std::string& ca_file);

// Completes a client handshake with `server_name` (SNI; the certificate must name it, host or IP)
// on a connected socket within the deadline, and answers the plaintext end of a relay to it.
Result<UniqueFd> connectTls(UniqueFd tcp, const std::string& server_name,
                            std::shared_ptr<boost::asio::ssl::context> context, Clock::time_point deadline);

struct TlsRelayLimits {
  // The handshake must be over within this; a client that stalls it is dropped.
  std::chrono::milliseconds handshake_timeout{10000};
  // Each write to the client must finish within this; a client that stops reading is dropped.
  std::chrono::milliseconds write_timeout{30000};
  // Handshakes under way at once, in all and from one client (as the server counts clients);
  // at either limit the oldest one is dropped for the new: that client's at its own limit, else
  // that of the client with the most under way.
  size_t max_handshakes = 1024;
  size_t max_handshakes_per_client = 256;
};

// Every method runs on the io_context's one thread.
class TlsRelays {
 public:
  // `plain` is the HTTP side's end of the socketpair, `remote` the peer's address.
  using Ready = std::function<void(UniqueFd plain, const std::string& remote)>;
  using Failed = std::function<void(const std::string& why)>;

  TlsRelays(boost::asio::io_context& io, std::shared_ptr<boost::asio::ssl::context> context, TlsRelayLimits limits);
  TlsRelays(const TlsRelays&) = delete;
  TlsRelays& operator=(const TlsRelays&) = delete;
  ~TlsRelays();

  // Takes an accepted connection; `client` groups addresses as the server's limits do.
  void accept(boost::asio::ip::tcp::socket socket, const std::string& remote, const std::string& client, Ready ready);
  // A client's connection to `server_name`: `ready` after a verified handshake, else `failed`.
  void connect(boost::asio::ip::tcp::socket socket, const std::string& server_name, Ready ready, Failed failed);
  // Ends every relay now (the server is stopping and its own connections are closed).
  void closeAll();
  size_t open() const { return relays_.size(); }

 private:
  struct Relay;
  using RelayPtr = std::shared_ptr<Relay>;

  RelayPtr track(boost::asio::ip::tcp::socket socket, const std::string& remote, const std::string& client);
  void handshakeDone(const RelayPtr& relay, const boost::system::error_code& ec, Ready& ready, Failed& failed);
  void pumpFromClient(const RelayPtr& relay);
  void pumpToClient(const RelayPtr& relay);
  void startShutdown(const RelayPtr& relay);
  void close(const RelayPtr& relay);
  void endHandshake(Relay& relay);
  size_t handshakesOf(const std::string& client) const {
    auto it = handshakes_by_client_.find(client);
    return it == handshakes_by_client_.end() ? 0 : it->second;
  }
  // `expired` runs at the deadline unless a later arm or a disarm came first.
  static void armDeadline(const RelayPtr& relay, std::chrono::milliseconds timeout, std::function<void()> expired);
  static void disarm(Relay& relay);

  boost::asio::io_context& io_;
  std::shared_ptr<boost::asio::ssl::context> context_;
  TlsRelayLimits limits_;
  std::list<RelayPtr> relays_;
  size_t handshakes_ = 0;
  std::map<std::string, size_t> handshakes_by_client_;  // no zero entries
};

}  // namespace space::http

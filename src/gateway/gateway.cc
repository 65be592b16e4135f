#include "gateway/gateway.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <csignal>

#include "gateway/dns_service.h"
#include "gateway/tcp_proxy.h"

namespace space::gateway {

namespace asio = boost::asio;

namespace {

// A descriptor for Asio to own (and close); `fd` keeps its own, closed by the caller's UniqueFd.
int adopt(const UniqueFd& fd) { return fcntl(fd.get(), F_DUPFD_CLOEXEC, 3); }

}  // namespace

Gateway::Gateway(GatewayOptions options, PolicyFile policy, AuditLog audit, CredentialsFile credentials)
    : core_(std::make_shared<GatewayCore>(io_, std::move(options), std::move(policy), std::move(audit),
                                          std::move(credentials))),
      signals_(io_, SIGTERM, SIGINT) {}

Gateway::~Gateway() = default;

Status Gateway::start(Listeners listeners) {
  boost::system::error_code ec;
  asio::ip::tcp::acceptor tcp(io_);
  tcp.assign(asio::ip::tcp::v4(), adopt(listeners.tcp), ec);
  if (ec) return makeError(ErrorCode::kInternal, "cannot adopt the TCP listener: " + ec.message());
  asio::ip::udp::socket dns_udp(io_);
  dns_udp.assign(asio::ip::udp::v4(), adopt(listeners.dns_udp), ec);
  if (ec) return makeError(ErrorCode::kInternal, "cannot adopt the DNS listener: " + ec.message());
  asio::ip::tcp::acceptor dns_tcp(io_);
  dns_tcp.assign(asio::ip::tcp::v4(), adopt(listeners.dns_tcp), ec);
  if (ec) return makeError(ErrorCode::kInternal, "cannot adopt the DNS-over-TCP listener: " + ec.message());

  dns_ = std::make_unique<DnsService>(core_, std::move(dns_udp), std::move(dns_tcp));
  tcp_ = std::make_unique<TcpProxy>(core_, std::move(tcp));
  dns_->start();
  tcp_->start();
  signals_.async_wait([this](boost::system::error_code wait_ec, int signal) {
    if (wait_ec) return;
    spdlog::info("signal {}: stopping", signal);
    io_.stop();
  });
  return okStatus();
}

void Gateway::run() { io_.run(); }

}  // namespace space::gateway

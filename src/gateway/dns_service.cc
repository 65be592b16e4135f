#include "gateway/dns_service.h"

#include <spdlog/spdlog.h>
#include <sys/random.h>

#include <algorithm>
#include <array>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

namespace space::gateway {

namespace asio = boost::asio;
using asio::ip::tcp;
using asio::ip::udp;

namespace {

uint16_t randomId() {
  // The id is half of what keeps an off-path attacker from forging upstream answers (the
  // kernel's random source port is the other): a CSPRNG, not a seeded PRNG.
  uint16_t id = 0;
  while (getrandom(&id, sizeof id, 0) != sizeof id) {
  }
  return id;
}

nlohmann::json dnsEntry(bool allowed, const std::string& reason, const std::string& name, uint16_t qtype) {
  return {{"kind", "dns"}, {"allowed", allowed}, {"reason", reason}, {"name", name}, {"qtype", qtype}};
}

nlohmann::json ipList(const std::vector<uint32_t>& ips) {
  nlohmann::json out = nlohmann::json::array();
  for (uint32_t ip : ips) out.push_back(net::ipv4ToString(ip));
  return out;
}

// One question waiting on the upstream resolver: its own connected UDP socket, so the kernel
// picks a random source port and drops datagrams from any other address.
class UpstreamQuery : public std::enable_shared_from_this<UpstreamQuery> {
 public:
  UpstreamQuery(std::shared_ptr<GatewayCore> core, const net::DnsQuestion& question, std::string name,
                std::shared_ptr<const net::Policy> policy, DnsService::Reply reply)
      : core_(std::move(core)),
        socket_(core_->io),
        timer_(core_->io),
        question_(question),
        name_(std::move(name)),
        id_(randomId()),
        policy_(std::move(policy)),
        reply_(std::move(reply)) {
    ++core_->dns_upstream_in_flight;
  }
  ~UpstreamQuery() { --core_->dns_upstream_in_flight; }

  void start() {
    boost::system::error_code ec;
    socket_.open(udp::v4(), ec);
    if (!ec) socket_.connect(core_->options.upstream_dns, ec);
    if (ec) return servfail(ec.message());
    timer_.expires_after(core_->options.dns_timeout);
    timer_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->servfail("timeout");
    });
    query_ = net::buildQuery(id_, name_, net::dns::kTypeA);
    if (query_.empty()) return servfail("the name cannot be encoded");
    socket_.async_send(asio::buffer(query_), [self = shared_from_this()](boost::system::error_code ec, size_t) {
      if (self->finished_) return;
      if (ec) return self->servfail(ec.message());
      self->receive();
    });
  }

 private:
  // Reads datagrams until one is the answer: anything else (a wrong id, a wrong question,
  // garbage) is ignored, and the timer bounds the wait.
  void receive() {
    socket_.async_receive(asio::buffer(buffer_), [self = shared_from_this()](boost::system::error_code ec, size_t n) {
      if (self->finished_) return;
      if (ec) return self->servfail(ec.message());
      self->onDatagram(std::span<const uint8_t>(self->buffer_.data(), n));
    });
  }

  void onDatagram(std::span<const uint8_t> datagram) {
    auto answer = net::parseAResponse(datagram, id_, name_);
    if (!answer.ok()) {
      spdlog::debug("dns: {}: ignoring an upstream datagram: {}", name_, answer.error().message);
      return receive();
    }
    if (answer->rcode == net::dns::kNxDomain) return finish(net::buildEmptyAnswer(question_, net::dns::kNxDomain));
    if (answer->rcode != net::dns::kNoError) return servfail("rcode " + std::to_string(answer->rcode));
    std::vector<uint32_t> kept, filtered;
    std::string filter_reason;
    for (uint32_t ip : answer->ipv4) {
      net::Decision d = net::decideAnswer(*policy_, ip);
      if (!d.allowed) {
        filtered.push_back(ip);
        filter_reason = d.reason;
      } else if (std::find(kept.begin(), kept.end(), ip) == kept.end() && kept.size() < kMaxAnswers) {
        kept.push_back(ip);
      }
    }
    auto entry = dnsEntry(true, "allowed", name_, question_.qtype);
    entry["answers"] = ipList(kept);
    if (!filtered.empty()) {
      entry["filtered"] = ipList(filtered);
      entry["filter_reason"] = filter_reason;
    }
    if (kept.empty() && !filtered.empty()) {
      // Every answer pointed inside: a rebinding attempt (or a name only meant for insiders).
      entry["allowed"] = false;
      entry["reason"] = "rebinding";
      core_->audit.write(std::move(entry));
      return finish(net::buildEmptyAnswer(question_, net::dns::kNxDomain));
    }
    auto ttl = std::clamp(std::chrono::seconds(answer->ttl), core_->options.min_ttl, core_->options.max_ttl);
    auto now = DnsPins::Clock::now();
    // The pin outlives the guest's cache by a little, so a connection made just as the cached
    // answer expires still finds it.
    core_->pins.pin(name_, kept, now + ttl + std::chrono::seconds(5), now);
    entry["ttl"] = ttl.count();
    core_->audit.write(std::move(entry));
    // The guest always sees the same TTL: the upstream's, counting down in the node's shared
    // resolver cache, would tell one tenant when another resolved the name.
    finish(net::buildAAnswer(question_, kept, static_cast<uint32_t>(core_->options.min_ttl.count())));
  }

  void servfail(const std::string& why) {
    if (finished_) return;
    // debug: a guest can make its resolver fail at will, and stderr is not the audit log.
    spdlog::debug("dns: {}: upstream failed: {}", name_, why);
    finish(net::buildEmptyAnswer(question_, net::dns::kServFail));
  }

  // Ends the query once: the answer goes to the guest; the socket and timer are released.
  void finish(std::vector<uint8_t> answer) {
    if (finished_) return;
    finished_ = true;
    boost::system::error_code ignored;
    timer_.cancel();
    socket_.close(ignored);
    reply_(std::move(answer));
  }

  static constexpr size_t kMaxAnswers = 32;

  std::shared_ptr<GatewayCore> core_;
  udp::socket socket_;
  asio::steady_timer timer_;
  net::DnsQuestion question_;
  std::string name_;
  uint16_t id_;
  std::shared_ptr<const net::Policy> policy_;
  DnsService::Reply reply_;
  std::vector<uint8_t> query_;
  std::array<uint8_t, net::kMaxDnsMessage> buffer_{};
  bool finished_ = false;
};

// A DNS-over-TCP connection from the guest: 2-byte length, message; one question at a time,
// each within the handshake timeout.
class DnsTcpSession : public std::enable_shared_from_this<DnsTcpSession> {
 public:
  DnsTcpSession(std::shared_ptr<GatewayCore> core, DnsService* service, tcp::socket socket)
      : core_(std::move(core)), service_(service), socket_(std::move(socket)), deadline_(core_->io) {
    ++core_->dns_tcp_connections;
  }
  ~DnsTcpSession() { --core_->dns_tcp_connections; }

  void start() { readLength(); }

 private:
  void arm() {
    deadline_.expires_after(core_->options.handshake_timeout);
    deadline_.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->close();
    });
  }
  void close() {
    boost::system::error_code ignored;
    deadline_.cancel();
    socket_.close(ignored);
  }
  void readLength() {
    arm();
    asio::async_read(socket_, asio::buffer(length_), [self = shared_from_this()](boost::system::error_code ec, size_t) {
      if (ec) return self->close();
      size_t n = (size_t{self->length_[0]} << 8) | self->length_[1];
      if (n == 0 || n > net::kMaxDnsMessage) return self->close();
      self->message_.resize(n);
      self->readMessage();
    });
  }
  void readMessage() {
    asio::async_read(
        socket_, asio::buffer(message_), [self = shared_from_this()](boost::system::error_code ec, size_t) {
          if (ec) return self->close();
          self->service_->handle(self->message_, [self](std::vector<uint8_t> answer) {
            if (answer.empty() || answer.size() > 0xffff || !self->socket_.is_open()) return self->close();
            self->out_.clear();
            self->out_.push_back(static_cast<uint8_t>(answer.size() >> 8));
            self->out_.push_back(static_cast<uint8_t>(answer.size() & 0xff));
            self->out_.insert(self->out_.end(), answer.begin(), answer.end());
            asio::async_write(self->socket_, asio::buffer(self->out_), [self](boost::system::error_code ec, size_t) {
              if (ec) return self->close();
              self->readLength();
            });
          });
        });
  }

  std::shared_ptr<GatewayCore> core_;
  DnsService* service_;
  tcp::socket socket_;
  asio::steady_timer deadline_;
  std::array<uint8_t, 2> length_{};
  std::vector<uint8_t> message_;
  std::vector<uint8_t> out_;
};

}  // namespace

DnsService::DnsService(std::shared_ptr<GatewayCore> core, udp::socket udp, tcp::acceptor tcp)
    : core_(std::move(core)),
      udp_(std::move(udp)),
      tcp_(std::move(tcp)),
      accept_retry_(core_->io),
      rate_(core_->options.dns_rate, core_->options.dns_burst) {}

void DnsService::start() {
  receiveUdp();
  acceptTcp();
}

void DnsService::receiveUdp() {
  udp_.async_receive_from(asio::buffer(udp_buffer_), udp_sender_, [this](boost::system::error_code ec, size_t n) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      udp::endpoint to = udp_sender_;
      handle(std::span<const uint8_t>(udp_buffer_.data(), n), [this, to](std::vector<uint8_t> answer) {
        if (answer.empty()) return;
        auto data = std::make_shared<std::vector<uint8_t>>(std::move(answer));
        udp_.async_send_to(asio::buffer(*data), to, [data](boost::system::error_code, size_t) {});
      });
    }
    receiveUdp();
  });
}

void DnsService::acceptTcp() {
  tcp_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors, most likely: wait rather than spin on a listener that stays ready.
      spdlog::warn("dns: accept failed: {}", ec.message());
      accept_retry_.expires_after(std::chrono::milliseconds(100));
      accept_retry_.async_wait([this](boost::system::error_code wait_ec) {
        if (!wait_ec) acceptTcp();
      });
      return;
    }
    if (core_->dns_tcp_connections >= core_->options.max_dns_tcp_connections) {
      boost::system::error_code ignored;
      socket.set_option(asio::socket_base::linger(true, 0), ignored);
      socket.close(ignored);
    } else {
      std::make_shared<DnsTcpSession>(core_, this, std::move(socket))->start();
    }
    acceptTcp();
  });
}

void DnsService::handle(std::span<const uint8_t> message, Reply reply) {
  if (!rate_.tryTake(1)) return reply({});
  auto parsed = net::parseQuery(message);
  if (!parsed.ok()) return reply({});
  const net::DnsQuestion& question = parsed.value();
  auto policy = core_->policy();
  auto name = net::normalizeHostName(question.name);
  if (!name || question.qclass != net::dns::kClassIn) {
    core_->audit.write(
        dnsEntry(false, name ? "class-refused" : "name-refused", question.name.substr(0, 256), question.qtype));
    return reply(net::buildEmptyAnswer(question, net::dns::kRefused));
  }
  net::Decision decision = net::decideName(*policy, *name);
  if (!decision.allowed) {
    core_->audit.write(dnsEntry(false, decision.reason, *name, question.qtype));
    return reply(net::buildEmptyAnswer(question, net::dns::kNxDomain));
  }
  if (question.qtype != net::dns::kTypeA) return reply(net::buildEmptyAnswer(question, net::dns::kNoError));
  if (core_->dns_upstream_in_flight >= core_->options.max_upstream_queries) {
    return reply(net::buildEmptyAnswer(question, net::dns::kServFail));
  }
  resolveUpstream(question, *name, std::move(policy), std::move(reply));
}

void DnsService::resolveUpstream(const net::DnsQuestion& question, const std::string& name,
                                 std::shared_ptr<const net::Policy> policy, Reply reply) {
  std::make_shared<UpstreamQuery>(core_, question, name, std::move(policy), std::move(reply))->start();
}

}  // namespace space::gateway

#include "gateway_parsers.h"

#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "net/dns_message.h"
#include "net/http_rewrite.h"
#include "net/policy.h"
#include "net/request_end.h"
#include "net/sniff.h"

namespace space::fuzz {

namespace {

// A broken property is a bug even where nothing crashed: abort so libFuzzer keeps the input.
#define GATEWAY_FUZZ_CHECK(cond)                                                                      \
  do {                                                                                                \
    if (!(cond)) {                                                                                    \
      std::fprintf(stderr, "%s:%d: gateway parser property failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                                   \
    }                                                                                                 \
  } while (0)

bool sameResult(const net::SniffResult& a, const net::SniffResult& b) {
  return a.status == b.status && a.name == b.name && a.detail == b.detail;
}

// A name the sniffer hands the gateway is already what normalizeHostName makes of it.
void checkSniffResult(const net::SniffResult& r) {
  if (!r.name.empty()) {
    GATEWAY_FUZZ_CHECK(r.status == net::SniffStatus::kTls || r.status == net::SniffStatus::kHttp);
    auto normalized = net::normalizeHostName(r.name);
    GATEWAY_FUZZ_CHECK(normalized && *normalized == r.name);
  }
}

void fuzzSniff(std::span<const uint8_t> in) {
  net::SniffResult whole = net::sniff(in);
  checkSniffResult(whole);
  // The gateway calls sniff() on every read and stops at the first verdict, so a verdict on
  // a prefix must be the verdict on everything after it too.
  size_t cuts[] = {1,
                   in.size() / 4,
                   in.size() / 2,
                   in.size() - in.size() / 4,
                   in.size() - 1,
                   in.empty() ? 0 : in[0] * in.size() / 256};
  for (size_t cut : cuts) {
    if (cut == 0 || cut >= in.size()) continue;
    net::SniffResult prefix = net::sniff(in.first(cut));
    checkSniffResult(prefix);
    if (prefix.status != net::SniffStatus::kNeedMore && !sameResult(prefix, whole)) {
      std::fprintf(stderr, "prefix of %zu/%zu bytes: %d '%s' '%s', whole: %d '%s' '%s'\n", cut, in.size(),
                   static_cast<int>(prefix.status), prefix.name.c_str(), prefix.detail.c_str(),
                   static_cast<int>(whole.status), whole.name.c_str(), whole.detail.c_str());
      GATEWAY_FUZZ_CHECK(sameResult(prefix, whole));
    }
  }
}

// A head the sniffer accepted and named is one the credential rewrite parses too, and what the
// rewrite sends names the same host: the host the gateway checked is the host the server sees.
void fuzzRewrite(std::span<const uint8_t> in) {
  net::SniffResult sniffed = net::sniff(in);
  if (sniffed.status != net::SniffStatus::kHttp || sniffed.name.empty()) return;
  auto rewritten = net::rewriteRequestHead(in, {{"Authorization", "Bearer fuzz-secret"}});
  // Refused only for framing that two servers could read two ways (no credential then).
  if (!rewritten.ok()) {
    const std::string& why = rewritten.error().message;
    GATEWAY_FUZZ_CHECK(why.find("Transfer-Encoding") != std::string::npos ||
                       why.find("Content-Length") != std::string::npos);
    return;
  }
  GATEWAY_FUZZ_CHECK(rewritten->consumed <= in.size());
  const std::string& head = rewritten->head;
  auto again = net::sniff(std::span(reinterpret_cast<const uint8_t*>(head.data()), head.size()));
  GATEWAY_FUZZ_CHECK(again.status == net::SniffStatus::kHttp && again.name == sniffed.name);
  // Exactly one Authorization field reaches the server, and it is the rule's.
  boost::beast::http::request_parser<boost::beast::http::empty_body> parser;
  parser.eager(false);
  boost::system::error_code ec;
  parser.put(boost::asio::buffer(head), ec);
  GATEWAY_FUZZ_CHECK(!ec && parser.is_header_done());
  const auto& fields = parser.get();
  GATEWAY_FUZZ_CHECK(fields.count(boost::beast::http::field::authorization) == 1);
  GATEWAY_FUZZ_CHECK(fields[boost::beast::http::field::authorization] == "Bearer fuzz-secret");
  GATEWAY_FUZZ_CHECK(fields.count(boost::beast::http::field::connection) == 1);
}

// Where a request ends does not depend on how its bytes were split into reads, and nothing
// past the end is ever taken.
void fuzzRequestEnd(std::span<const uint8_t> in) {
  net::RequestEnd whole;
  const size_t taken = whole.take(in);
  GATEWAY_FUZZ_CHECK(taken <= in.size());
  if (whole.ended()) GATEWAY_FUZZ_CHECK(whole.take(in) == 0);
  if (in.empty()) return;
  const size_t split = in[0] % in.size();
  net::RequestEnd pieces;
  const size_t first = pieces.take(in.subspan(0, split));
  const size_t second = pieces.take(in.subspan(split));
  if (!whole.failed() && !pieces.failed()) {
    GATEWAY_FUZZ_CHECK(first + second == taken);
    GATEWAY_FUZZ_CHECK(pieces.ended() == whole.ended());
  }
}

void fuzzDns(std::span<const uint8_t> in) {
  auto query = net::parseQuery(in);
  if (query.ok()) {
    const net::DnsQuestion& q = query.value();
    GATEWAY_FUZZ_CHECK(q.name.size() <= 4 * 255);
    auto normalized = net::normalizeHostName(q.name);
    GATEWAY_FUZZ_CHECK(!normalized || *normalized == q.name);

    // Our own upstream query for that name parses back to the same question.
    auto upstream = net::buildQuery(q.id, q.name, q.qtype);
    GATEWAY_FUZZ_CHECK(!upstream.empty());
    auto again = net::parseQuery(upstream);
    GATEWAY_FUZZ_CHECK(again.ok());
    GATEWAY_FUZZ_CHECK(again->id == q.id && again->name == q.name && again->qtype == q.qtype &&
                       again->qclass == net::dns::kClassIn && again->recursion_desired);

    // Our answers echo the question byte for byte and are responses to it.
    bool a_question = q.qtype == net::dns::kTypeA && q.qclass == net::dns::kClassIn;
    auto refused = net::buildEmptyAnswer(q, net::dns::kRefused);
    GATEWAY_FUZZ_CHECK(!net::parseQuery(refused).ok());  // QR is set
    auto refused_parsed = net::parseAResponse(refused, q.id, q.name);
    GATEWAY_FUZZ_CHECK(refused_parsed.ok() == a_question);
    if (a_question) GATEWAY_FUZZ_CHECK(refused_parsed->rcode == net::dns::kRefused && refused_parsed->ipv4.empty());

    std::vector<uint32_t> addresses;
    for (size_t i = 0; i + 4 <= in.size() && addresses.size() < 8; i += 4) {
      uint32_t a = uint32_t{in[i]} << 24 | uint32_t{in[i + 1]} << 16 | uint32_t{in[i + 2]} << 8 | in[i + 3];
      bool seen = false;
      for (uint32_t b : addresses) seen = seen || a == b;
      if (!seen) addresses.push_back(a);
    }
    uint32_t ttl = in.size() >= 4 ? uint32_t{in[0]} << 24 | in[1] << 16 | in[2] << 8 | in[3] : 60;
    auto answer = net::buildAAnswer(q, addresses, ttl);
    auto parsed = net::parseAResponse(answer, q.id, q.name);
    GATEWAY_FUZZ_CHECK(parsed.ok() == a_question);
    if (a_question) {
      GATEWAY_FUZZ_CHECK(parsed->rcode == net::dns::kNoError && parsed->ipv4 == addresses);
      if (!addresses.empty()) GATEWAY_FUZZ_CHECK(parsed->ttl == (ttl > 0x7fffffffu ? 0x7fffffffu : ttl));
    }
  }

  // As an upstream response to our query for example.com, with the id it carries.
  uint16_t id = in.size() >= 2 ? static_cast<uint16_t>(in[0] << 8 | in[1]) : 0;
  auto response = net::parseAResponse(in, id, "example.com");
  if (response.ok()) {
    for (size_t i = 0; i < response->ipv4.size(); ++i) {
      for (size_t j = i + 1; j < response->ipv4.size(); ++j) GATEWAY_FUZZ_CHECK(response->ipv4[i] != response->ipv4[j]);
    }
    GATEWAY_FUZZ_CHECK(response->ttl <= 0x7fffffffu);
  }
}

}  // namespace

void fuzzGatewayParsers(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  fuzzSniff(in);
  fuzzRewrite(in);
  fuzzRequestEnd(in);
  fuzzDns(in);
}

}  // namespace space::fuzz

#ifdef SPACE_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  space::fuzz::fuzzGatewayParsers(data, size);
  return 0;
}
#endif

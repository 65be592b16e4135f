#include "api/ingress.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <vector>

#include "api/console.h"
#include "common/digest.h"

namespace space::api {

namespace {

constexpr std::string_view kPathPrefix = "/v1/sandboxes/";
constexpr size_t kSandboxIdSuffix = 20;  // "sb_" + 20 lowercase alphanumerics

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool equalsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return lower(x) == lower(y); });
}

bool isLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

bool validSandboxId(std::string_view id) {
  return id.size() == 3 + kSandboxIdSuffix && id.substr(0, 3) == "sb_" &&
         std::all_of(id.begin() + 3, id.end(), isLowerAlnum);
}

std::optional<uint16_t> parsePort(std::string_view text) {
  if (text.empty() || text.size() > 5 || text[0] == '0') return std::nullopt;
  uint32_t n = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + static_cast<uint32_t>(c - '0');
  }
  if (n < 1 || n > 65535) return std::nullopt;
  return static_cast<uint16_t>(n);
}

Error badTarget(std::string message) { return makeError(ErrorCode::kInvalidArgument, std::move(message)); }

// The comma-separated tokens of a field such as Connection, lower-cased and trimmed.
std::vector<std::string> tokens(std::string_view value) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string_view::npos) end = value.size();
    std::string_view token = value.substr(start, end - start);
    while (!token.empty() && (token.front() == ' ' || token.front() == '\t')) token.remove_prefix(1);
    while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
    if (!token.empty()) {
      std::string t(token);
      for (char& c : t) c = lower(c);
      out.push_back(std::move(t));
    }
    start = end + 1;
  }
  return out;
}

// Fields that belong to one connection, not to the request (RFC 9110 7.6.1), and the ones
// this proxy sets itself.
bool isHopByHop(std::string_view name) {
  for (const char* hop : {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate",
                          "te", "trailer", "transfer-encoding", "upgrade", "content-length", "expect",
                          "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-prefix"}) {
    if (equalsIgnoreCase(name, hop)) return true;
  }
  return false;
}

int pollTimeout(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 24 * 3600 * 1000));
}

// Writes all of `data` to a non-blocking socket before the deadline, giving up when
// `abort_fd` becomes readable.
Status writeAll(int fd, std::string_view data, Clock::time_point deadline, int abort_fd) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return makeError(ErrorCode::kUnavailable, std::string("send: ") + strerror(errno));
    }
    pollfd fds[2] = {{fd, POLLOUT, 0}, {abort_fd, POLLIN, 0}};
    int ready = ::poll(fds, abort_fd >= 0 ? 2 : 1, pollTimeout(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) return makeError(ErrorCode::kDeadlineExceeded, "the peer stopped reading");
    if (ready < 0 || (abort_fd >= 0 && fds[1].revents != 0)) return makeError(ErrorCode::kCanceled, "stopping");
  }
  return okStatus();
}

// One read before the deadline: the bytes (empty at the peer's end of stream).
Result<std::string> readSomeBefore(int fd, size_t max, Clock::time_point deadline, int abort_fd) {
  std::string buf(max, '\0');
  while (true) {
    ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n >= 0) {
      buf.resize(static_cast<size_t>(n));
      return buf;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return makeError(ErrorCode::kUnavailable, std::string("recv: ") + strerror(errno));
    }
    pollfd fds[2] = {{fd, POLLIN, 0}, {abort_fd, POLLIN, 0}};
    int ready = ::poll(fds, abort_fd >= 0 ? 2 : 1, pollTimeout(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) return makeError(ErrorCode::kDeadlineExceeded, "no answer in time");
    if (ready < 0 || (abort_fd >= 0 && fds[1].revents != 0)) return makeError(ErrorCode::kCanceled, "stopping");
  }
}

}  // namespace

std::optional<Result<IngressTarget>> ingressFromPath(std::string_view raw_target) {
  if (raw_target.substr(0, kPathPrefix.size()) != kPathPrefix) return std::nullopt;
  std::string_view path = raw_target;
  std::string_view query;
  if (size_t q = raw_target.find('?'); q != std::string_view::npos) {
    path = raw_target.substr(0, q);
    query = raw_target.substr(q);
  }
  std::string_view rest = path.substr(kPathPrefix.size());
  size_t slash = rest.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  std::string_view id = rest.substr(0, slash);
  rest.remove_prefix(slash + 1);
  constexpr std::string_view kPorts = "ports/";
  if (rest.substr(0, kPorts.size()) != kPorts) return std::nullopt;
  rest.remove_prefix(kPorts.size());
  size_t end = rest.find('/');
  std::string_view port_text = rest.substr(0, end);
  if (!validSandboxId(id))
    return Result<IngressTarget>(
        badTarget("not a sandbox id: the path must be " + std::string(kPathPrefix) + "{id}/ports/{port}/..."));
  auto port = parsePort(port_text);
  if (!port) return Result<IngressTarget>(badTarget("port: must be a number from 1 to 65535"));
  IngressTarget target;
  target.sandbox_id = std::string(id);
  target.port = *port;
  target.prefix = std::string(kPathPrefix) + target.sandbox_id + "/ports/" + std::string(port_text);
  if (end == std::string_view::npos) {
    target.needs_slash = true;
    target.target = "/" + std::string(query);
  } else {
    target.target = std::string(rest.substr(end)) + std::string(query);
  }
  return Result<IngressTarget>(std::move(target));
}

std::optional<Result<IngressTarget>> ingressFromHost(std::string_view host, std::string_view domain,
                                                     std::string_view raw_target) {
  if (domain.empty()) return std::nullopt;
  if (size_t colon = host.rfind(':'); colon != std::string_view::npos && host.find(']') == std::string_view::npos) {
    host = host.substr(0, colon);
  }
  if (!host.empty() && host.back() == '.') host.remove_suffix(1);
  if (host.size() <= domain.size() + 1 || host[host.size() - domain.size() - 1] != '.' ||
      !equalsIgnoreCase(host.substr(host.size() - domain.size()), domain)) {
    return std::nullopt;
  }
  std::string label(host.substr(0, host.size() - domain.size() - 1));
  for (char& c : label) c = lower(c);
  size_t dash = label.find('-');
  if (dash == std::string::npos || label.find('.') != std::string::npos) return std::nullopt;
  auto port = parsePort(std::string_view(label).substr(0, dash));
  std::string id = label.substr(dash + 1);
  if (id.size() > 3 && id.compare(0, 3, "sb-") == 0) id[2] = '_';
  // Any other name under the domain is not a preview (it may be spaced's own, e.g. api.<domain>).
  if (!port || !validSandboxId(id)) return std::nullopt;
  IngressTarget target;
  target.sandbox_id = std::move(id);
  target.port = *port;
  target.target = raw_target.empty() ? "/" : std::string(raw_target);
  return Result<IngressTarget>(std::move(target));
}

std::string ingressHost(std::string_view sandbox_id, uint16_t port, std::string_view domain) {
  std::string id(sandbox_id);
  std::replace(id.begin(), id.end(), '_', '-');
  return std::to_string(port) + "-" + id + "." + std::string(domain);
}

std::string accessToken(std::string_view key, std::string_view sandbox_id) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(sandbox_id.data()), sandbox_id.size(), mac, &length) == nullptr) {
    abort();  // OpenSSL cannot compute SHA-256: nothing is safe to hand out
  }
  return hexEncode(mac, length);
}

bool accessTokenMatches(std::string_view key, std::string_view sandbox_id, std::string_view presented) {
  const std::string expected = accessToken(key, sandbox_id);
  return presented.size() == expected.size() && CRYPTO_memcmp(presented.data(), expected.data(), expected.size()) == 0;
}

bool wantsUpgrade(const http::Request& request) {
  auto connection = request.header("connection");
  if (!connection || !request.header("upgrade")) return false;
  auto list = tokens(*connection);
  return std::find(list.begin(), list.end(), "upgrade") != list.end();
}

std::string guestRequestHead(const http::Request& request, const IngressTarget& target, bool upgrade,
                             bool strip_authorization) {
  // Fields the client marked as connection-specific go no further either.
  std::vector<std::string> named;
  if (auto connection = request.header("connection")) named = tokens(*connection);
  std::string head = request.method() + " " + target.target + " HTTP/1.1\r\n";
  std::string host;
  for (const auto& [name, value] : request.headers()) {
    std::string lowered = name;
    for (char& c : lowered) c = lower(c);
    if (lowered == "host") host = value;
    if (isHopByHop(lowered) || equalsIgnoreCase(lowered, kAccessTokenHeader) ||
        (strip_authorization && lowered == "authorization") ||
        std::find(named.begin(), named.end(), lowered) != named.end() ||
        std::find(target.strip_headers.begin(), target.strip_headers.end(), lowered) != target.strip_headers.end()) {
      continue;
    }
    if (lowered == "cookie") {
      // The console's session is spaced's credential, like a key: never the guest's.
      std::string kept = withoutCookie(withoutCookie(value, Console::kCookie), Console::kSecureCookie);
      if (!kept.empty()) head += name + ": " + kept + "\r\n";
      continue;
    }
    head += name + ": " + value + "\r\n";
  }
  if (auto length = request.contentLength(); length && (*length > 0 || request.header("content-length"))) {
    head += "Content-Length: " + std::to_string(*length) + "\r\n";
  } else if (!length) {
    head += "Transfer-Encoding: chunked\r\n";
  }
  if (upgrade) {
    head += "Connection: Upgrade\r\nUpgrade: " + request.header("upgrade").value_or("") + "\r\n";
  } else {
    head += "Connection: close\r\n";
  }
  const std::string& remote = request.remoteAddress();
  head += "X-Forwarded-For: " + remote.substr(0, remote.rfind(':')) + "\r\n";
  head += "X-Forwarded-Proto: http\r\n";
  if (!host.empty()) head += "X-Forwarded-Host: " + host + "\r\n";
  if (!target.prefix.empty()) head += "X-Forwarded-Prefix: " + target.prefix + "\r\n";
  head += "\r\n";
  return head;
}

Result<GuestResponseHead> rewriteResponseHead(std::string_view head, bool same_origin_as_api) {
  auto notHttp = [](std::string why) {
    return makeError(ErrorCode::kUnavailable, "the guest's answer is not a valid HTTP/1.x response head: " + why,
                     "bad_gateway");
  };
  if (head.size() < 16 || head.substr(0, 7) != "HTTP/1." || (head[7] != '0' && head[7] != '1') || head[8] != ' ' ||
      head.substr(head.size() - 4) != "\r\n\r\n") {
    return notHttp("no HTTP/1.x status line");
  }
  int status = 0;
  for (size_t i = 9; i < 12; ++i) {
    if (head[i] < '0' || head[i] > '9') return notHttp("the status is not 3 digits");
    status = status * 10 + (head[i] - '0');
  }
  if (head[12] != ' ' && head[12] != '\r') return notHttp("the status is not 3 digits");
  if (status < 100) return notHttp("status under 100");
  // Strictly RFC 9112: a client (a browser) that reads a bare LF, a CR or a folded line
  // differently from us would see headers we never checked (a Set-Cookie, an early end of the
  // head). Field values: tab, space, visible ASCII and obs-text; names: tokens.
  auto fieldValueByte = [](unsigned char c) { return c == '\t' || c == ' ' || (c >= 0x21 && c != 0x7f); };
  auto tokenByte = [](unsigned char c) {
    return std::isalnum(c) != 0 ||
           std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
  };
  const size_t line_end = head.find("\r\n");
  for (size_t i = 12; i < line_end; ++i) {
    if (!fieldValueByte(static_cast<unsigned char>(head[i]))) return notHttp("a control byte in the status line");
  }
  GuestResponseHead out;
  out.status = status;
  out.head = std::string(head.substr(0, line_end + 2));
  size_t at = line_end + 2;
  while (true) {
    size_t end = head.find("\r\n", at);
    if (end == at) break;  // the empty line: the head was cut right after it
    std::string_view line = head.substr(at, end - at);
    size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return notHttp("a header line without a field name");
    std::string_view name = line.substr(0, colon);
    for (unsigned char c : name) {
      if (!tokenByte(c)) return notHttp("a field name with a byte a token may not have (a folded line?)");
    }
    for (unsigned char c : line.substr(colon + 1)) {
      if (!fieldValueByte(c)) return notHttp("a control byte (CR, LF, NUL...) in the value of " + std::string(name));
    }
    // Connection fields are ours except when switching protocols, where they say to what.
    const bool ours = status != 101 && (equalsIgnoreCase(name, "connection") || equalsIgnoreCase(name, "keep-alive") ||
                                        equalsIgnoreCase(name, "proxy-connection"));
    // On spaced's origin, fields that act on the whole origin (its cookies, storage, transport
    // and service workers) are not the guest's to send.
    static constexpr std::string_view kOriginWide[] = {"set-cookie",
                                                       "set-cookie2",
                                                       "clear-site-data",
                                                       "strict-transport-security",
                                                       "alt-svc",
                                                       "service-worker-allowed",
                                                       "nel",
                                                       "report-to",
                                                       "reporting-endpoints",
                                                       "origin-agent-cluster"};
    const bool unsafe_here =
        same_origin_as_api && std::any_of(std::begin(kOriginWide), std::end(kOriginWide),
                                          [&](std::string_view field) { return equalsIgnoreCase(name, field); });
    if (!ours && !unsafe_here) out.head += std::string(line) + "\r\n";
    at = end + 2;
  }
  if (status >= 200 && same_origin_as_api) {
    out.head +=
        "Content-Security-Policy: sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads\r\n";
  }
  if (status >= 200) out.head += "Connection: close\r\n";
  out.head += "\r\n";
  return out;
}

std::optional<std::string> refusedOnApiOrigin(const http::Request& request) {
  // A service worker's script would be registered for spaced's origin (with a guest's
  // Service-Worker-Allowed: /, even for all of it).
  if (request.header("service-worker")) return "a service worker cannot be loaded from a sandbox's port on this host";
  // The console's own pages never load a guest's scripts, styles or data. A sandboxed guest
  // page's requests are cross-site (its origin is opaque); a same-origin one that is not a
  // navigation can only be made by a page of spaced's origin, such as the console.
  auto site = request.header("sec-fetch-site");
  auto dest = request.header("sec-fetch-dest");
  if (site && *site == "same-origin" && dest && *dest != "document") {
    return "a page of this host cannot load a sandbox's port as a " + *dest + "; open it as a page";
  }
  return std::nullopt;
}

void proxyToGuest(http::Request& request, http::Response& response, int guest, std::shared_ptr<void> keep,
                  std::shared_ptr<void> until_answered, const IngressTarget& target, bool strip_authorization,
                  const IngressOptions& options) {
  const std::string where = "port " + std::to_string(target.port) + " of sandbox " + target.sandbox_id;
  auto gatewayError = [&](int status, const std::string& message) {
    spdlog::debug("ingress: {} {}: {}", request.method(), where, message);
    (void)response.sendError(status,
                             status == 504   ? "gateway_timeout"
                             : status == 503 ? "unavailable"
                                             : "bad_gateway",
                             message);
  };
  const bool upgrade = wantsUpgrade(request);
  if (upgrade && (!request.contentLength() || *request.contentLength() > 0)) {
    (void)response.sendError(400, "invalid_argument", "an upgrade request cannot have a body");
    return;
  }
  const int fd = guest;
  const int abort_fd = response.abortFd();
  auto write_deadline = [&] { return Clock::now() + options.response_timeout; };
  if (auto sent =
          writeAll(fd, guestRequestHead(request, target, upgrade, strip_authorization), write_deadline(), abort_fd);
      !sent.ok()) {
    return gatewayError(502, where + " closed the connection: " + sent.error().message);
  }
  // The body as it arrives, framed as the client framed it. A guest that answers before taking
  // all of it (an early 413) stops reading: the rest is dropped and its answer relayed.
  const bool chunked = !request.contentLength();
  bool guest_reads = true;
  std::vector<char> buf(64 * 1024);
  while (true) {
    auto n = request.readSome(buf.data(), buf.size());
    if (!n.ok()) return;  // the client failed or sent a malformed body: the server answers it
    if (n.value() == 0) break;
    if (!guest_reads) continue;
    std::string piece(buf.data(), n.value());
    if (chunked) piece = fmt::format("{:x}\r\n", n.value()) + piece + "\r\n";
    guest_reads = writeAll(fd, piece, write_deadline(), abort_fd).ok();
  }
  if (chunked && guest_reads) (void)writeAll(fd, "0\r\n\r\n", write_deadline(), abort_fd);

  // The answer's head: interim 1xx answers (other than 101) go before the final one.
  std::string received;
  std::string heads;
  GuestResponseHead final_head;
  const auto deadline = Clock::now() + options.response_timeout;
  int interim = 0;
  while (true) {
    size_t end = received.find("\r\n\r\n");
    if (end == std::string::npos) {
      if (heads.size() + received.size() > options.max_response_head) {
        return gatewayError(
            502, where + " sent a response head over " + std::to_string(options.max_response_head) + " bytes");
      }
      auto more = readSomeBefore(fd, 16 * 1024, deadline, abort_fd);
      if (!more.ok()) {
        if (more.error().code == ErrorCode::kDeadlineExceeded) {
          return gatewayError(
              504, where + " did not answer within " + std::to_string(options.response_timeout.count() / 1000) + " s");
        }
        return gatewayError(502, where + " failed: " + more.error().message);
      }
      if (more->empty()) return gatewayError(502, where + " closed the connection without an answer");
      received += more.value();
      continue;
    }
    auto head = rewriteResponseHead(std::string_view(received).substr(0, end + 4), !target.prefix.empty());
    if (!head.ok()) return gatewayError(502, where + ": " + head.error().message);
    received.erase(0, end + 4);
    if (head->status >= 200 || head->status == 101) {
      heads += head->head;
      final_head = std::move(head).value();
      break;
    }
    // Interim answers (103 Early Hints) go before the final one, within the same bound.
    constexpr int kMaxInterim = 8;
    heads += head->head;
    if (++interim > kMaxInterim || heads.size() > options.max_response_head) {
      return gatewayError(502, where + " sent more than " + std::to_string(kMaxInterim) + " interim (1xx) answers");
    }
  }
  if (final_head.status == 101 && !upgrade) {
    return gatewayError(502, where + " switched protocols (101) although the client asked for no upgrade");
  }
  until_answered.reset();
  const bool switched = upgrade && final_head.status == 101;
  // From here the server's event loop relays, and this thread returns to the pool: a WebSocket
  // or a download that lasts hours holds no thread.
  http::RelayPlan plan;
  plan.peer = fd;
  plan.both_ways = switched;
  plan.idle_timeout = options.idle_timeout;
  plan.to_client = heads + received;
  plan.keep = std::move(keep);
  if (auto relayed = response.relay(final_head.status, std::move(plan)); !relayed.ok()) {
    if (relayed.error().code == ErrorCode::kUnavailable) response.setHeader("Retry-After", "1");
    return gatewayError(relayed.error().code == ErrorCode::kUnavailable ? 503 : 502,
                        "cannot relay " + where + ": " + relayed.error().message);
  }
  spdlog::debug("ingress: {} {} -> {} ({})", request.method(), where, final_head.status,
                switched ? "upgraded" : "relayed");
}

}  // namespace space::api

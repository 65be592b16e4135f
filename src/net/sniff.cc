#include "net/sniff.h"

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <cstring>
#include <optional>
#include <string_view>
#include <vector>

#include "net/policy.h"

namespace space::net {

namespace {

namespace http = boost::beast::http;

// RFC 8446 5.1: a TLSPlaintext fragment is at most 2^14 bytes.
constexpr size_t kMaxTlsRecord = 16384;
constexpr size_t kTlsRecordHeader = 5;
constexpr size_t kHandshakeHeader = 4;
constexpr uint8_t kContentHandshake = 0x16;
constexpr uint8_t kHandshakeClientHello = 1;
constexpr uint16_t kExtServerName = 0;
constexpr uint8_t kNameTypeHostName = 0;
// The longest registered HTTP method is 17 characters (UPDATEREDIRECTREF); a longer run of
// upper-case letters is something else.
constexpr size_t kMaxMethodLength = 24;

SniffResult make(SniffStatus status, std::string name = {}, std::string detail = {}) {
  return SniffResult{status, std::move(name), std::move(detail)};
}
SniffResult malformed(std::string detail) { return make(SniffStatus::kMalformed, {}, std::move(detail)); }

// Out of bytes before a verdict: the caller reads more, unless it already gave us all we ever
// look at, in which case the message is too large to be one we accept.
SniffResult needMore(std::span<const uint8_t> bytes) {
  if (bytes.size() >= kMaxSniffBytes) return malformed("too large");
  return make(SniffStatus::kNeedMore);
}

// Bounds-checked cursor over guest bytes: every read says whether it fit.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> data) : data_(data) {}
  size_t remaining() const { return data_.size() - pos_; }
  bool u8(uint8_t& v) {
    if (remaining() < 1) return false;
    v = data_[pos_++];
    return true;
  }
  bool u16(uint16_t& v) {
    if (remaining() < 2) return false;
    v = static_cast<uint16_t>(data_[pos_] << 8 | data_[pos_ + 1]);
    pos_ += 2;
    return true;
  }
  bool bytes(size_t n, std::span<const uint8_t>& out) {
    if (remaining() < n) return false;
    out = data_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  bool skip(size_t n) {
    std::span<const uint8_t> ignored;
    return bytes(n, ignored);
  }

 private:
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
};

// RFC 6066 3: ServerNameList of (name_type, HostName). Only host_name exists and a list may
// hold one name per type, so anything else is refused rather than guessed at: a server and
// this gateway must never disagree on which name the connection claims.
SniffResult parseServerName(std::span<const uint8_t> data) {
  Reader r(data);
  uint16_t list_length = 0;
  if (!r.u16(list_length) || list_length != r.remaining() || list_length == 0) {
    return malformed("bad server_name list");
  }
  std::optional<std::string> host;
  while (r.remaining() > 0) {
    uint8_t type = 0;
    uint16_t length = 0;
    std::span<const uint8_t> name;
    if (!r.u8(type) || !r.u16(length) || !r.bytes(length, name)) return malformed("bad server_name list");
    if (type != kNameTypeHostName) return malformed("unknown server_name type");
    if (host) return malformed("two SNI host names");
    host.emplace(reinterpret_cast<const char*>(name.data()), name.size());
  }
  auto normalized = normalizeHostName(*host);
  if (!normalized) return malformed("invalid SNI");
  return make(SniffStatus::kTls, std::move(*normalized));
}

// The ClientHello body (after the 4-byte handshake header), RFC 8446 4.1.2; `body` is exactly
// the length the handshake header announced.
SniffResult parseClientHello(std::span<const uint8_t> body) {
  Reader r(body);
  uint16_t legacy_version = 0;
  uint8_t session_id_length = 0;
  uint16_t cipher_suites_length = 0;
  uint8_t compression_length = 0;
  if (!r.u16(legacy_version) || (legacy_version >> 8) != 3) return malformed("bad ClientHello version");
  if (!r.skip(32)) return malformed("truncated ClientHello");
  if (!r.u8(session_id_length) || session_id_length > 32 || !r.skip(session_id_length)) {
    return malformed("bad session_id");
  }
  if (!r.u16(cipher_suites_length) || cipher_suites_length < 2 || cipher_suites_length % 2 != 0 ||
      !r.skip(cipher_suites_length)) {
    return malformed("bad cipher_suites");
  }
  if (!r.u8(compression_length) || compression_length < 1 || !r.skip(compression_length)) {
    return malformed("bad compression_methods");
  }
  // Pre-TLS 1.2 clients may end the ClientHello here: no extensions, hence no SNI.
  if (r.remaining() == 0) return make(SniffStatus::kTls, {}, "no SNI");
  uint16_t extensions_length = 0;
  if (!r.u16(extensions_length) || extensions_length != r.remaining()) return malformed("bad extensions length");

  std::optional<SniffResult> sni;
  while (r.remaining() > 0) {
    uint16_t type = 0;
    uint16_t length = 0;
    std::span<const uint8_t> data;
    if (!r.u16(type) || !r.u16(length) || !r.bytes(length, data)) return malformed("extension past the end");
    if (type != kExtServerName) continue;
    // RFC 8446 4.2: no two extensions of one type. Servers differ on which one they would
    // use, so a second server_name is refused, not resolved.
    if (sni) return malformed("two server_name extensions");
    sni = parseServerName(data);
    if (sni->status == SniffStatus::kMalformed) return *sni;
  }
  if (!sni) return make(SniffStatus::kTls, {}, "no SNI");
  return *sni;
}

// Reassembles the handshake message from consecutive handshake records (a ClientHello may be
// fragmented over several), checking each header as soon as its bytes are there so a broken
// stream is refused without waiting for more.
SniffResult sniffTls(std::span<const uint8_t> bytes) {
  std::vector<uint8_t> handshake;
  size_t pos = 0;
  for (;;) {
    if (handshake.size() >= kHandshakeHeader) {
      if (handshake[0] != kHandshakeClientHello) return malformed("not a ClientHello");
      size_t length = size_t{handshake[1]} << 16 | size_t{handshake[2]} << 8 | handshake[3];
      // Even in one record the message plus its headers must fit in what we look at.
      if (kTlsRecordHeader + kHandshakeHeader + length > kMaxSniffBytes) return malformed("too large");
      if (handshake.size() >= kHandshakeHeader + length) {
        // Bytes after the ClientHello (in its last record or later records) are not ours to
        // judge: the server sees the same ClientHello.
        return parseClientHello(std::span<const uint8_t>(handshake).subspan(kHandshakeHeader, length));
      }
    } else if (!handshake.empty() && handshake[0] != kHandshakeClientHello) {
      return malformed("not a ClientHello");
    }

    if (pos == bytes.size()) return needMore(bytes);
    // Alerts, change_cipher_spec or application data interleaved with the handshake
    // fragments are not a ClientHello.
    if (bytes[pos] != kContentHandshake) return malformed("not a handshake record");
    if (bytes.size() - pos >= 2 && bytes[pos + 1] != 3) return malformed("bad record version");
    if (bytes.size() - pos < kTlsRecordHeader) return needMore(bytes);
    size_t record_length = size_t{bytes[pos + 3]} << 8 | bytes[pos + 4];
    // RFC 8446 5.1: zero-length handshake fragments are not allowed.
    if (record_length == 0 || record_length > kMaxTlsRecord) return malformed("bad record length");
    size_t available = std::min(record_length, bytes.size() - pos - kTlsRecordHeader);
    auto fragment = bytes.subspan(pos + kTlsRecordHeader, available);
    handshake.insert(handshake.end(), fragment.begin(), fragment.end());
    pos += kTlsRecordHeader + available;
    // The loop's head checks the handshake header (now or once more bytes arrive) and, at
    // the end of the input, asks for more.
  }
}

enum class Looks { kYes, kMaybe, kNo };

// An HTTP/1.x request starts with its method, a token that is upper case for every method in
// use, then one space. Lowercase or anything else is not HTTP to us (kOther): decided by
// address, like any other protocol.
Looks looksLikeHttp(std::span<const uint8_t> bytes, size_t& method_length) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    uint8_t c = bytes[i];
    if (c == ' ') {
      method_length = i;
      return i > 0 ? Looks::kYes : Looks::kNo;
    }
    if (i == kMaxMethodLength) return Looks::kNo;
    if (!((c >= 'A' && c <= 'Z') || c == '-' || c == '_')) return Looks::kNo;
  }
  return Looks::kMaybe;
}

// Finds the end of the request head (CRLFCRLF) and checks its line endings: CRLF only, no
// continuation lines. Beast accepts obs-fold (joining the lines) and servers behind the
// gateway may treat it or a lone CR or LF otherwise (RFC 9112 lets them reject or unfold), so
// both are refused here. A head that cannot end well is refused without waiting for its end.
struct HeadScan {
  std::optional<std::string> error;
  size_t end = 0;  // bytes up to and including CRLFCRLF; 0 while incomplete
};

HeadScan scanHead(std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r') {
      if (i + 1 < text.size() && text[i + 1] != '\n') return {"bare CR"};
    } else if (text[i] == '\n') {
      if (i == 0 || text[i - 1] != '\r') return {"bare LF"};
      if (i >= 3 && text.compare(i - 3, 4, "\r\n\r\n") == 0) return {std::nullopt, i + 1};
      if (i + 1 < text.size() && (text[i + 1] == ' ' || text[i + 1] == '\t')) return {"obs-fold"};
    }
  }
  return {};
}

// What a Host value or an absolute-form authority names.
struct Authority {
  enum class Kind { kName, kIpLiteral, kInvalid };
  Kind kind = Kind::kInvalid;
  std::string host;  // normalized name, or the literal as written (lowercase) for comparisons
};

bool validPort(std::string_view port) {
  if (port.empty() || port.size() > 5) return false;
  unsigned value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  return value >= 1 && value <= 65535;
}

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// host [":" port] (RFC 9110 7.2), the host being a name, an IPv4 literal or "[IPv6]".
Authority parseAuthority(std::string_view value) {
  Authority result;
  std::string_view host = value;
  std::string_view port;
  bool has_port = false;
  if (!value.empty() && value.front() == '[') {
    size_t close = value.find(']');
    if (close == std::string_view::npos || close == 1) return result;
    host = value.substr(1, close - 1);
    std::string_view rest = value.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return result;
      has_port = true;
      port = rest.substr(1);
    }
    for (char c : host) {
      bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
      if (!hex && c != ':' && c != '.') return result;
    }
    if (has_port && !validPort(port)) return result;
    result.kind = Authority::Kind::kIpLiteral;
    result.host = "[" + lowercase(host) + "]";
    return result;
  }
  size_t colon = value.find(':');
  if (colon != std::string_view::npos) {
    host = value.substr(0, colon);
    port = value.substr(colon + 1);
    if (!validPort(port)) return result;
  }
  if (parseIpv4(host)) {
    result.kind = Authority::Kind::kIpLiteral;
    result.host = std::string(host);
    return result;
  }
  auto name = normalizeHostName(host);
  if (!name) return result;
  result.kind = Authority::Kind::kName;
  result.host = std::move(*name);
  return result;
}

// RFC 9112 3.2: origin-form ("/path"), asterisk-form ("*"), absolute-form ("http://a/b").
// authority-form is CONNECT's (refused earlier) and refused for any other method too.
// Returns false for a target of none of these forms; `authority` is set for absolute-form.
bool parseTarget(std::string_view target, std::optional<std::string_view>& authority, std::string& error) {
  if (target == "*" || (!target.empty() && target.front() == '/')) return true;
  size_t scheme_end = target.find("://");
  if (scheme_end == std::string_view::npos || scheme_end == 0) {
    error = "bad request target";
    return false;
  }
  for (size_t i = 0; i < scheme_end; ++i) {
    char c = target[i];
    bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    bool ok = alpha || (i > 0 && ((c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.'));
    if (!ok) {
      error = "bad request target";
      return false;
    }
  }
  std::string_view rest = target.substr(scheme_end + 3);
  std::string_view auth = rest.substr(0, rest.find_first_of("/?#"));
  // RFC 9110 4.2.4: userinfo in an http(s) URI is an error; "http://good@evil/" is a
  // classic way to make two parsers see two hosts.
  if (auth.find('@') != std::string_view::npos) {
    error = "userinfo in request target";
    return false;
  }
  authority = auth;
  return true;
}

SniffResult sniffHttp(std::span<const uint8_t> bytes, size_t method_length) {
  std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  // Refused as soon as the method is seen: there is nothing to wait for.
  if (text.substr(0, method_length) == "CONNECT") return malformed("CONNECT refused");
  // Beast is given the complete head only, never a part: it refuses a broken line as soon
  // as it sees it, and the verdict on a prefix must stay the verdict once more bytes arrive.
  HeadScan head = scanHead(text);
  if (head.error) return malformed(*head.error);
  if (head.end == 0) return needMore(bytes);

  http::request_parser<http::empty_body> parser;
  parser.header_limit(static_cast<std::uint32_t>(kMaxSniffBytes));
  // Only the head is parsed; a Content-Length above Beast's default body limit (1 MB) is
  // not an error of the head.
  parser.body_limit(boost::none);
  parser.eager(false);
  boost::system::error_code ec;
  parser.put(boost::asio::const_buffer(text.data(), head.end), ec);
  if (ec == http::error::header_limit) return malformed("too large");
  // Beast asks for more on some broken request lines ("GET / \r\n"), but the head is all
  // there is: broken.
  if (ec == http::error::need_more || (!ec && !parser.is_header_done())) return malformed("malformed head");
  if (ec) return malformed(ec.message());

  const auto& request = parser.get();
  if (request.version() != 10 && request.version() != 11) return malformed("unsupported HTTP version");
  if (request.method() == http::verb::connect) return malformed("CONNECT refused");

  std::optional<std::string_view> target_authority;
  std::string target_error;
  if (!parseTarget(request.target(), target_authority, target_error)) return malformed(target_error);

  size_t host_count = request.count(http::field::host);
  if (host_count > 1) return malformed("two Host headers");

  std::optional<Authority> from_target;
  if (target_authority) {
    from_target = parseAuthority(*target_authority);
    if (from_target->kind == Authority::Kind::kInvalid) return malformed("invalid request target host");
  }

  Authority effective;
  if (host_count == 0) {
    // HTTP/1.1 requires Host (RFC 9112 3.2). HTTP/1.0 predates it: the name is then the
    // absolute-form target's, or there is none and the gateway decides by address.
    if (request.version() == 11) return malformed("no Host");
    if (!from_target) return make(SniffStatus::kHttp, {}, "no Host");
    effective = *from_target;
  } else {
    effective = parseAuthority(request.at(http::field::host));
    if (effective.kind == Authority::Kind::kInvalid) return malformed("invalid Host");
    // A server takes an absolute-form target's authority over Host (RFC 9112 3.2.2); both
    // must name one host so that what the gateway checks is what the server serves.
    if (from_target && (from_target->kind != effective.kind || from_target->host != effective.host)) {
      return malformed("absolute-URI names another host");
    }
  }
  if (effective.kind == Authority::Kind::kIpLiteral) return make(SniffStatus::kHttp, {}, "IP literal Host");
  return make(SniffStatus::kHttp, std::move(effective.host));
}

}  // namespace

SniffResult sniff(std::span<const uint8_t> bytes) {
  bytes = bytes.first(std::min(bytes.size(), kMaxSniffBytes));
  if (bytes.empty()) return make(SniffStatus::kNeedMore);
  if (bytes[0] == kContentHandshake) return sniffTls(bytes);
  size_t method_length = 0;
  switch (looksLikeHttp(bytes, method_length)) {
    case Looks::kYes: return sniffHttp(bytes, method_length);
    case Looks::kMaybe: return needMore(bytes);
    case Looks::kNo: break;
  }
  return make(SniffStatus::kOther);
}

}  // namespace space::net

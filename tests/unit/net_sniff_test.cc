// The sniffer of a guest's first bytes (src/net/sniff.h): real ClientHellos made by OpenSSL,
// hand-made hostile ones, HTTP request heads built to smuggle a second name past the gateway,
// and the replay of the gateway parsers' fuzz entry point over its seeds and mutations.
#include <gtest/gtest.h>
#include <openssl/ssl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "../fuzz/gateway_parsers.h"
#include "../support/mutations.h"
#include "net/dns_message.h"
#include "net/sniff.h"

namespace space::net {
namespace {

using namespace std::string_literals;  // "..."s keeps embedded NULs

SniffResult sniffText(const std::string& s) {
  return sniff(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

void expectResult(const SniffResult& r, SniffStatus status, const std::string& name, const std::string& detail) {
  EXPECT_EQ(r.status, status) << "name=" << r.name << " detail=" << r.detail;
  EXPECT_EQ(r.name, name);
  EXPECT_EQ(r.detail, detail);
}

// ---- ClientHellos -------------------------------------------------------------------------

// The first flight of an OpenSSL client (no server on the other end): one or more TLS records
// holding its ClientHello.
std::string opensslClientHello(const char* host, int max_version = 0) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  EXPECT_NE(ctx, nullptr);
  if (max_version != 0) SSL_CTX_set_max_proto_version(ctx, max_version);
  SSL* ssl = SSL_new(ctx);
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  SSL_set_bio(ssl, in, out);  // ssl owns both now
  if (host) {
    EXPECT_EQ(SSL_set_tlsext_host_name(ssl, host), 1);
  }
  SSL_set_connect_state(ssl);
  EXPECT_EQ(SSL_do_handshake(ssl), -1);  // waits for the ServerHello that never comes
  char* data = nullptr;
  long size = BIO_get_mem_data(out, &data);
  std::string hello(data, static_cast<size_t>(size));
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  return hello;
}

std::string u16(size_t v) { return {static_cast<char>(v >> 8 & 0xff), static_cast<char>(v & 0xff)}; }
std::string u24(size_t v) { return static_cast<char>(v >> 16 & 0xff) + u16(v & 0xffff); }
std::string extension(uint16_t type, const std::string& data) { return u16(type) + u16(data.size()) + data; }
std::string serverNameList(const std::vector<std::pair<uint8_t, std::string>>& names) {
  std::string list;
  for (const auto& [type, name] : names) list += static_cast<char>(type) + u16(name.size()) + name;
  return u16(list.size()) + list;
}
std::string sniExtension(const std::string& host) { return extension(0, serverNameList({{0, host}})); }

// A ClientHello body (after its handshake header) from its parts; the defaults are valid.
struct Hello {
  std::string version = "\x03\x03";
  std::string random = std::string(32, 'r');
  std::string session_id = std::string(32, 's');
  std::string ciphers = u16(0x1301) + u16(0x1302);
  std::string compression = "\x00"s;
  std::string extensions;  // concatenated extension() blocks
  bool no_extensions_block = false;
  std::string body() const {
    std::string b = version + random + static_cast<char>(session_id.size()) + session_id + u16(ciphers.size()) +
                    ciphers + static_cast<char>(compression.size()) + compression;
    if (!no_extensions_block) b += u16(extensions.size()) + extensions;
    return b;
  }
};

std::string handshakeMessage(const std::string& body) { return "\x01"s + u24(body.size()) + body; }

// The handshake bytes cut into TLS records of at most `fragment` bytes each.
std::string records(const std::string& handshake, size_t fragment = 16384) {
  std::string out;
  for (size_t pos = 0; pos < handshake.size(); pos += fragment) {
    std::string part = handshake.substr(pos, fragment);
    out += "\x16\x03\x01"s + u16(part.size()) + part;
  }
  return out;
}

std::string clientHello(const Hello& hello, size_t fragment = 16384) {
  return records(handshakeMessage(hello.body()), fragment);
}

Hello helloWithSni(const std::string& host) {
  Hello h;
  h.extensions = extension(0x000a, u16(2) + u16(0x001d)) + sniExtension(host) + extension(0x0017, "");
  return h;
}

// The handshake message inside the records of `flight` (all of type 22).
std::string handshakeOf(const std::string& flight) {
  std::string handshake;
  for (size_t pos = 0; pos + 5 <= flight.size();) {
    size_t length = static_cast<uint8_t>(flight[pos + 3]) << 8 | static_cast<uint8_t>(flight[pos + 4]);
    handshake += flight.substr(pos + 5, length);
    pos += 5 + length;
  }
  return handshake;
}

TEST(SniffTls, OpenSslClientHelloWithSni) {
  std::string hello = opensslClientHello("Example.COM");
  ASSERT_GT(hello.size(), 100u);
  expectResult(sniffText(hello), SniffStatus::kTls, "example.com", "");
  expectResult(sniffText(opensslClientHello("api.example.com.")), SniffStatus::kTls, "api.example.com", "");
  expectResult(sniffText(opensslClientHello("pypi.org", TLS1_2_VERSION)), SniffStatus::kTls, "pypi.org", "");
}

TEST(SniffTls, OpenSslClientHelloWithoutSni) {
  expectResult(sniffText(opensslClientHello(nullptr)), SniffStatus::kTls, "", "no SNI");
}

TEST(SniffTls, EveryPrefixOfAClientHelloNeedsMore) {
  std::string hello = opensslClientHello("example.com");
  for (size_t n = 0; n < hello.size(); ++n) {
    ASSERT_EQ(sniffText(hello.substr(0, n)).status, SniffStatus::kNeedMore) << n;
  }
  expectResult(sniffText(hello), SniffStatus::kTls, "example.com", "");
}

TEST(SniffTls, ClientHelloFragmentedOverRecordsIsReassembled) {
  std::string handshake = handshakeOf(opensslClientHello("fragmented.example"));
  for (size_t fragment : {1, 2, 5, 64, 300}) {
    std::string flight = records(handshake, fragment);
    expectResult(sniffText(flight), SniffStatus::kTls, "fragmented.example", "");
    // Fed a byte at a time (sampled; every cut for the small fragments).
    for (size_t n = 0; n < flight.size(); n += fragment < 64 ? 1 : 7) {
      ASSERT_EQ(sniffText(flight.substr(0, n)).status, SniffStatus::kNeedMore) << fragment << " " << n;
    }
  }
}

TEST(SniffTls, BytesAfterTheClientHelloAreIgnored) {
  // TLS 1.3 middlebox-compatible clients follow with change_cipher_spec and early data.
  std::string flight = opensslClientHello("example.com") + "\x14\x03\x03\x00\x01\x01"s + "\x17\x03\x03\x00\x02xx";
  expectResult(sniffText(flight), SniffStatus::kTls, "example.com", "");
}

TEST(SniffTls, HandMadeHelloWithoutExtensionsHasNoSni) {
  Hello h;
  h.no_extensions_block = true;
  expectResult(sniffText(clientHello(h)), SniffStatus::kTls, "", "no SNI");
  Hello empty;  // an empty extensions block
  expectResult(sniffText(clientHello(empty)), SniffStatus::kTls, "", "no SNI");
}

TEST(SniffTls, ZeroLengthExtensionsAreFineButNotAnEmptyServerName) {
  Hello h;
  h.extensions =
      extension(0x0017, "") + extension(0xff01, "\x00"s) + sniExtension("ok.example") + extension(0x0016, "");
  expectResult(sniffText(clientHello(h)), SniffStatus::kTls, "ok.example", "");
  h.extensions = extension(0x0017, "") + extension(0, "");
  expectResult(sniffText(clientHello(h)), SniffStatus::kMalformed, "", "bad server_name list");
  h.extensions = extension(0, u16(0));  // an empty list
  expectResult(sniffText(clientHello(h)), SniffStatus::kMalformed, "", "bad server_name list");
}

TEST(SniffTls, LengthsPastTheEndAreMalformed) {
  Hello h = helloWithSni("example.com");
  std::string body = h.body();
  // The last extension claims more bytes than the ClientHello has.
  {
    Hello bad = h;
    bad.extensions += u16(0x0023) + u16(100) + "short";
    expectResult(sniffText(clientHello(bad)), SniffStatus::kMalformed, "", "extension past the end");
  }
  // The extensions block length disagrees with what follows it, either way.
  for (int delta : {-1, 1}) {
    std::string b = body;
    size_t at = b.size() - h.extensions.size() - 2;
    size_t length = h.extensions.size() + static_cast<size_t>(delta);
    b[at] = static_cast<char>(length >> 8);
    b[at + 1] = static_cast<char>(length);
    expectResult(sniffText(records(handshakeMessage(b))), SniffStatus::kMalformed, "", "bad extensions length");
  }
  // The handshake header claims more than the records will deliver, then an alert arrives.
  {
    std::string hs = "\x01"s + u24(body.size() + 50) + body;
    std::string flight = records(hs) + "\x15\x03\x03\x00\x02\x02\x28"s;
    expectResult(sniffText(flight), SniffStatus::kMalformed, "", "not a handshake record");
    EXPECT_EQ(sniffText(records(hs)).status, SniffStatus::kNeedMore);
  }
  // The handshake header claims less: the body is cut inside the extensions.
  {
    std::string hs = "\x01"s + u24(body.size() - 3) + body;
    EXPECT_EQ(sniffText(records(hs)).status, SniffStatus::kMalformed);
  }
  // Server name entry longer than its list.
  {
    Hello bad;
    std::string list = u16(8) + "\x00"s + u16(30) + "abcde";
    bad.extensions = extension(0, list);
    expectResult(sniffText(clientHello(bad)), SniffStatus::kMalformed, "", "bad server_name list");
  }
  // The session id, cipher suites and compression methods each checked.
  {
    Hello bad = h;
    bad.session_id = std::string(33, 's');
    expectResult(sniffText(clientHello(bad)), SniffStatus::kMalformed, "", "bad session_id");
    bad = h;
    bad.ciphers = "\x13\x01\x13"s;
    expectResult(sniffText(clientHello(bad)), SniffStatus::kMalformed, "", "bad cipher_suites");
    bad.ciphers = "";
    expectResult(sniffText(clientHello(bad)), SniffStatus::kMalformed, "", "bad cipher_suites");
    bad = h;
    bad.compression = "";
    expectResult(sniffText(clientHello(bad)), SniffStatus::kMalformed, "", "bad compression_methods");
    bad = h;
    bad.version = "\x02\x00"s;
    expectResult(sniffText(clientHello(bad)), SniffStatus::kMalformed, "", "bad ClientHello version");
  }
  // A body that ends inside the random.
  expectResult(sniffText(records(handshakeMessage("\x03\x03"s + std::string(20, 'r')))), SniffStatus::kMalformed, "",
               "truncated ClientHello");
}

TEST(SniffTls, BadRecordsAreMalformedAsSoonAsSeen) {
  expectResult(sniffText("\x16\x02"s), SniffStatus::kMalformed, "", "bad record version");
  expectResult(sniffText("\x16\x03\x01\x00\x00"s), SniffStatus::kMalformed, "", "bad record length");
  expectResult(sniffText("\x16\x03\x01\x40\x01"s), SniffStatus::kMalformed, "", "bad record length");
  expectResult(sniffText("\x16\x03\x01\x00\x10\x02"s), SniffStatus::kMalformed, "", "not a ClientHello");
  EXPECT_EQ(sniffText("\x16"s).status, SniffStatus::kNeedMore);
  EXPECT_EQ(sniffText("\x16\x03\x01\x00\x10\x01\x00"s).status, SniffStatus::kNeedMore);
  // An alert between two fragments of the ClientHello.
  std::string handshake = handshakeOf(opensslClientHello("example.com"));
  std::string flight =
      records(handshake.substr(0, 40)) + "\x15\x03\x03\x00\x02\x01\x00"s + records(handshake.substr(40));
  expectResult(sniffText(flight), SniffStatus::kMalformed, "", "not a handshake record");
}

TEST(SniffTls, OverlongAndInvalidServerNamesAreMalformed) {
  for (const std::string& host :
       {std::string(64, 'a') + ".com", std::string(250, 'a') + ".com", "192.0.2.1"s, "good.example\0.evil.example"s,
        "good.example\0"s, ""s, "under score.example"s, "-lead.example"s, "a..b"s, "caf\xc3\xa9.example"s}) {
    expectResult(sniffText(clientHello(helloWithSni(host))), SniffStatus::kMalformed, "", "invalid SNI");
  }
  // The longest valid name passes.
  std::string longest =
      std::string(63, 'a') + "." + std::string(63, 'b') + "." + std::string(63, 'c') + "." + std::string(61, 'd');
  ASSERT_EQ(longest.size(), 253u);
  expectResult(sniffText(clientHello(helloWithSni(longest))), SniffStatus::kTls, longest, "");
}

TEST(SniffTls, TwoServerNamesAreMalformed) {
  Hello h = helloWithSni("good.example");
  h.extensions += sniExtension("evil.example");
  expectResult(sniffText(clientHello(h)), SniffStatus::kMalformed, "", "two server_name extensions");
  h.extensions = extension(0, serverNameList({{0, "good.example"}, {0, "evil.example"}}));
  expectResult(sniffText(clientHello(h)), SniffStatus::kMalformed, "", "two SNI host names");
  h.extensions = extension(0, serverNameList({{0, "good.example"}, {1, "evil.example"}}));
  expectResult(sniffText(clientHello(h)), SniffStatus::kMalformed, "", "unknown server_name type");
}

TEST(SniffTls, LargeClientHelloSplitOverRecords) {
  // ~10 KiB of padding (extension 21), in records of 4000 bytes: reassembled.
  Hello h = helloWithSni("big.example");
  h.extensions += extension(21, std::string(10000, '\0'));
  std::string flight = clientHello(h, 4000);
  ASSERT_GT(flight.size(), 10000u);
  expectResult(sniffText(flight), SniffStatus::kTls, "big.example", "");
  for (size_t n = 0; n < flight.size(); n += 97) {
    ASSERT_EQ(sniffText(flight.substr(0, n)).status, SniffStatus::kNeedMore) << n;
  }

  // Over 16 KiB: refused as soon as the handshake header shows its length.
  Hello huge = helloWithSni("big.example");
  huge.extensions += extension(21, std::string(16500, '\0'));
  std::string huge_flight = clientHello(huge, 4000);
  expectResult(sniffText(huge_flight.substr(0, 9)), SniffStatus::kMalformed, "", "too large");
  expectResult(sniffText(huge_flight), SniffStatus::kMalformed, "", "too large");

  // Small enough as a message, but cut into records so small that their headers push the
  // input past kMaxSniffBytes: refused once that much has arrived.
  Hello chopped = helloWithSni("big.example");
  chopped.extensions += extension(21, std::string(12000, '\0'));
  std::string chopped_flight = clientHello(chopped, 8);
  ASSERT_GT(chopped_flight.size(), kMaxSniffBytes);
  EXPECT_EQ(sniffText(chopped_flight.substr(0, kMaxSniffBytes - 1)).status, SniffStatus::kNeedMore);
  expectResult(sniffText(chopped_flight), SniffStatus::kMalformed, "", "too large");
}

TEST(SniffTls, BrokenTlsIsMalformedNotOther) {
  for (const std::string& s : {"\x16\x00"s, "\x16\x03\x01\x00\x05\x01\x00\x00\x01\xff"s, "\x16\x04"s}) {
    EXPECT_EQ(sniffText(s).status, SniffStatus::kMalformed) << s.size();
  }
  // SSLv2-style hellos and anything else binary are not TLS to us.
  EXPECT_EQ(sniffText("\x80\x2e\x01\x03\x01"s).status, SniffStatus::kOther);
}

// ---- HTTP heads ---------------------------------------------------------------------------

TEST(SniffHttp, PlainRequestHeads) {
  expectResult(sniffText("GET / HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n"), SniffStatus::kHttp,
               "example.com", "");
  expectResult(sniffText("POST /upload HTTP/1.1\r\nHost: Example.COM:8080\r\nContent-Length: 5000000\r\n\r\nxx"),
               SniffStatus::kHttp, "example.com", "");
  expectResult(sniffText("HEAD /x HTTP/1.1\r\nhost: pypi.org.\r\n\r\n"), SniffStatus::kHttp, "pypi.org", "");
  expectResult(sniffText("OPTIONS * HTTP/1.1\r\nHost: a.example\r\n\r\n"), SniffStatus::kHttp, "a.example", "");
  expectResult(sniffText("M-SEARCH / HTTP/1.1\r\nHost: a.example\r\n\r\n"), SniffStatus::kHttp, "a.example", "");
  expectResult(sniffText("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nHost: a.example\r\n\r\n5\r\nhello"),
               SniffStatus::kHttp, "a.example", "");
}

TEST(SniffHttp, IncompleteHeadsNeedMore) {
  std::string head = "GET /index.html HTTP/1.1\r\nHost: example.com\r\nUser-Agent: x\r\n\r\n";
  for (size_t n = 0; n < head.size(); ++n) {
    ASSERT_EQ(sniffText(head.substr(0, n)).status, SniffStatus::kNeedMore) << n;
  }
  expectResult(sniffText(head), SniffStatus::kHttp, "example.com", "");
}

TEST(SniffHttp, HostRules) {
  expectResult(sniffText("GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n"), SniffStatus::kMalformed, "",
               "two Host headers");
  expectResult(sniffText("GET / HTTP/1.1\r\nHost: a.example\r\nHOST: a.example\r\n\r\n"), SniffStatus::kMalformed, "",
               "two Host headers");
  expectResult(sniffText("GET / HTTP/1.1\r\nAccept: */*\r\n\r\n"), SniffStatus::kMalformed, "", "no Host");
  expectResult(sniffText("GET / HTTP/1.0\r\nAccept: */*\r\n\r\n"), SniffStatus::kHttp, "", "no Host");
  for (const char* host : {"good.example evil.example", "good .example", "good.example:", "good.example:0",
                           "good.example:65536", "good.example:80:80", "good.example:8o", "", "good.example\xff",
                           "[::1", "[zz::1]", "[::1]x", "user@good.example", "10.0.0.1.5"}) {
    SCOPED_TRACE(host);
    expectResult(sniffText("GET / HTTP/1.1\r\nHost: "s + host + "\r\n\r\n"), SniffStatus::kMalformed, "",
                 "invalid Host");
  }
  // Space before the colon (RFC 9112 5.1 says reject): Beast refuses the field.
  EXPECT_EQ(sniffText("GET / HTTP/1.1\r\nHost : evil.example\r\n\r\n").status, SniffStatus::kMalformed);
}

TEST(SniffHttp, IpLiteralHostsCarryNoName) {
  expectResult(sniffText("GET / HTTP/1.1\r\nHost: 203.0.113.7\r\n\r\n"), SniffStatus::kHttp, "", "IP literal Host");
  expectResult(sniffText("GET / HTTP/1.1\r\nHost: 203.0.113.7:8080\r\n\r\n"), SniffStatus::kHttp, "",
               "IP literal Host");
  expectResult(sniffText("GET / HTTP/1.1\r\nHost: [2001:db8::1]:443\r\n\r\n"), SniffStatus::kHttp, "",
               "IP literal Host");
  expectResult(sniffText("GET / HTTP/1.1\r\nHost: [::ffff:10.0.0.1]\r\n\r\n"), SniffStatus::kHttp, "",
               "IP literal Host");
}

TEST(SniffHttp, AbsoluteFormMustNameTheHostHeadersHost) {
  expectResult(sniffText("GET http://evil/ HTTP/1.1\r\nHost: good\r\n\r\n"), SniffStatus::kMalformed, "",
               "absolute-URI names another host");
  expectResult(sniffText("GET http://evil.example:80/x HTTP/1.1\r\nHost: good.example\r\n\r\n"),
               SniffStatus::kMalformed, "", "absolute-URI names another host");
  expectResult(sniffText("GET http://203.0.113.7/ HTTP/1.1\r\nHost: good.example\r\n\r\n"), SniffStatus::kMalformed, "",
               "absolute-URI names another host");
  expectResult(sniffText("GET HTTP://Good.Example:8080/x?y HTTP/1.1\r\nHost: good.example\r\n\r\n"), SniffStatus::kHttp,
               "good.example", "");
  expectResult(sniffText("GET http://good.example HTTP/1.1\r\nHost: good.example\r\n\r\n"), SniffStatus::kHttp,
               "good.example", "");
  // Userinfo: "good" to one parser, "evil" to another.
  expectResult(sniffText("GET http://good.example@evil.example/ HTTP/1.1\r\nHost: good.example\r\n\r\n"),
               SniffStatus::kMalformed, "", "userinfo in request target");
  expectResult(sniffText("GET http://bad_host!/ HTTP/1.1\r\nHost: good.example\r\n\r\n"), SniffStatus::kMalformed, "",
               "invalid request target host");
  // HTTP/1.0 without Host: the absolute-form target names the host.
  expectResult(sniffText("GET http://Named.Example/ HTTP/1.0\r\n\r\n"), SniffStatus::kHttp, "named.example", "");
  expectResult(sniffText("GET http://evil.example/ HTTP/1.1\r\n\r\n"), SniffStatus::kMalformed, "", "no Host");
}

TEST(SniffHttp, ConnectAndAuthorityFormAreRefused) {
  expectResult(sniffText("CONNECT "), SniffStatus::kMalformed, "", "CONNECT refused");
  expectResult(sniffText("CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n"),
               SniffStatus::kMalformed, "", "CONNECT refused");
  expectResult(sniffText("GET evil.example:80 HTTP/1.1\r\nHost: evil.example\r\n\r\n"), SniffStatus::kMalformed, "",
               "bad request target");
}

TEST(SniffHttp, LineFramingTricksAreMalformed) {
  expectResult(sniffText("GET / HTTP/1.1\r\nHost: good.example\r\n evil.example\r\n\r\n"), SniffStatus::kMalformed, "",
               "obs-fold");
  expectResult(sniffText("GET / HTTP/1.1\r\nX-A: 1\r\n\tHost: evil.example\r\nHost: good.example\r\n\r\n"),
               SniffStatus::kMalformed, "", "obs-fold");
  expectResult(sniffText("GET / HTTP/1.1\nHost: good.example\n\n"), SniffStatus::kMalformed, "", "bare LF");
  expectResult(sniffText("GET / HTTP/1.1\r\nHost: good.example\nHost: evil.example\r\n\r\n"), SniffStatus::kMalformed,
               "", "bare LF");
  expectResult(sniffText("GET / HTTP/1.1\r\nHost: good.example\rHost: evil.example\r\n\r\n"), SniffStatus::kMalformed,
               "", "bare CR");
  // NUL and other controls: Beast refuses the value.
  EXPECT_EQ(sniffText("GET / HTTP/1.1\r\nHost: good.example\0evil\r\n\r\n"s).status, SniffStatus::kMalformed);
  EXPECT_EQ(sniffText("GET / HTTP/1.1\r\nHost: good.example\x01\r\n\r\n"s).status, SniffStatus::kMalformed);
  // Line framing is only judged in the head: a body may hold anything.
  expectResult(sniffText("POST / HTTP/1.1\r\nHost: good.example\r\nContent-Length: 4\r\n\r\n\n \r\0"s),
               SniffStatus::kHttp, "good.example", "");
}

TEST(SniffHttp, BrokenOrUnsupportedRequestLines) {
  // HTTP/2 with prior knowledge: Beast refuses the version.
  EXPECT_EQ(sniffText("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").status, SniffStatus::kMalformed);
  EXPECT_EQ(sniffText("GET / HTTP/1.1 extra\r\nHost: a.example\r\n\r\n").status, SniffStatus::kMalformed);
  EXPECT_EQ(sniffText("GET  / HTTP/1.1\r\nHost: a.example\r\n\r\n").status, SniffStatus::kMalformed);
  EXPECT_EQ(sniffText("GET / FTP/1.1\r\nHost: a.example\r\n\r\n").status, SniffStatus::kMalformed);
  expectResult(sniffText("GET / \r\n\r\n"), SniffStatus::kMalformed, "", "malformed head");
  // Content-Length twice with different values: a smuggling classic Beast refuses.
  EXPECT_EQ(sniffText("POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n").status,
            SniffStatus::kMalformed);
}

TEST(SniffHttp, HugeHeadIsTooLarge) {
  std::string head = "GET / HTTP/1.1\r\nHost: a.example\r\nX-Big: " + std::string(20 * 1024, 'a') + "\r\n\r\n";
  expectResult(sniffText(head), SniffStatus::kMalformed, "", "too large");
  EXPECT_EQ(sniffText(head.substr(0, kMaxSniffBytes - 1)).status, SniffStatus::kNeedMore);
  expectResult(sniffText(head.substr(0, kMaxSniffBytes)), SniffStatus::kMalformed, "", "too large");
}

TEST(SniffHttp, OnlyTheFirstHeadIsJudged) {
  // A pipelined second request is the gateway's to handle (it sees one connection).
  expectResult(sniffText("GET / HTTP/1.1\r\nHost: good.example\r\n\r\nGET / HTTP/1.1\r\nHost: evil.example\r\n\r\n"),
               SniffStatus::kHttp, "good.example", "");
}

TEST(SniffOther, NotTlsNorHttp) {
  expectResult(sniffText("get / HTTP/1.1\r\nHost: a.example\r\n\r\n"), SniffStatus::kOther, "", "");
  expectResult(sniffText("Get / HTTP/1.1\r\n"), SniffStatus::kOther, "", "");
  expectResult(sniffText("SSH-2.0-OpenSSH_9.2p1\r\n"), SniffStatus::kOther, "", "");
  expectResult(sniffText("\x00\x00\x00\x08\x04\xd2\x16\x2f"s), SniffStatus::kOther, "", "");  // PostgreSQL SSLRequest
  expectResult(sniffText("PING\r\n"), SniffStatus::kOther, "", "");
  expectResult(sniffText(" GET / HTTP/1.1\r\n"), SniffStatus::kOther, "", "");
  expectResult(sniffText(std::string(25, 'A') + " / HTTP/1.1\r\n"), SniffStatus::kOther, "", "");
  // Until a byte rules HTTP out, upper-case letters could still be a method.
  EXPECT_EQ(sniffText("").status, SniffStatus::kNeedMore);
  EXPECT_EQ(sniffText("SSH-").status, SniffStatus::kNeedMore);
  EXPECT_EQ(sniffText("GE").status, SniffStatus::kNeedMore);
  // At most kMaxSniffBytes are looked at, whatever follows.
  std::string big = "GET / HTTP/1.1\r\nHost: a.example\r\n\r\n" + std::string(100000, 'x');
  expectResult(sniffText(big), SniffStatus::kHttp, "a.example", "");
}

}  // namespace
}  // namespace space::net

// ---- Replay of the fuzz entry point -------------------------------------------------------

namespace space::fuzz {
namespace {

// The seeds in tests/fuzz/corpus/gateway_parsers. Build trees live inside the checkout
// (build/, build-asan/, build-fuzz/) and __FILE__ is relative (-ffile-prefix-map), so the
// directory is found by walking up from the test binary; SPACE_SOURCE_DIR overrides.
std::filesystem::path corpusDir() {
  const std::filesystem::path relative = "tests/fuzz/corpus/gateway_parsers";
  if (const char* source = std::getenv("SPACE_SOURCE_DIR")) return std::filesystem::path(source) / relative;
  std::error_code ec;
  for (auto dir = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path(); !ec && dir.has_relative_path();
       dir = dir.parent_path()) {
    if (std::filesystem::is_directory(dir / relative)) return dir / relative;
  }
  return {};
}

std::map<std::string, std::string> corpusSeedFiles() {
  std::map<std::string, std::string> seeds;
  auto dir = corpusDir();
  if (dir.empty()) return seeds;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    seeds[entry.path().filename().string()] =
        std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return seeds;
}

std::vector<std::string> corpusSeeds() {
  std::vector<std::string> seeds;
  for (auto& [file, bytes] : corpusSeedFiles()) seeds.push_back(bytes);
  return seeds;
}

std::span<const uint8_t> asBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

void run(const std::string& s) { fuzzGatewayParsers(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }

// The seeds are what their names say, so the fuzzer starts from inputs that reach deep.
TEST(GatewayParsersFuzz, CorpusSeedsAreWhatTheySay) {
  auto seeds = corpusSeedFiles();
  ASSERT_FALSE(seeds.empty()) << "no seeds under " << corpusDir() << " (set SPACE_SOURCE_DIR)";
  for (const auto& [file, bytes] : seeds) run(bytes);
  using net::SniffStatus;
  EXPECT_EQ(net::sniff(asBytes(seeds["tls-clienthello-sni"])).name, "example.com");
  EXPECT_EQ(net::sniff(asBytes(seeds["tls-clienthello-no-sni"])).detail, "no SNI");
  EXPECT_EQ(net::sniff(asBytes(seeds["http-get"])).name, "example.com");
  auto query = net::parseQuery(asBytes(seeds["dns-a-query"]));
  ASSERT_TRUE(query.ok());
  EXPECT_EQ(query->name, "example.com");
  const std::string& response = seeds["dns-cname-response"];
  ASSERT_GE(response.size(), 2u);
  uint16_t id = static_cast<uint16_t>(static_cast<uint8_t>(response[0]) << 8 | static_cast<uint8_t>(response[1]));
  auto answer = net::parseAResponse(asBytes(response), id, "example.com");
  ASSERT_TRUE(answer.ok()) << answer.error().message;
  EXPECT_EQ(answer->ipv4, std::vector<uint32_t>{0xc000020a});
}

TEST(GatewayParsersFuzz, SeedsAndMutationsDoNotCrash) {
  std::vector<std::string> corpus = corpusSeeds();
  corpus.push_back(space::net::opensslClientHello("seed.example"));
  corpus.push_back(space::net::opensslClientHello(nullptr, TLS1_2_VERSION));
  corpus.push_back("GET http://a.example/ HTTP/1.1\r\nHost: a.example:80\r\nContent-Length: 3\r\n\r\nabc");
  corpus.push_back("");
  testsupport::replayMutations(corpus, 4321, 20000, [](const std::string& input) { run(input); });
}

}  // namespace
}  // namespace space::fuzz

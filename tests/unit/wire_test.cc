#include "agentproto/wire.h"

#include <gtest/gtest.h>

#include <random>

#include "agentproto/base64.h"

namespace space::agentproto {
namespace {

TEST(Base64, RoundTripsEveryLength) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  for (size_t n = 0; n <= all.size(); ++n) {
    auto in = all.substr(0, n);
    auto out = base64Decode(base64Encode(in));
    ASSERT_TRUE(out.has_value()) << n;
    EXPECT_EQ(*out, in);
  }
  EXPECT_EQ(base64Encode("hi\n"), "aGkK");
  EXPECT_EQ(base64Encode("Hello, World!\n"), "SGVsbG8sIFdvcmxkIQo=");
}

TEST(Base64, RejectsNonCanonicalInput) {
  for (const char* bad : {"abc", "a$c!", "aGl=", "=AAA", "AA=A", "aGk=x"}) EXPECT_FALSE(base64Decode(bad)) << bad;
}

TEST(Handshake, FindsAnswerAfterJunkAndIgnoresStaleNonces) {
  HandshakeScanner scanner(kOllehPrefix, "n2");
  auto r = scanner.feed("\x00\x01garbage from an old session");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r.value());
  r = scanner.feed(makeOlleh("n1", "{\"old\":true}"));  // answer to an earlier hello
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r.value());
  r = scanner.feed("SPACE-OLL");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r.value());
  r = scanner.feed("EH n2 {\"version\":\"x\"}\nPRI * HTTP");
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r.value());
  EXPECT_EQ(r.value()->nonce, "n2");
  EXPECT_EQ(r.value()->payload, "{\"version\":\"x\"}");
  EXPECT_EQ(r.value()->rest, "PRI * HTTP");
}

TEST(Handshake, GivesUpAfterBoundedJunk) {
  HandshakeScanner scanner(kHelloPrefix, "");
  std::string junk(1 << 20, 'x');
  Status last = okStatus();
  for (int i = 0; i < 8 && last.ok(); ++i) {
    auto r = scanner.feed(junk);
    if (!r.ok()) last = r.error();
  }
  EXPECT_FALSE(last.ok());
}

TEST(Handshake, OverlongLineIsSkippedNotBuffered) {
  HandshakeScanner scanner(kHelloPrefix, "");
  auto r = scanner.feed(std::string(kHelloPrefix) + std::string(10000, 'a'));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r.value());
  r = scanner.feed("\n" + makeHello("abc"));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r.value());
  EXPECT_EQ(r.value()->nonce, "abc");
}

TEST(Envelope, RoundTripsAcrossArbitrarySplits) {
  std::string stream =
      encodeEnvelope(0, R"({"a":1})") + encodeEnvelope(0, "") + encodeEnvelope(kEnvelopeEndStream, "{}");
  for (size_t split = 0; split <= stream.size(); ++split) {
    EnvelopeDecoder d;
    std::vector<Envelope> got;
    for (auto part : {stream.substr(0, split), stream.substr(split)}) {
      ASSERT_TRUE(d.feed(part).ok());
      while (true) {
        auto e = d.next();
        ASSERT_TRUE(e.ok());
        if (!e.value()) break;
        got.push_back(*e.value());
      }
    }
    ASSERT_EQ(got.size(), 3u) << split;
    EXPECT_EQ(got[0].payload, R"({"a":1})");
    EXPECT_EQ(got[2].flags, kEnvelopeEndStream);
    EXPECT_FALSE(d.midMessage());
  }
}

TEST(Envelope, RejectsOversizedAndCompressedBeforeBuffering) {
  EnvelopeDecoder d(1024);
  std::string header = encodeEnvelope(0, std::string(2000, 'x')).substr(0, 5);
  EXPECT_FALSE(d.feed(header).ok());
  EnvelopeDecoder c;
  EXPECT_FALSE(c.feed(encodeEnvelope(kEnvelopeCompressed, "{}")).ok());
}

TEST(Envelope, BufferStaysBoundedWhenChunksSplitEnvelopes) {
  EnvelopeDecoder d;
  std::string one = encodeEnvelope(0, std::string(100, 'x'));
  std::string stream;
  for (int i = 0; i < 2000; ++i) stream += one;
  // Feed in 77-byte chunks, so nearly every chunk ends inside an envelope.
  size_t taken = 0;
  for (size_t off = 0; off < stream.size(); off += 77) {
    ASSERT_TRUE(d.feed(std::string_view(stream).substr(off, 77)).ok());
    while (true) {
      auto e = d.next();
      ASSERT_TRUE(e.ok());
      if (!e.value()) break;
      ++taken;
    }
    ASSERT_LE(d.bufferedBytes(), one.size() + 77);
  }
  EXPECT_EQ(taken, 2000u);
}

TEST(Envelope, SurvivesRandomGarbage) {
  std::mt19937 rng(42);
  for (int round = 0; round < 200; ++round) {
    EnvelopeDecoder d(4096);
    std::string junk(static_cast<size_t>(rng() % 512), '\0');
    for (auto& ch : junk) ch = static_cast<char>(rng());
    if (!d.feed(junk).ok()) continue;
    for (int i = 0; i < 1000; ++i) {
      auto e = d.next();
      if (!e.ok() || !e.value()) break;
    }
  }
}

TEST(RpcCodes, RoundTripNamesAndStatuses) {
  EXPECT_EQ(rpcCodeFromName("not_found"), RpcCode::kNotFound);
  EXPECT_EQ(rpcCodeFromName("bogus"), RpcCode::kUnknown);
  EXPECT_EQ(httpStatusFor(RpcCode::kAlreadyExists), 409);
  EXPECT_EQ(rpcCodeFromHttpStatus(404), RpcCode::kNotFound);
  EXPECT_EQ(rpcCodeFromErrno(ENOSPC), RpcCode::kResourceExhausted);
  EXPECT_EQ(rpcCodeFromErrno(EEXIST), RpcCode::kAlreadyExists);
  EXPECT_EQ(rpcCodeFromErrno(EACCES), RpcCode::kPermissionDenied);
}

}  // namespace
}  // namespace space::agentproto

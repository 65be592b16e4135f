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

// base64DecodedSize accepts exactly what base64Decode accepts: every encoding, every 4-byte
// text over a small alphabet (padding, bad bits, bad bytes), and a few longer odd ones.
TEST(Base64, DecodedSizeAgreesWithDecode) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  for (size_t n = 0; n <= all.size(); ++n) EXPECT_EQ(base64DecodedSize(base64Encode(all.substr(0, n))), n);
  const std::string alphabet = "AQgh/+=$\0";
  std::string text(4, 'A');
  for (char a : alphabet)
    for (char b : alphabet)
      for (char c : alphabet)
        for (char d : alphabet) {
          text = {a, b, c, d};
          auto decoded = base64Decode(text);
          auto size = base64DecodedSize(text);
          ASSERT_EQ(decoded.has_value(), size.has_value()) << text;
          if (decoded) {
            EXPECT_EQ(decoded->size(), *size) << text;
          }
        }
  for (const char* odd : {"", "====", "AAAA====", "AA==AAAA", "aGk=aGk=", "aGkKaGk="}) {
    auto decoded = base64Decode(odd);
    auto size = base64DecodedSize(odd);
    ASSERT_EQ(decoded.has_value(), size.has_value()) << odd;
    if (decoded) {
      EXPECT_EQ(decoded->size(), *size) << odd;
    }
  }
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
    ASSERT_LE(d.bufferedBytes(), 2 * (one.size() + 77));  // its allocation: one envelope, grown
  }
  EXPECT_EQ(taken, 2000u);
}

// What it reports is the memory it holds: a large message's buffer is its exact size while it
// arrives (not doubled: 16 MiB for a message of 8), and is given back once the message is taken,
// even while the stream goes on (review helper-91: clear() kept the allocation, uncounted).
TEST(Envelope, ALargeMessagesBufferIsExactAndGivenBack) {
  EnvelopeDecoder d;
  const std::string big = encodeEnvelope(0, std::string(kMaxEnvelopeBytes, 'x'));
  for (size_t off = 0; off < big.size(); off += 16384) {
    ASSERT_TRUE(d.feed(std::string_view(big).substr(off, 16384)).ok());
    ASSERT_LE(d.bufferedBytes(), big.size() + 16384);
  }
  auto e = d.next();
  ASSERT_TRUE(e.ok() && e.value());
  EXPECT_EQ(e.value()->payload.size(), kMaxEnvelopeBytes);
  EXPECT_EQ(d.bufferedBytes(), 0u);
  // The same with the next message's first bytes behind it: they stay, the large buffer goes.
  ASSERT_TRUE(d.feed(big + encodeEnvelope(0, "{}").substr(0, 3)).ok());
  ASSERT_TRUE(d.next().value());
  ASSERT_TRUE(d.feed(std::string_view("\x00", 1)).ok());
  EXPECT_GT(d.bufferedBytes(), 0u);
  EXPECT_LE(d.bufferedBytes(), EnvelopeDecoder::kKeptCapacity);
}

// Random streams, mostly well-formed envelopes with random flags and lengths (some over the
// limit, some cut short), fed in random pieces: the decoder must yield exactly what a plain
// reading of the format says, and fail exactly where and how that reading does.
TEST(Envelope, SurvivesRandomGarbage) {
  std::mt19937 rng(42);
  constexpr size_t kMax = 4096;
  int errors = 0, truncated = 0, clean = 0;
  for (int round = 0; round < 2000; ++round) {
    std::string stream;
    const int count = static_cast<int>(rng() % 6);
    for (int i = 0; i < count; ++i) {
      uint8_t flags = static_cast<uint8_t>(rng() % 8 == 0 ? rng() : (rng() % 2) * kEnvelopeEndStream);
      uint32_t len = rng() % 10 == 0 ? static_cast<uint32_t>(rng()) : static_cast<uint32_t>(rng() % (kMax + 1));
      stream += static_cast<char>(flags);
      for (int shift : {24, 16, 8, 0}) stream += static_cast<char>((len >> shift) & 0xff);
      for (uint32_t k = 0; k < std::min<uint32_t>(len, kMax); ++k) stream += static_cast<char>(rng());
    }
    if (!stream.empty() && rng() % 3 == 0) stream.resize(rng() % stream.size());  // cut short

    // The reference reading: envelopes until an invalid header or the end of the bytes.
    std::vector<Envelope> want;
    std::optional<ErrorCode> want_error;
    size_t at = 0;
    while (stream.size() - at >= kEnvelopeHeader) {
      auto byte = [&](size_t i) { return static_cast<uint8_t>(stream[at + i]); };
      uint32_t len = (uint32_t{byte(1)} << 24) | (uint32_t{byte(2)} << 16) | (uint32_t{byte(3)} << 8) | byte(4);
      if (byte(0) & kEnvelopeCompressed) {
        want_error = ErrorCode::kInvalidArgument;
        break;
      }
      if (len > kMax) {
        want_error = ErrorCode::kResourceExhausted;
        break;
      }
      if (stream.size() - at - kEnvelopeHeader < len) break;
      want.push_back(Envelope{byte(0), stream.substr(at + kEnvelopeHeader, len)});
      at += kEnvelopeHeader + len;
    }
    const bool want_partial = !want_error && at < stream.size();

    EnvelopeDecoder d(kMax);
    std::vector<Envelope> got;
    std::optional<ErrorCode> got_error;
    for (size_t fed = 0; fed < stream.size() && !got_error;) {
      size_t piece = std::min<size_t>(stream.size() - fed, 1 + rng() % 700);
      if (auto st = d.feed(std::string_view(stream).substr(fed, piece)); !st.ok()) got_error = st.error().code;
      fed += piece;
      while (!got_error) {
        auto e = d.next();
        if (!e.ok()) {
          got_error = e.error().code;
          break;
        }
        if (!e.value()) break;
        got.push_back(std::move(*e.value()));
      }
    }
    SCOPED_TRACE("round " + std::to_string(round));
    ASSERT_EQ(got_error, want_error);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].flags, want[i].flags);
      EXPECT_EQ(got[i].payload, want[i].payload);
    }
    if (!want_error) {
      EXPECT_EQ(d.midMessage(), want_partial);
    }
    (want_error ? errors : want_partial ? truncated : clean)++;
  }
  // The generator reaches every outcome often enough to mean something.
  EXPECT_GT(errors, 200);
  EXPECT_GT(truncated, 200);
  EXPECT_GT(clean, 200);
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

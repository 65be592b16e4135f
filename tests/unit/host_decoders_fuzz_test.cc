// Replays the fuzz entry point (tests/fuzz/host_decoders.cc) over hand-made seeds and a fixed
// stream of pseudo-random and mutated inputs, so every build exercises the decoders of
// guest-controlled bytes. A crash or sanitizer report fails the test.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../fuzz/host_decoders.h"
#include "../support/mutations.h"
#include "agentproto/wire.h"
#include "vmm/qmp_client.h"

namespace space::fuzz {
namespace {

std::vector<std::string> seeds() {
  using agentproto::encodeEnvelope;
  using namespace std::string_literals;  // "..."s keeps embedded NULs
  return {
      "",
      agentproto::makeOlleh("n0nce", R"({"version":"1","uptime":1.5})"),
      "junk\0SPACE-OLLEH n0nce {}\nPRI"s,
      encodeEnvelope(0, R"({"event":{"start":{"pid":7}}})") +
          encodeEnvelope(0, R"({"event":{"data":{"stdout":"aGkK"}}})") +
          encodeEnvelope(0, R"({"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3"}}})") +
          encodeEnvelope(agentproto::kEnvelopeEndStream, "{}"),
      encodeEnvelope(0, R"({"event":{"data":{"stdout":"!!notbase64"}}})"),
      encodeEnvelope(0, R"({"event":{"end":{"exitCode":"x"}}})"),
      R"({"event": "SHUTDOWN", "data": {"guest": true, "reason": "guest-panic"}})",
      R"({"return": {"status": "running"}, "id": 3})",
      R"({"error": {"class": "GenericError", "desc": "x"}, "id": [1]})",
      std::string("\x00\x7f\xff\xff\xff", 5),
      std::string("\x03\x00\x00\x00\x02{}", 7),
      "HTTP/1.1 200 OK\r\nSet-Cookie: a=b\r\nConnection: keep-alive\r\nKeep-Alive: 5\r\n\r\n",
      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
      "/v1/sandboxes/sb_0123456789abcdefghij/ports/8080/a?b",
  };
}

// 200,000 nested arrays (~400 KB): parsed unbounded and then copied or dumped, this overflows
// the stack. As a QMP line, a stream message and plain JSON, each must be refused quietly.
TEST(HostDecodersFuzz, DeeplyNestedDocumentsDoNotCrash) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  for (const std::string& s :
       {R"({"return": )" + deep + "}\n", agentproto::encodeEnvelope(0, R"({"event":)" + deep + "}"), deep}) {
    fuzzHostDecoders(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  auto qmp = vmm::QmpClient::parseMessage(R"({"return": )" + deep + "}");
  ASSERT_FALSE(qmp.ok());
  EXPECT_NE(qmp.error().message.find("deeper than 64"), std::string::npos) << qmp.error().message;
}

TEST(HostDecodersFuzz, SeedsAndMutationsDoNotCrash) {
  testsupport::replayMutations(seeds(), 1234, 20000, [](const std::string& input) {
    fuzzHostDecoders(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  });
}

}  // namespace
}  // namespace space::fuzz

#include "host_decoders.h"

#include <string>
#include <string_view>

#include "agentproto/commands.h"
#include "agentproto/wire.h"
#include "vmm/qmp_client.h"

namespace space::fuzz {

void fuzzHostDecoders(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);

  // Handshake answer, fed in two pieces split at a data-dependent point.
  agentproto::HandshakeScanner scanner(agentproto::kOllehPrefix, "n0nce");
  size_t split = size == 0 ? 0 : data[0] % (size + 1);
  (void)scanner.feed(in.substr(0, split));
  (void)scanner.feed(in.substr(split));

  // Connect envelopes, bounded small so the limit path is reached too.
  agentproto::EnvelopeDecoder envelopes(1 << 12);
  if (envelopes.feed(in).ok()) {
    for (int i = 0; i < 4096; ++i) {
      auto e = envelopes.next();
      if (!e.ok() || !e.value()) break;
      nlohmann::json msg = nlohmann::json::parse(e.value()->payload, nullptr, false);
      if (!msg.is_discarded()) (void)agentproto::decodeProcessEvent(msg);
    }
  }

  // One QMP line.
  (void)vmm::QmpClient::parseMessage(std::string(in.substr(0, in.find('\n'))));

  // A process event as JSON text.
  nlohmann::json event = nlohmann::json::parse(in, nullptr, false);
  if (!event.is_discarded()) (void)agentproto::decodeProcessEvent(event);
}

}  // namespace space::fuzz

#ifdef SPACE_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  space::fuzz::fuzzHostDecoders(data, size);
  return 0;
}
#endif

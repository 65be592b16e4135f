#include "host_decoders.h"

#include <string>
#include <string_view>

#include "agentproto/commands.h"
#include "agentproto/wire.h"
#include "api/ingress.h"
#include "common/bounded_json.h"
#include "sandbox/metrics.h"
#include "vmm/qmp_client.h"

namespace space::fuzz {

namespace {

// What the host does with a parsed guest value: copies it into replies and dumps it. Both
// recurse per nesting level, so a value that got past the bound would crash here.
void useLikeTheHost(const nlohmann::json& value) {
  nlohmann::json copy = value;
  (void)copy.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  nlohmann::json wrapped = {{"entries", nlohmann::json::array({std::move(copy)})}};
  (void)(wrapped == value);
}

}  // namespace

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
      auto msg = parseJsonBounded(e.value()->payload);
      if (!msg.ok()) continue;
      useLikeTheHost(msg.value());
      (void)agentproto::decodeProcessEvent(msg.value());
    }
  }

  // One QMP line.
  auto qmp = vmm::QmpClient::parseMessage(std::string(in.substr(0, in.find('\n'))));
  if (qmp.ok()) useLikeTheHost(qmp.value().body);

  // A guest's answer on a proxied port (ingress): its response head, and the same bytes as a
  // preview target and host.
  if (size >= 4 && in.substr(size - 4) == "\r\n\r\n") (void)api::rewriteResponseHead(in, data[0] & 1);
  (void)api::ingressFromPath(in);
  (void)api::ingressFromHost(in, "preview.test", "/");

  // A process event, or an answer to Stats, as JSON text.
  auto event = parseJsonBounded(in);
  if (event.ok()) {
    useLikeTheHost(event.value());
    (void)agentproto::decodeProcessEvent(event.value());
    (void)sandbox::parseGuestStats(event.value(), uint64_t{256} << 20);
  }
}

}  // namespace space::fuzz

#ifdef SPACE_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  space::fuzz::fuzzHostDecoders(data, size);
  return 0;
}
#endif

#include "gateway/gateway_core.h"

#include <spdlog/spdlog.h>

namespace space::gateway {

std::shared_ptr<const net::Policy> GatewayCore::policy() {
  auto refresh = policy_.refresh();
  if (refresh.reloaded) {
    spdlog::info("policy reloaded: mode {}", net::modeName(policy_.current()->mode));
  } else if (refresh.failure) {
    spdlog::warn("policy reload failed, the previous policy stays: {}", *refresh.failure);
    audit.write(
        {{"kind", "gateway"}, {"allowed", false}, {"reason", "policy-reload-failed"}, {"detail", *refresh.failure}});
  }
  return policy_.current();
}

}  // namespace space::gateway

#include "gateway/gateway_core.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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
  auto current = policy_.current();
  if (current != seen_) {
    auto effective = std::make_shared<net::Policy>(*current);
    effective->openable = options.openable;
    effective_ = std::move(effective);
    seen_ = std::move(current);
  }
  return effective_;
}

const std::string* GatewayCore::secret(std::string_view name) {
  if (auto failure = credentials_.refresh()) {
    spdlog::warn("credentials reload failed, the previous values stay: {}", *failure);
    audit.write(
        {{"kind", "gateway"}, {"allowed", false}, {"reason", "credentials-reload-failed"}, {"detail", *failure}});
  }
  return credentials_.secret(name);
}

bool GatewayCore::isLocalAddress(uint32_t ipv4) {
  auto now = std::chrono::steady_clock::now();
  if (local_addresses_at_ == std::chrono::steady_clock::time_point{} ||
      now - local_addresses_at_ > std::chrono::seconds(1)) {
    // The calling thread is in the upstream namespace: getifaddrs lists its interfaces.
    ifaddrs* list = nullptr;
    if (getifaddrs(&list) == 0) {
      local_addresses_.clear();
      for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
        if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
        local_addresses_.push_back(ntohl(reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr));
      }
      freeifaddrs(list);
      local_addresses_at_ = now;
    } else {
      spdlog::warn("cannot list the upstream namespace's addresses: {}", strerror(errno));
    }
  }
  return std::find(local_addresses_.begin(), local_addresses_.end(), ipv4) != local_addresses_.end();
}

}  // namespace space::gateway

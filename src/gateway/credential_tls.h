// Credential TLS: a guest's TLS connection to a credential rule's host, terminated by the
// gateway so that the rule's headers can be added. The guest gets a leaf certificate for the
// name it asked for (SNI), signed by its sandbox's credential CA (which the guest trusts and
// whose key stays on the host); its one HTTP/1.1 request is read, its Host checked against the
// SNI, and the headers added (injectCredential); then the gateway opens its own TLS connection
// to the original destination, verifies the server's certificate for the rule's name against
// the host's trust store, and only then sends the request. Connections to every other host are
// spliced by the TCP proxy and never decrypted.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gateway/gateway_core.h"

namespace space::gateway {

// What the TCP proxy decided about the connection before handing it over.
struct CredentialTlsFacts {
  uint32_t ip = 0;  // the original destination
  uint16_t port = 0;
  std::string name;    // the ClientHello's server name (normalized)
  std::string reason;  // the policy's reason for allowing it
  std::vector<std::string> pinned;
  net::CredentialRule rule;
  std::chrono::steady_clock::time_point start;
};

// Takes the guest's connection and the bytes already read from it (its ClientHello).
void startCredentialTls(std::shared_ptr<GatewayCore> core, boost::asio::ip::tcp::socket guest,
                        std::vector<uint8_t> already_read, CredentialTlsFacts facts);

}  // namespace space::gateway

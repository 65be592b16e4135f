// Ingress (preview URLs): HTTP and WebSocket from clients of spaced to a port of a sandbox's
// guest, by path (`/v1/sandboxes/{id}/ports/{port}/...`) or by host (`{port}-{id}.<domain>`).
//
// spaced connects from the sandbox's slot to the guest (net::SandboxNetwork::connectToGuest),
// sends the request with a rewritten target and head, and relays the guest's answer byte for
// byte; after a `101 Switching Protocols` it relays both ways until either side closes. Each
// proxied request gets its own connection to the guest (`Connection: close`), and the client's
// connection ends with the answer, so nothing the client sends after its request (a pipelined
// request with its API key) can reach the guest.
//
// Access: the owning tenant's API key (removed before the guest sees the request), or the
// sandbox's access token in `X-Space-Access-Token` (an HMAC of its id under the node's ingress
// key, so branches and other sandboxes each have their own), or none for a sandbox whose
// network says `"public_ports": true`.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "common/unix_socket.h"
#include "http/message.h"

namespace space::api {

inline constexpr const char* kAccessTokenHeader = "X-Space-Access-Token";

struct IngressOptions {
  // Host-based preview URLs `{port}-{id}.<domain>`; empty: only the path form is served.
  std::string domain;
  // The node's secret behind access tokens (spaced keeps it in <data-dir>/ingress-key).
  std::string token_key;
  // How long the guest may take to start answering a request it was sent in full.
  std::chrono::milliseconds response_timeout{120000};
  // A proxied connection with no byte either way for this long is closed.
  std::chrono::milliseconds idle_timeout{600000};
  // The guest's response heads (interim 1xx ones included), at most: more is a 502.
  size_t max_response_head = 64 * 1024;
  // Proxied connections of the whole node at once (per front end), a tenant a quarter of them;
  // more get 503 (429 on E2B's front). Each sandbox also has its own cap
  // (net::kMaxGuestConnections). Once its guest answered, a connection holds no thread (the
  // event loop relays it): two descriptors and two 64 KiB buffers.
  size_t max_connections = 1024;
  // Of those, the ones whose guest has not answered yet, which hold a server thread each (for
  // up to response_timeout), a tenant a quarter of them: the API keeps its threads.
  size_t max_waiting = 256;
};

// Where an ingress request goes.
struct IngressTarget {
  std::string sandbox_id;
  uint16_t port = 0;
  std::string target;  // path and query the guest gets ("/" at least)
  std::string prefix;  // the path prefix removed (path form), for X-Forwarded-Prefix
  // The path form without a slash after the port: the client is redirected to it with one,
  // so the guest's relative links resolve under the prefix.
  bool needs_slash = false;
  // More request fields the guest must not see (lower-case names): a front end's own credentials.
  std::vector<std::string> strip_headers;
};

// The path form: nullopt when `raw_target` (as sent, path and query) is not under
// /v1/sandboxes/{id}/ports/; an error when it is but names no valid sandbox id or port.
std::optional<Result<IngressTarget>> ingressFromPath(std::string_view raw_target);
// The host form `{port}-{id}.<domain>` (optionally with `:port`), where `{id}` spells the
// sandbox id with '-' for '_' (host names have no '_'); nullopt for any other host, including
// other names under the domain (spaced's own API name may be one).
std::optional<Result<IngressTarget>> ingressFromHost(std::string_view host, std::string_view domain,
                                                     std::string_view raw_target);
// The host name of a sandbox's port under `domain`.
std::string ingressHost(std::string_view sandbox_id, uint16_t port, std::string_view domain);

// A sandbox's access token: hex HMAC-SHA256 of its id under `key`.
std::string accessToken(std::string_view key, std::string_view sandbox_id);
// Compared in constant time.
bool accessTokenMatches(std::string_view key, std::string_view sandbox_id, std::string_view presented);

// The request head the guest gets: the client's fields less hop-by-hop ones, Expect, the
// access token, the console's session cookie and (if `strip_authorization`) Authorization;
// framing for the body as the client sent it; `Connection: close`, or the upgrade the client asked for; X-Forwarded-*.
std::string guestRequestHead(const http::Request& request, const IngressTarget& target, bool upgrade,
                             bool strip_authorization);
// Whether the request asks for a protocol upgrade (WebSocket).
bool wantsUpgrade(const http::Request& request);

// The guest's response head, parsed as far as relaying needs. `head` ends with the empty line.
struct GuestResponseHead {
  int status = 0;
  std::string head;  // as the client gets it
};
// Checks the status line; for anything but 101 replaces the connection fields with
// `Connection: close` (the client's connection ends with this answer). On the path form
// (`same_origin_as_api`) the guest's page would share spaced's origin: its cookies and the other
// fields that act on a whole origin (Clear-Site-Data, HSTS, Alt-Svc, Service-Worker-Allowed,
// reporting) are dropped, and it gets `Content-Security-Policy: sandbox` (an origin of its own; scripts still run).
Result<GuestResponseHead> rewriteResponseHead(std::string_view head, bool same_origin_as_api = false);

// Why a request for a port on the path form (spaced's own origin) is refused, or nullopt: a
// service worker's script, or a subresource that a page of spaced's origin (the console) asks
// for (Sec-Fetch-Site same-origin and a Sec-Fetch-Dest other than document).
std::optional<std::string> refusedOnApiOrigin(const http::Request& request);

// Sends the request (head and body) to the guest on `guest`, waits for its answer's head on
// this thread, and then hands the connection to the server's event loop (Response::relay),
// which relays the answer, and for an accepted upgrade both ways until either side ends.
// Answers the client itself when the guest fails before its answer starts (502, 504).
// `guest` is a non-blocking socket owned by `keep`, which also holds whatever counts the
// connection: it goes when the relay ends (on the event loop: its release must not block), or
// when this returns without one. Shut down from elsewhere, the socket ends the relay.
// `until_answered` (may be null) goes as soon as the guest's answer head has come, or when this
// returns: a place among the connections that hold a thread (IngressOptions::max_waiting).
void proxyToGuest(http::Request& request, http::Response& response, int guest, std::shared_ptr<void> keep,
                  std::shared_ptr<void> until_answered, const IngressTarget& target, bool strip_authorization,
                  const IngressOptions& options);

}  // namespace space::api

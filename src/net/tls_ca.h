// The certificates of credential TLS: a sandbox's own certificate authority, which its guest
// trusts and whose key never enters the guest, and the leaf certificates its gateway signs with
// it for the credential rules' hosts, so that it can read (and add headers to) the guest's
// requests to those hosts and nothing else.
//
// The authority is derived, not stored: its key comes from a 32-byte seed (spaced derives one
// per sandbox from the node key, secrets::SecretBox::derive), so spaced makes the same authority
// again after a restart, a suspend or a re-adoption, and nothing on disk holds a CA key. ECDSA
// P-256 and SHA-256 throughout: what every TLS client in the guest (OpenSSL, GnuTLS, Node)
// verifies.
#pragma once

#include <openssl/evp.h>
#include <openssl/x509.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "common/result.h"

namespace space::net {

struct CaMaterial {
  std::string cert_pem;  // the authority's self-signed certificate (what the guest trusts)
  std::string key_pem;   // its private key, PKCS#8 (for the gateway only)
};

using CaSeed = std::array<unsigned char, 32>;

// The authority for `seed`. The same seed gives the same key, subject and certificate fields
// (the signature alone may differ), so a certificate made again verifies what the first signed.
// `label` goes in its subject ("SPACE credential CA <label>").
Result<CaMaterial> deriveCredentialCa(const CaSeed& seed, std::string_view label);

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

struct LeafCertificate {
  X509Ptr cert;
  EVP_PKEY* key = nullptr;  // the minter's, shared by its leaves; lives as long as the minter
  std::chrono::system_clock::time_point made;
};

// Signs leaf certificates for host names with an authority's key: one P-256 key for all its
// leaves (made once), a certificate per host, kept (bounded) and made again once a day.
class LeafMinter {
 public:
  static constexpr size_t kMaxCachedLeaves = 256;
  static Result<std::unique_ptr<LeafMinter>> fromPem(std::string_view cert_pem, std::string_view key_pem);

  // A certificate for `host` (a normalized host name): valid from a day before `now` for 30
  // days, subjectAltName DNS:host, serverAuth only. The pointer is valid until the next call.
  Result<const LeafCertificate*> leafFor(std::string_view host, std::chrono::system_clock::time_point now);

  X509* caCertificate() const { return ca_cert_.get(); }

 private:
  LeafMinter() = default;
  X509Ptr ca_cert_;
  PkeyPtr ca_key_;
  PkeyPtr leaf_key_;
  std::map<std::string, LeafCertificate, std::less<>> leaves_;
};

}  // namespace space::net

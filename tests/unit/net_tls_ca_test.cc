#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include "net/tls_ca.h"

namespace space::net {
namespace {

CaSeed seedOf(unsigned char fill) {
  CaSeed seed;
  seed.fill(fill);
  return seed;
}

X509Ptr parseCert(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509Ptr cert(PEM_read_bio_X509(bio, nullptr, nullptr, nullptr));
  BIO_free(bio);
  return cert;
}

std::string publicKeyDer(X509* cert) {
  unsigned char* der = nullptr;
  int n = i2d_PUBKEY(X509_get0_pubkey(cert), &der);
  std::string out(reinterpret_cast<char*>(der), static_cast<size_t>(n));
  OPENSSL_free(der);
  return out;
}

// Verifies `leaf` as a TLS server certificate for `host` with `ca` the only trusted root.
int verify(X509* ca, X509* leaf, const std::string& host) {
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, leaf, nullptr);
  X509_VERIFY_PARAM* param = X509_STORE_CTX_get0_param(ctx);
  X509_VERIFY_PARAM_set_purpose(param, X509_PURPOSE_SSL_SERVER);
  X509_VERIFY_PARAM_set1_host(param, host.c_str(), host.size());
  X509_VERIFY_PARAM_set_flags(param, X509_V_FLAG_X509_STRICT);
  int ok = X509_verify_cert(ctx);
  int err = ok == 1 ? X509_V_OK : X509_STORE_CTX_get_error(ctx);
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  return err;
}

TEST(CredentialCa, TheSameSeedMakesTheSameAuthorityAndAnotherSeedAnother) {
  auto first = deriveCredentialCa(seedOf(7), "sbx_a");
  auto again = deriveCredentialCa(seedOf(7), "sbx_a");
  auto other = deriveCredentialCa(seedOf(8), "sbx_b");
  ASSERT_TRUE(first.ok()) << first.error().message;
  ASSERT_TRUE(again.ok() && other.ok());
  X509Ptr a = parseCert(first->cert_pem), b = parseCert(again->cert_pem), c = parseCert(other->cert_pem);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(publicKeyDer(a.get()), publicKeyDer(b.get()));
  EXPECT_EQ(X509_NAME_cmp(X509_get_subject_name(a.get()), X509_get_subject_name(b.get())), 0);
  EXPECT_EQ(ASN1_INTEGER_cmp(X509_get_serialNumber(a.get()), X509_get_serialNumber(b.get())), 0);
  EXPECT_NE(publicKeyDer(a.get()), publicKeyDer(c.get()));
  EXPECT_EQ(X509_check_ca(a.get()), 1);
  EXPECT_NE(first->key_pem.find("BEGIN PRIVATE KEY"), std::string::npos);
  EXPECT_EQ(first->cert_pem.find("PRIVATE"), std::string::npos);
}

TEST(CredentialCa, LeavesVerifyForTheirHostOnlyEvenUnderAnAuthorityMadeAgain) {
  auto ca = deriveCredentialCa(seedOf(3), "sbx_leaf");
  ASSERT_TRUE(ca.ok());
  auto minter = LeafMinter::fromPem(ca->cert_pem, ca->key_pem);
  ASSERT_TRUE(minter.ok()) << minter.error().message;
  const auto now = std::chrono::system_clock::now();
  auto leaf = minter.value()->leafFor("api.example.test", now);
  ASSERT_TRUE(leaf.ok()) << leaf.error().message;
  X509Ptr trusted = parseCert(ca->cert_pem);
  EXPECT_EQ(verify(trusted.get(), leaf.value()->cert.get(), "api.example.test"), X509_V_OK);
  EXPECT_EQ(verify(trusted.get(), leaf.value()->cert.get(), "other.example.test"), X509_V_ERR_HOSTNAME_MISMATCH);
  // The guest keeps the certificate of its first create; spaced makes the authority again
  // after a restart or resume, and its leaves must still verify against the kept one.
  auto remade = deriveCredentialCa(seedOf(3), "sbx_leaf");
  ASSERT_TRUE(remade.ok());
  auto second_minter = LeafMinter::fromPem(remade->cert_pem, remade->key_pem);
  ASSERT_TRUE(second_minter.ok());
  auto second_leaf = second_minter.value()->leafFor("api.example.test", now);
  ASSERT_TRUE(second_leaf.ok());
  EXPECT_EQ(verify(trusted.get(), second_leaf.value()->cert.get(), "api.example.test"), X509_V_OK);
  // Another sandbox's authority signs nothing this one trusts.
  auto foreign = deriveCredentialCa(seedOf(4), "sbx_other");
  ASSERT_TRUE(foreign.ok());
  auto foreign_minter = LeafMinter::fromPem(foreign->cert_pem, foreign->key_pem);
  ASSERT_TRUE(foreign_minter.ok());
  auto foreign_leaf = foreign_minter.value()->leafFor("api.example.test", now);
  ASSERT_TRUE(foreign_leaf.ok());
  EXPECT_NE(verify(trusted.get(), foreign_leaf.value()->cert.get(), "api.example.test"), X509_V_OK);
}

TEST(CredentialCa, LeavesAreKeptADayAndBounded) {
  auto ca = deriveCredentialCa(seedOf(5), "sbx_cache");
  ASSERT_TRUE(ca.ok());
  auto minter = LeafMinter::fromPem(ca->cert_pem, ca->key_pem);
  ASSERT_TRUE(minter.ok());
  const auto now = std::chrono::system_clock::now();
  auto first = minter.value()->leafFor("a.test", now);
  ASSERT_TRUE(first.ok());
  X509* first_cert = first.value()->cert.get();
  X509Ptr first_copy(X509_dup(first_cert));  // the minter frees the old one when it renews it
  auto same = minter.value()->leafFor("a.test", now + std::chrono::hours(1));
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same.value()->cert.get(), first_cert);
  auto renewed = minter.value()->leafFor("a.test", now + std::chrono::hours(25));
  ASSERT_TRUE(renewed.ok());
  EXPECT_NE(X509_cmp(renewed.value()->cert.get(), first_copy.get()), 0);
  for (size_t i = 0; i < LeafMinter::kMaxCachedLeaves + 10; ++i) {
    ASSERT_TRUE(minter.value()->leafFor("h" + std::to_string(i) + ".test", now).ok());
  }
  // A long name gets no common name (at most 64 characters) but still its subjectAltName.
  const std::string long_name = std::string(70, 'a') + ".test";
  auto long_leaf = minter.value()->leafFor(long_name, now);
  ASSERT_TRUE(long_leaf.ok()) << long_leaf.error().message;
  X509Ptr trusted = parseCert(ca->cert_pem);
  EXPECT_EQ(verify(trusted.get(), long_leaf.value()->cert.get(), long_name), X509_V_OK);
  EXPECT_FALSE(minter.value()->leafFor("", now).ok());
}

TEST(CredentialCa, AMismatchedOrMalformedAuthorityIsRefused) {
  auto ca = deriveCredentialCa(seedOf(1), "x");
  auto other = deriveCredentialCa(seedOf(2), "y");
  ASSERT_TRUE(ca.ok() && other.ok());
  EXPECT_FALSE(LeafMinter::fromPem(ca->cert_pem, other->key_pem).ok());
  EXPECT_FALSE(LeafMinter::fromPem("not pem", ca->key_pem).ok());
  EXPECT_FALSE(LeafMinter::fromPem(ca->cert_pem, "").ok());
}

}  // namespace
}  // namespace space::net

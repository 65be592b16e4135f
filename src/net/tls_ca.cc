#include "net/tls_ca.h"

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/obj_mac.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/x509v3.h>

#include <functional>
#include <vector>

namespace space::net {

namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct BnFree {
  void operator()(BIGNUM* b) const { BN_clear_free(b); }
};
struct BnCtxFree {
  void operator()(BN_CTX* c) const { BN_CTX_free(c); }
};
struct GroupFree {
  void operator()(EC_GROUP* g) const { EC_GROUP_free(g); }
};
struct PointFree {
  void operator()(EC_POINT* p) const { EC_POINT_free(p); }
};
struct ParamBldFree {
  void operator()(OSSL_PARAM_BLD* b) const { OSSL_PARAM_BLD_free(b); }
};
struct ParamFree {
  // It holds the private scalar; OpenSSL 3.0 has no OSSL_PARAM_clear_free.
  void operator()(OSSL_PARAM* params) const {
    for (OSSL_PARAM* p = params; p != nullptr && p->key != nullptr; ++p) {
      if (p->data != nullptr) OPENSSL_cleanse(p->data, p->data_size);
    }
    OSSL_PARAM_free(params);
  }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
};
struct NamesFree {
  void operator()(GENERAL_NAMES* n) const { GENERAL_NAMES_free(n); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using BnPtr = std::unique_ptr<BIGNUM, BnFree>;

Error tlsError(const std::string& what) {
  return makeError(ErrorCode::kInternal, what + " (OpenSSL error " + std::to_string(ERR_get_error()) + ")");
}

// The P-256 key whose private scalar is `seed` reduced into [1, n-1].
Result<PkeyPtr> keyFromSeed(const CaSeed& seed) {
  std::unique_ptr<EC_GROUP, GroupFree> group(EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1));
  std::unique_ptr<BN_CTX, BnCtxFree> bn_ctx(BN_CTX_new());
  BnPtr scalar(BN_bin2bn(seed.data(), static_cast<int>(seed.size()), nullptr));
  BnPtr order_minus_one(BN_dup(EC_GROUP_get0_order(group.get())));
  if (!group || !bn_ctx || !scalar || !order_minus_one || !BN_sub_word(order_minus_one.get(), 1) ||
      !BN_mod(scalar.get(), scalar.get(), order_minus_one.get(), bn_ctx.get()) || !BN_add_word(scalar.get(), 1)) {
    return tlsError("cannot derive the CA's private scalar");
  }
  std::unique_ptr<EC_POINT, PointFree> point(EC_POINT_new(group.get()));
  if (!point || !EC_POINT_mul(group.get(), point.get(), scalar.get(), nullptr, nullptr, bn_ctx.get())) {
    return tlsError("cannot compute the CA's public key");
  }
  std::vector<unsigned char> public_octets(65);
  if (EC_POINT_point2oct(group.get(), point.get(), POINT_CONVERSION_UNCOMPRESSED, public_octets.data(),
                         public_octets.size(), bn_ctx.get()) != public_octets.size()) {
    return tlsError("cannot encode the CA's public key");
  }
  std::unique_ptr<OSSL_PARAM_BLD, ParamBldFree> bld(OSSL_PARAM_BLD_new());
  if (!bld || !OSSL_PARAM_BLD_push_utf8_string(bld.get(), OSSL_PKEY_PARAM_GROUP_NAME, "prime256v1", 0) ||
      !OSSL_PARAM_BLD_push_BN(bld.get(), OSSL_PKEY_PARAM_PRIV_KEY, scalar.get()) ||
      !OSSL_PARAM_BLD_push_octet_string(bld.get(), OSSL_PKEY_PARAM_PUB_KEY, public_octets.data(),
                                        public_octets.size())) {
    return tlsError("cannot describe the CA's key");
  }
  std::unique_ptr<OSSL_PARAM, ParamFree> params(OSSL_PARAM_BLD_to_param(bld.get()));
  std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree> ctx(EVP_PKEY_CTX_new_from_name(nullptr, "EC", nullptr));
  EVP_PKEY* key = nullptr;
  if (!params || !ctx || EVP_PKEY_fromdata_init(ctx.get()) <= 0 ||
      EVP_PKEY_fromdata(ctx.get(), &key, EVP_PKEY_KEYPAIR, params.get()) <= 0) {
    return tlsError("cannot make the CA's key");
  }
  return PkeyPtr(key);
}

bool addExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) return false;
  bool added = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return added;
}

bool setSerial(X509* cert, const unsigned char* bytes, size_t n) {
  BnPtr serial(BN_bin2bn(bytes, static_cast<int>(n), nullptr));
  if (!serial) return false;
  BN_clear_bit(serial.get(), static_cast<int>(n * 8 - 1));  // positive, as DER wants it
  if (BN_is_zero(serial.get())) BN_one(serial.get());
  return BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert)) != nullptr;
}

Result<std::string> pem(const std::function<int(BIO*)>& write) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || write(bio.get()) != 1) return tlsError("cannot write PEM");
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  std::string out(data, static_cast<size_t>(n));
  // The key's PEM sits in the BIO's buffer: wiped before it is freed.
  OPENSSL_cleanse(data, static_cast<size_t>(n));
  return out;
}

}  // namespace

Result<CaMaterial> deriveCredentialCa(const CaSeed& seed, std::string_view label) {
  auto key = keyFromSeed(seed);
  if (!key.ok()) return key.error();
  X509Ptr cert(X509_new());
  if (!cert || !X509_set_version(cert.get(), 2)) return tlsError("cannot make the CA certificate");
  // The serial: a hash of the seed under a label of its own (the seed is the private key).
  unsigned char digest[SHA256_DIGEST_LENGTH];
  std::string serial_input = "space credential CA serial\n";
  serial_input.append(reinterpret_cast<const char*>(seed.data()), seed.size());
  SHA256(reinterpret_cast<const unsigned char*>(serial_input.data()), serial_input.size(), digest);
  OPENSSL_cleanse(serial_input.data(), serial_input.size());
  X509_NAME* name = X509_get_subject_name(cert.get());
  const std::string common_name = ("SPACE credential CA " + std::string(label)).substr(0, 64);
  if (!setSerial(cert.get(), digest, 16) ||
      !X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>("SPACE"), -1, -1,
                                  0) ||
      !X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                  reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1, 0) ||
      !X509_set_issuer_name(cert.get(), name) ||
      // Fixed dates: the same seed must give the same certificate whenever it is made again.
      !ASN1_TIME_set_string_X509(X509_getm_notBefore(cert.get()), "20250101000000Z") ||
      !ASN1_TIME_set_string_X509(X509_getm_notAfter(cert.get()), "20450101000000Z") ||
      !X509_set_pubkey(cert.get(), key->get()) ||
      !addExtension(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE,pathlen:0") ||
      !addExtension(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign") ||
      !addExtension(cert.get(), cert.get(), NID_subject_key_identifier, "hash") ||
      X509_sign(cert.get(), key->get(), EVP_sha256()) == 0) {
    return tlsError("cannot make the CA certificate");
  }
  CaMaterial out;
  auto cert_pem = pem([&](BIO* b) { return PEM_write_bio_X509(b, cert.get()); });
  auto key_pem =
      pem([&](BIO* b) { return PEM_write_bio_PrivateKey(b, key->get(), nullptr, nullptr, 0, nullptr, nullptr); });
  if (!cert_pem.ok()) return cert_pem.error();
  if (!key_pem.ok()) return key_pem.error();
  out.cert_pem = std::move(cert_pem.value());
  out.key_pem = std::move(key_pem.value());
  return out;
}

Result<std::unique_ptr<LeafMinter>> LeafMinter::fromPem(std::string_view cert_pem, std::string_view key_pem) {
  std::unique_ptr<LeafMinter> minter(new LeafMinter());
  BioPtr cert_bio(BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())));
  BioPtr key_bio(BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())));
  if (!cert_bio || !key_bio) return tlsError("cannot read the CA");
  minter->ca_cert_.reset(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  minter->ca_key_.reset(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (!minter->ca_cert_ || !minter->ca_key_) {
    ERR_clear_error();
    return makeError(ErrorCode::kInvalidArgument, "the CA certificate or key is not PEM");
  }
  if (X509_check_private_key(minter->ca_cert_.get(), minter->ca_key_.get()) != 1) {
    ERR_clear_error();
    return makeError(ErrorCode::kInvalidArgument, "the CA key does not match its certificate");
  }
  minter->leaf_key_.reset(EVP_EC_gen("P-256"));
  if (!minter->leaf_key_) return tlsError("cannot make the leaf key");
  return minter;
}

Result<const LeafCertificate*> LeafMinter::leafFor(std::string_view host, std::chrono::system_clock::time_point now) {
  if (auto it = leaves_.find(host);
      it != leaves_.end() && now - it->second.made < std::chrono::hours(24) && now >= it->second.made) {
    return &it->second;
  }
  if (host.empty() || host.size() > 253) return makeError(ErrorCode::kInvalidArgument, "not a host name");
  X509Ptr cert(X509_new());
  unsigned char serial[16];
  if (!cert || !X509_set_version(cert.get(), 2) || RAND_bytes(serial, sizeof serial) != 1 ||
      !setSerial(cert.get(), serial, sizeof serial)) {
    return tlsError("cannot make a leaf certificate");
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  // A common name has at most 64 characters; the subjectAltName is what clients check anyway.
  const std::string common_name = host.size() <= 64 ? std::string(host) : std::string();
  bool named = common_name.empty()
                   ? X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8,
                                                reinterpret_cast<const unsigned char*>("SPACE"), -1, -1, 0)
                   : X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                                reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1, 0);
  time_t start = std::chrono::system_clock::to_time_t(now - std::chrono::hours(24));
  time_t end = std::chrono::system_clock::to_time_t(now + std::chrono::hours(24 * 30));
  std::unique_ptr<GENERAL_NAMES, NamesFree> names(GENERAL_NAMES_new());
  GENERAL_NAME* dns = GENERAL_NAME_new();
  ASN1_IA5STRING* text = ASN1_IA5STRING_new();
  bool san = names && dns && text && ASN1_STRING_set(text, host.data(), static_cast<int>(host.size())) == 1;
  if (san) {
    GENERAL_NAME_set0_value(dns, GEN_DNS, text);
    text = nullptr;
    san = sk_GENERAL_NAME_push(names.get(), dns) > 0;
    if (san) dns = nullptr;
  }
  ASN1_IA5STRING_free(text);
  GENERAL_NAME_free(dns);
  if (!named || !san || !X509_set_issuer_name(cert.get(), X509_get_subject_name(ca_cert_.get())) ||
      !X509_time_adj_ex(X509_getm_notBefore(cert.get()), 0, 0, &start) ||
      !X509_time_adj_ex(X509_getm_notAfter(cert.get()), 0, 0, &end) || !X509_set_pubkey(cert.get(), leaf_key_.get()) ||
      X509_add1_ext_i2d(cert.get(), NID_subject_alt_name, names.get(), 0, X509V3_ADD_DEFAULT) != 1 ||
      !addExtension(cert.get(), ca_cert_.get(), NID_basic_constraints, "critical,CA:FALSE") ||
      !addExtension(cert.get(), ca_cert_.get(), NID_key_usage, "critical,digitalSignature") ||
      !addExtension(cert.get(), ca_cert_.get(), NID_ext_key_usage, "serverAuth") ||
      !addExtension(cert.get(), ca_cert_.get(), NID_subject_key_identifier, "hash") ||
      !addExtension(cert.get(), ca_cert_.get(), NID_authority_key_identifier, "keyid:always") ||
      X509_sign(cert.get(), ca_key_.get(), EVP_sha256()) == 0) {
    return tlsError("cannot make a leaf certificate for " + std::string(host));
  }
  if (leaves_.size() >= kMaxCachedLeaves) leaves_.clear();
  LeafCertificate& leaf = leaves_[std::string(host)];
  leaf.cert = std::move(cert);
  leaf.key = leaf_key_.get();
  leaf.made = now;
  return &leaf;
}

}  // namespace space::net

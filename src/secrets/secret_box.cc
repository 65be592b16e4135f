#include "secrets/secret_box.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "common/digest.h"
#include "common/fs.h"

namespace space::secrets {
namespace {

constexpr unsigned char kFormatVersion = 1;
constexpr size_t kNonceBytes = 12;
constexpr size_t kTagBytes = 16;

struct CipherContextFree {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }
};
using CipherContext = std::unique_ptr<EVP_CIPHER_CTX, CipherContextFree>;

CipherContext newContext() {
  CipherContext ctx(EVP_CIPHER_CTX_new());
  if (!ctx) abort();  // out of memory for a few hundred bytes: nothing sensible to do
  return ctx;
}

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

SecretBox::~SecretBox() { OPENSSL_cleanse(key_.data(), key_.size()); }

Result<SecretBox> SecretBox::openOrCreateKey(const std::string& key_path) {
  auto existing = readSmallFile(key_path, 4096);
  if (!existing.ok() && existing.error().code != ErrorCode::kNotFound) {
    return makeError(existing.error().code, "the secret key " + key_path + ": " + existing.error().message);
  }
  if (existing.ok()) {
    struct stat st {};
    if (::stat(key_path.c_str(), &st) == 0 && (st.st_mode & 077) != 0 && ::chmod(key_path.c_str(), 0600) != 0) {
      return makeError(
          ErrorCode::kFailedPrecondition,
          "the secret key " + key_path + " is readable by other users and chmod 0600 failed: " + strerror(errno));
    }
    std::string text = existing.value();
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    Key key{};
    bool valid = text.size() == 2 * kKeyBytes;
    for (size_t i = 0; valid && i < kKeyBytes; ++i) {
      int high = hexValue(text[2 * i]);
      int low = hexValue(text[2 * i + 1]);
      valid = high >= 0 && low >= 0;
      key[i] = static_cast<unsigned char>(high * 16 + low);
    }
    OPENSSL_cleanse(text.data(), text.size());
    OPENSSL_cleanse(existing.value().data(), existing.value().size());
    if (!valid) {
      return makeError(ErrorCode::kFailedPrecondition,
                       "the secret key " + key_path +
                           " is not 64 hex digits; restore the node's key (a new one cannot read the stored secrets)");
    }
    return SecretBox(key);
  }
  Key key{};
  if (RAND_bytes(key.data(), static_cast<int>(key.size())) != 1) abort();  // no entropy: nothing safe to do
  std::string text = hexEncode(key.data(), key.size()) + "\n";
  Status written = writeFileAtomic(key_path, text, 0600);
  OPENSSL_cleanse(text.data(), text.size());
  if (!written.ok()) {
    return makeError(written.error().code, "creating the secret key " + key_path + ": " + written.error().message);
  }
  return SecretBox(key);
}

std::string SecretBox::seal(std::string_view plaintext, std::string_view context) const {
  std::string out(1 + kNonceBytes + plaintext.size() + kTagBytes, '\0');
  auto* bytes = reinterpret_cast<unsigned char*>(out.data());
  bytes[0] = kFormatVersion;
  unsigned char* nonce = bytes + 1;
  if (RAND_bytes(nonce, kNonceBytes) != 1) abort();  // a repeated nonce would break GCM: never guess
  CipherContext ctx = newContext();
  int length = 0;
  bool ok =
      EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key_.data(), nonce) == 1 &&
      EVP_EncryptUpdate(ctx.get(), nullptr, &length, reinterpret_cast<const unsigned char*>(context.data()),
                        static_cast<int>(context.size())) == 1 &&
      EVP_EncryptUpdate(ctx.get(), nonce + kNonceBytes, &length,
                        reinterpret_cast<const unsigned char*>(plaintext.data()),
                        static_cast<int>(plaintext.size())) == 1 &&
      EVP_EncryptFinal_ex(ctx.get(), nonce + kNonceBytes + length, &length) == 1 &&
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, nonce + kNonceBytes + plaintext.size()) == 1;
  if (!ok) abort();  // AES-GCM with valid arguments does not fail
  return out;
}

Result<std::string> SecretBox::open(std::string_view sealed, std::string_view context) const {
  if (sealed.size() < 1 + kNonceBytes + kTagBytes || static_cast<unsigned char>(sealed[0]) != kFormatVersion) {
    return makeError(ErrorCode::kInternal, "a stored secret is not in the sealed format", "secret_unreadable");
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(sealed.data());
  const unsigned char* nonce = bytes + 1;
  const size_t cipher_bytes = sealed.size() - 1 - kNonceBytes - kTagBytes;
  std::string plain(cipher_bytes, '\0');
  CipherContext ctx = newContext();
  int length = 0;
  unsigned char tag[kTagBytes];
  std::memcpy(tag, nonce + kNonceBytes + cipher_bytes, kTagBytes);
  bool ok = EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key_.data(), nonce) == 1 &&
            EVP_DecryptUpdate(ctx.get(), nullptr, &length, reinterpret_cast<const unsigned char*>(context.data()),
                              static_cast<int>(context.size())) == 1 &&
            EVP_DecryptUpdate(ctx.get(), reinterpret_cast<unsigned char*>(plain.data()), &length, nonce + kNonceBytes,
                              static_cast<int>(cipher_bytes)) == 1 &&
            EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes, tag) == 1 &&
            EVP_DecryptFinal_ex(ctx.get(), reinterpret_cast<unsigned char*>(plain.data()) + length, &length) == 1;
  if (!ok) {
    OPENSSL_cleanse(plain.data(), plain.size());
    return makeError(ErrorCode::kInternal,
                     "a stored secret does not open with the node's secret key (was the key file replaced, or the "
                     "database edited?)",
                     "secret_unreadable");
  }
  return plain;
}

SecretBox::Key SecretBox::derive(std::string_view label) const {
  Key out{};
  std::unique_ptr<EVP_PKEY_CTX, decltype(&EVP_PKEY_CTX_free)> ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr),
                                                                  EVP_PKEY_CTX_free);
  size_t n = out.size();
  if (!ctx || EVP_PKEY_derive_init(ctx.get()) <= 0 || EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()) <= 0 ||
      EVP_PKEY_CTX_set1_hkdf_key(ctx.get(), key_.data(), static_cast<int>(key_.size())) <= 0 ||
      EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), reinterpret_cast<const unsigned char*>(label.data()),
                                  static_cast<int>(label.size())) <= 0 ||
      EVP_PKEY_derive(ctx.get(), out.data(), &n) <= 0 || n != out.size()) {
    // Only an OpenSSL without HKDF gets here: no node could run with it.
    std::abort();
  }
  return out;
}

}  // namespace space::secrets

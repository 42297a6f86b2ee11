#include "core/federated/secagg_crypto.h"

#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace tern {
namespace {

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
};
struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using PkeyCtx = std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree>;
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree>;

constexpr size_t kNonce = 12;
constexpr size_t kTag = 16;

absl::Status Failed(std::string_view what) {
  return absl::InternalError(absl::StrCat("OpenSSL: ", std::string(what), " failed"));
}

Pkey PrivateKey(const Key32& k) {
  return Pkey(EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr, k.data(), k.size()));
}

absl::Status Hkdf(absl::Span<const uint8_t> secret, std::string_view info, Key32* out) {
  PkeyCtx ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr));
  size_t len = out->size();
  if (ctx == nullptr || EVP_PKEY_derive_init(ctx.get()) <= 0 ||
      EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()) <= 0 ||
      EVP_PKEY_CTX_set1_hkdf_key(ctx.get(), secret.data(), static_cast<int>(secret.size())) <= 0 ||
      EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), reinterpret_cast<const unsigned char*>(info.data()),
                                  static_cast<int>(info.size())) <= 0 ||
      EVP_PKEY_derive(ctx.get(), out->data(), &len) <= 0 || len != out->size()) {
    return Failed("HKDF");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SecureRandom(absl::Span<uint8_t> out) {
  if (RAND_bytes(out.data(), static_cast<int>(out.size())) != 1) return Failed("RAND_bytes");
  return absl::OkStatus();
}

absl::Status SecureNormals::Next(double* a, double* b) {
  if (next_ + 2 > kBlock) {
    if (RAND_bytes(reinterpret_cast<unsigned char*>(bits_.data()),
                   static_cast<int>(bits_.size() * sizeof(uint64_t))) != 1) {
      return Failed("RAND_bytes");
    }
    next_ = 0;
  }
  // (0, 1]: log never sees 0.
  const double u1 = (static_cast<double>(bits_[next_++] >> 11) + 1) * 0x1.0p-53;
  const double u2 = static_cast<double>(bits_[next_++] >> 11) * 0x1.0p-53;
  const double r = std::sqrt(-2 * std::log(u1));
  *a = r * std::cos(2 * M_PI * u2);
  *b = r * std::sin(2 * M_PI * u2);
  return absl::OkStatus();
}

absl::Status SecureNormals::AddTo(double sd, absl::Span<float> v) {
  for (size_t i = 0; i < v.size(); i += 2) {
    double a = 0, b = 0;
    if (absl::Status s = Next(&a, &b); !s.ok()) return s;
    v[i] = static_cast<float>(v[i] + sd * a);
    if (i + 1 < v.size()) v[i + 1] = static_cast<float>(v[i + 1] + sd * b);
  }
  return absl::OkStatus();
}

absl::StatusOr<X25519KeyPair> NewX25519KeyPair() {
  X25519KeyPair pair;
  if (absl::Status s = SecureRandom(absl::MakeSpan(pair.private_key)); !s.ok()) return s;
  absl::StatusOr<Key32> pub = X25519PublicOf(pair.private_key);
  if (!pub.ok()) return pub.status();
  pair.public_key = *pub;
  return pair;
}

absl::StatusOr<Key32> X25519PublicOf(const Key32& private_key) {
  Pkey key = PrivateKey(private_key);
  Key32 pub;
  size_t len = pub.size();
  if (key == nullptr || EVP_PKEY_get_raw_public_key(key.get(), pub.data(), &len) != 1 ||
      len != pub.size()) {
    return Failed("X25519 public key");
  }
  return pub;
}

absl::StatusOr<Key32> AgreeKey(const Key32& private_key, std::string_view peer_public,
                               std::string_view info) {
  if (peer_public.size() != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("an X25519 public key is 32 bytes, not ", peer_public.size()));
  }
  Pkey mine = PrivateKey(private_key);
  Pkey peer(EVP_PKEY_new_raw_public_key(
      EVP_PKEY_X25519, nullptr, reinterpret_cast<const unsigned char*>(peer_public.data()), 32));
  if (mine == nullptr || peer == nullptr) return Failed("X25519 key");
  PkeyCtx ctx(EVP_PKEY_CTX_new(mine.get(), nullptr));
  uint8_t secret[32];
  size_t len = sizeof(secret);
  if (ctx == nullptr || EVP_PKEY_derive_init(ctx.get()) <= 0 ||
      EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) <= 0) {
    return Failed("X25519 agreement");
  }
  // OpenSSL refuses a low-order peer point here (the shared secret would be all zeros).
  if (EVP_PKEY_derive(ctx.get(), secret, &len) <= 0 || len != sizeof(secret)) {
    return absl::InvalidArgumentError("X25519 agreement failed: the peer's public key is invalid");
  }
  Key32 out;
  absl::Status s = Hkdf(absl::MakeConstSpan(secret, len), info, &out);
  OPENSSL_cleanse(secret, sizeof(secret));
  if (!s.ok()) return s;
  return out;
}

absl::Status MaskStream(const Key32& key, int bits, absl::Span<uint32_t> out) {
  if (bits < 1 || bits > 32) return absl::InvalidArgumentError("mask bits must be in 1..32");
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  const uint8_t iv[16] = {};
  if (ctx == nullptr ||
      EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_ctr(), nullptr, key.data(), iv) != 1) {
    return Failed("AES-256-CTR");
  }
  // The keystream is the encryption of zeros, written over the zeroed output in place.
  std::memset(out.data(), 0, out.size() * sizeof(uint32_t));
  auto* bytes = reinterpret_cast<unsigned char*>(out.data());
  size_t left = out.size() * sizeof(uint32_t);
  constexpr size_t kStep = size_t{1} << 30;  // EVP's lengths are ints
  while (left > 0) {
    const int n = static_cast<int>(left < kStep ? left : kStep);
    int written = 0;
    if (EVP_EncryptUpdate(ctx.get(), bytes, &written, bytes, n) != 1 || written != n) {
      return Failed("AES-256-CTR");
    }
    bytes += n;
    left -= static_cast<size_t>(n);
  }
  if (bits < 32) {
    const uint32_t mask = (uint32_t{1} << bits) - 1;
    for (uint32_t& w : out) w &= mask;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Seal(const Key32& key, std::string_view aad,
                                 std::string_view plaintext) {
  std::string out(kNonce + plaintext.size() + kTag, '\0');
  auto* o = reinterpret_cast<unsigned char*>(out.data());
  if (absl::Status s = SecureRandom(absl::MakeSpan(o, kNonce)); !s.ok()) return s;
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  int len = 0;
  if (ctx == nullptr ||
      EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key.data(), o) != 1 ||
      EVP_EncryptUpdate(ctx.get(), nullptr, &len,
                        reinterpret_cast<const unsigned char*>(aad.data()),
                        static_cast<int>(aad.size())) != 1 ||
      EVP_EncryptUpdate(ctx.get(), o + kNonce, &len,
                        reinterpret_cast<const unsigned char*>(plaintext.data()),
                        static_cast<int>(plaintext.size())) != 1 ||
      EVP_EncryptFinal_ex(ctx.get(), o + kNonce + len, &len) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTag, o + kNonce + plaintext.size()) !=
          1) {
    return Failed("AES-256-GCM seal");
  }
  return out;
}

absl::StatusOr<std::string> Open(const Key32& key, std::string_view aad, std::string_view sealed) {
  if (sealed.size() < kNonce + kTag) {
    return absl::InvalidArgumentError(
        absl::StrCat("a sealed share is at least ", kNonce + kTag, " bytes, not ", sealed.size()));
  }
  const auto* in = reinterpret_cast<const unsigned char*>(sealed.data());
  const size_t n = sealed.size() - kNonce - kTag;
  std::string out(n, '\0');
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  int len = 0;
  unsigned char tag[kTag];
  std::memcpy(tag, in + kNonce + n, kTag);
  if (ctx == nullptr ||
      EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key.data(), in) != 1 ||
      EVP_DecryptUpdate(ctx.get(), nullptr, &len,
                        reinterpret_cast<const unsigned char*>(aad.data()),
                        static_cast<int>(aad.size())) != 1 ||
      EVP_DecryptUpdate(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &len, in + kNonce,
                        static_cast<int>(n)) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTag, tag) != 1) {
    return Failed("AES-256-GCM open");
  }
  if (EVP_DecryptFinal_ex(ctx.get(), reinterpret_cast<unsigned char*>(out.data()) + len, &len) !=
      1) {
    return absl::InvalidArgumentError("a sealed share fails its authentication tag");
  }
  return out;
}

}  // namespace tern

// The cryptography SecAgg+ needs, all from OpenSSL: X25519 key pairs and key agreement, HKDF-SHA256
// over the agreed secret, AES-256-CTR as the masks' pseudorandom generator and AES-256-GCM to seal
// the shares a client sends its neighbours through the server.
//
// Thread-safety: plain functions; each call uses its own OpenSSL contexts.
#ifndef TERN_CORE_FEDERATED_SECAGG_CRYPTO_H_
#define TERN_CORE_FEDERATED_SECAGG_CRYPTO_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tern {

using Key32 = std::array<uint8_t, 32>;

struct X25519KeyPair {
  Key32 private_key;
  Key32 public_key;
};

// Fills `out` from OpenSSL's CSPRNG.
absl::Status SecureRandom(absl::Span<uint8_t> out);

// Standard normal pairs from OpenSSL's generator (Box-Muller on two 53-bit uniforms), drawn a
// block of random bytes at a time: DP-FedAvg's noise, the server's or each client's.
//
// Thread-safety: thread-compatible.
class SecureNormals {
 public:
  absl::Status Next(double* a, double* b);
  // Adds N(0, sd^2) to each of `v`.
  absl::Status AddTo(double sd, absl::Span<float> v);

 private:
  static constexpr size_t kBlock = 4096;
  std::vector<uint64_t> bits_ = std::vector<uint64_t>(kBlock);
  size_t next_ = kBlock;
};

absl::StatusOr<X25519KeyPair> NewX25519KeyPair();

// The public key of a private one (to check a private key rebuilt from shares against the one a
// client advertised).
absl::StatusOr<Key32> X25519PublicOf(const Key32& private_key);

// X25519(private_key, peer_public), then HKDF-SHA256 with `info`: the same 32 bytes on both ends.
// `peer_public` must be 32 bytes; a low-order point (an all-zero secret) is refused.
absl::StatusOr<Key32> AgreeKey(const Key32& private_key, std::string_view peer_public,
                               std::string_view info);

// out[i] = word i of AES-256-CTR's keystream under `key` (zero IV), masked to its low `bits`
// bits (1..32): uniform mod 2^bits.
absl::Status MaskStream(const Key32& key, int bits, absl::Span<uint32_t> out);

// AES-256-GCM: a random 12-byte nonce, the ciphertext and the 16-byte tag; Open refuses any
// change to the sealed bytes or to `aad`.
absl::StatusOr<std::string> Seal(const Key32& key, std::string_view aad,
                                 std::string_view plaintext);
absl::StatusOr<std::string> Open(const Key32& key, std::string_view aad, std::string_view sealed);

}  // namespace tern

#endif  // TERN_CORE_FEDERATED_SECAGG_CRYPTO_H_

// SecAgg+ (Bell et al. 2020) for one FedAvg round: both sides of the protocol, without the
// transport. The aggregator runs a SecAggServerRound per round and its clients a SecAggClient;
// the messages are tern.v1's (proto/tern/v1/secagg.proto).
//
// A round, for the clients sampled into it:
//  1. keys:    each client makes two X25519 key pairs and sends the public halves (SecAggKeys).
//              The server links the clients whose keys came in (U1) into a random graph of
//              degree k and answers each with its neighbours' keys.
//  2. shares:  each client picks a self-mask seed b, Shamir-shares b and its mask private key
//              among its neighbours (threshold t), seals each neighbour's pair under the key the
//              two agree and sends them (SecAggShares). The senders are U2; the server hands each
//              client the shares addressed to it, from neighbours in U2.
//  3. masked:  each client quantizes its clipped update to integers mod 2^b and adds
//              PRG(b) + sum over its neighbours j in U2 of +-PRG(agreed mask key with j), + when
//              its id is the smaller. The server adds the masked vectors up (U3: whose came in)
//              and never keeps one.
//  4. reveal:  each client of U3 gets which of its masking neighbours survived (in U3) and which
//              dropped, and reveals its share of b of each survivor and its share of the mask key
//              of each dropped one, never both of one neighbour. With t shares of each, the server
//              takes away every survivor's self-mask and the pairwise masks survivors shared with
//              dropped clients; the pairs among survivors cancel. What is left is the sum.
//
// Choices the paper leaves open (docs/server.md "Secure aggregation"): the graph is a circulant
// over a random order of U1 (each client linked to the k/2 before and after it, k rounded up to
// even; complete when k >= |U1| - 1); a client's share for neighbour j sits at x = j + 1 in
// GF(2^61 - 1); masks are AES-256-CTR keystreams under HKDF-SHA256 of the X25519 secret;
// quantization is stochastic rounding of [-r, r] onto 0..Q, and the round's result is the
// unweighted mean of the survivors' updates (the server cannot weigh what it cannot see).
#ifndef TERN_CORE_FEDERATED_SECAGG_H_
#define TERN_CORE_FEDERATED_SECAGG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/federated/secagg_crypto.h"
#include "core/federated/shamir.h"
#include "tern/v1/secagg.pb.h"

namespace tern {

// Whether `p` can sum `round_clients` updates: 1 <= t <= k, 1 <= b <= 32, Q >= 1 and
// round_clients * Q < 2^b (the sum must not wrap), r > 0 and finite.
absl::Status CheckSecAggParams(const v1::SecAggParams& p, uint32_t round_clients);

// The round's graph over `ids` (distinct): each id's neighbours, sorted. Deterministic in
// `seed`; every id has the same degree, min(2 * ceil(k / 2), ids.size() - 1).
absl::btree_map<uint32_t, std::vector<uint32_t>> SecAggGraph(std::vector<uint32_t> ids, uint32_t k,
                                                             uint64_t seed);

// Each coordinate clipped to [-r, r] and rounded stochastically (unbiased) onto 0..Q. With
// `wrap` (a noised vector, clipped before its noise), not clipped: rounded onto the integers of
// the same grid and taken mod 2^b.
std::vector<uint32_t> SecAggQuantize(absl::Span<const float> x, const v1::SecAggParams& p,
                                     uint64_t seed, bool wrap = false);
// The mean of `clients` updates from the sum of their quantized vectors.
std::vector<float> SecAggMean(absl::Span<const uint32_t> sum, uint32_t clients,
                              const v1::SecAggParams& p);

// Random-k (SecAggParams.keep > 0): the positions of a model of `dim` values each client masks,
// in the masked vector's order (randomk.v1's permutation, kernels/format/randomk.h). Empty when
// every value is masked.
std::vector<uint32_t> SecAggKept(const v1::SecAggParams& p, size_t dim);
// The masked vector's length for a model of `dim` values.
size_t SecAggMaskedDim(const v1::SecAggParams& p, size_t dim);
// The round's mean over the model from the mean of the masked coordinates (`mean` itself when
// every value was masked).
std::vector<float> SecAggScatter(const v1::SecAggParams& p, std::vector<float> mean, size_t dim);

// A masked vector on the wire: `bits` bits a coordinate, LSB first (common/bit_io.h), padded to
// a byte. Decode wants exactly the bytes of `dim` coordinates; AddDecodedMasked adds them to
// `sum` mod 2^b as it reads (exactly the bytes of sum.size() coordinates, else `sum` is left as
// it was).
std::string EncodeMasked(absl::Span<const uint32_t> v, int bits);
absl::StatusOr<std::vector<uint32_t>> DecodeMasked(std::string_view bytes, size_t dim, int bits);
absl::Status AddDecodedMasked(std::string_view bytes, int bits, absl::Span<uint32_t> sum);
size_t MaskedBytes(size_t dim, int bits);

// One client's side of one round.
//
// Thread-safety: not thread-safe; one client's round, stepped by one thread.
class SecAggClient {
 public:
  // Makes the round's two key pairs. `params` must pass CheckSecAggParams.
  static absl::StatusOr<SecAggClient> Start(const v1::SecAggParams& params, uint32_t client_id,
                                            uint64_t round);

  // Stage 1's message.
  v1::SecAggKeys Keys() const;
  // Stage 2: the shares for the neighbours the server named. Refuses a neighbour list of
  // fewer than t or more than the graph's degree, with the caller or a repeat in it, or a bad
  // key.
  absl::StatusOr<v1::SecAggShares> Share(const v1::SecAggKeysReply& reply);
  // Stage 3: `update` masked, the bytes of EncodeMasked. Opens the shares addressed to it (each
  // from a neighbour, once; any that fails its tag or names another round or pair refuses the
  // stage) and masks with exactly their senders; refuses fewer than t.
  absl::StatusOr<std::string> Mask(const v1::SecAggSharesReply& reply,
                                   absl::Span<const float> update);
  // Stage 4: the shares the server asks for. Survivors and dropped must be masking neighbours,
  // apart, with at least t - 1 survivors; asked again, only the same question is answered.
  absl::StatusOr<v1::SecAggReveal> Reveal(const v1::SecAggUnmaskRequest& request);

  uint32_t client_id() const { return id_; }
  uint64_t round() const { return round_; }

 private:
  enum class Stage { kKeys, kShared, kMasked, kRevealed };
  SecAggClient(const v1::SecAggParams& params, uint32_t id, uint64_t round)
      : params_(params), id_(id), round_(round) {}

  v1::SecAggParams params_;
  uint32_t id_;
  uint64_t round_;
  Stage stage_ = Stage::kKeys;
  X25519KeyPair share_keys_{};
  X25519KeyPair mask_keys_{};
  Key32 self_seed_{};
  absl::btree_map<uint32_t, v1::SecAggNeighbour> neighbours_;
  // The key each neighbour's shares are sealed under, agreed once in Share for Mask too.
  absl::btree_map<uint32_t, Key32> sealing_;
  // The shares of the neighbours this client masked with (stage 3), by owner.
  absl::btree_map<uint32_t, v1::SecAggSharePair> held_;
  std::string revealed_;  // the request answered (serialized), so a second must match
  v1::SecAggReveal reveal_;
};

// The server's side of one round. It holds the masked vectors' running sum, never a vector.
//
// Thread-safety: not thread-safe; the aggregator calls it under its lock.
class SecAggServerRound {
 public:
  enum class Stage { kKeys, kShares, kMasked, kReveal, kDone };

  // `dim`: the update's coordinates; `seed`: the graph's.
  SecAggServerRound(const v1::SecAggParams& params, uint64_t round, size_t dim, uint64_t seed);

  Stage stage() const { return stage_; }
  uint64_t round() const { return round_; }

  // Stage 1. A repeat of the same keys is accepted; other keys for a client already in are
  // AlreadyExists.
  absl::Status AddKeys(const v1::SecAggKeys& keys);
  // Ends stage 1: U1 and the graph. FailedPrecondition when fewer than t + 1 clients sent keys.
  absl::Status CloseKeys();
  // The caller's neighbours (stage 2 on). NotFound for a client not in U1.
  absl::StatusOr<v1::SecAggKeysReply> KeysFor(uint32_t client_id) const;

  // Stage 2: exactly one sealed share for each of the sender's neighbours.
  absl::Status AddShares(const v1::SecAggShares& shares);
  // Ends stage 2: U2, less any client left with fewer than t neighbours in it.
  absl::Status CloseShares();
  absl::StatusOr<v1::SecAggSharesReply> SharesFor(uint32_t client_id) const;

  // Stage 3: a masked vector (EncodeMasked) of a client in U2, added to the sum.
  absl::Status AddMasked(uint32_t client_id, uint64_t round, std::string_view masked);
  // Ends stage 3: U3. FailedPrecondition when no masked vector came in.
  absl::Status CloseMasked();
  absl::StatusOr<v1::SecAggUnmaskRequest> UnmaskRequestFor(uint32_t client_id) const;

  // Stage 4: the shares a client of U3 was asked for (a subset of them; a repeat is accepted).
  absl::Status AddReveal(const v1::SecAggReveal& reveal);

  struct Result {
    std::vector<float> mean;        // the survivors' mean update
    std::vector<uint32_t> sum;      // their quantized vectors' sum mod 2^b
    std::vector<uint32_t> clients;  // U3
    std::vector<uint32_t> dropped;  // masked with, but no vector came in (U2 \ U3)
  };
  // Ends the round: the masks taken away. FailedPrecondition naming a client whose secret has
  // fewer than t shares; DataLoss if shares disagree or a rebuilt mask key is not the one the
  // client advertised.
  absl::StatusOr<Result> Finish();

  size_t keys_in() const { return keys_.size(); }
  size_t shares_in() const { return shares_.size(); }
  const absl::btree_set<uint32_t>& masked_clients() const { return u3_; }
  const absl::btree_set<uint32_t>& sharing_clients() const { return u2_; }
  const absl::btree_map<uint32_t, v1::SecAggKeys>& keyed_clients() const { return keys_; }

 private:
  // u's neighbours that are in `set`.
  std::vector<uint32_t> NeighboursIn(uint32_t u, const absl::btree_set<uint32_t>& set) const;

  v1::SecAggParams params_;
  uint64_t round_;
  uint64_t seed_;
  Stage stage_ = Stage::kKeys;
  absl::btree_map<uint32_t, v1::SecAggKeys> keys_;  // U1 once closed
  absl::btree_map<uint32_t, std::vector<uint32_t>> graph_;
  absl::btree_map<uint32_t, v1::SecAggShares> shares_;  // by sender
  absl::btree_set<uint32_t> u2_;
  absl::btree_set<uint32_t> u3_;
  std::vector<uint32_t> sum_;
  // reveals_[owner][mask_key] = the shares of the owner's secret revealed, by revealer.
  absl::btree_map<std::pair<uint32_t, bool>, absl::btree_map<uint32_t, ShamirShare>> revealed_;
};

}  // namespace tern

#endif  // TERN_CORE_FEDERATED_SECAGG_H_

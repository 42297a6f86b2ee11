#include "core/federated/secagg.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/bit_io.h"
#include "common/byte_io.h"
#include "common/rng.h"
#include "core/federated/secagg_crypto.h"
#include "kernels/format/randomk.h"

namespace tern {
namespace {

// Sealed shares are a SecAggSharePair of two 48-byte shares: far below this.
constexpr size_t kMaxSealed = 1024;

std::string RoundInfo(std::string_view what, uint64_t round) {
  std::string info = absl::StrCat("tern.secagg.v1 ", std::string(what), " ");
  ByteWriter(&info).U64(round);
  return info;
}

std::string PairAad(uint32_t from, uint32_t to, uint64_t round) {
  std::string aad;
  ByteWriter w(&aad);
  w.U32(from);
  w.U32(to);
  w.U64(round);
  return aad;
}

uint32_t ModMask(int bits) { return bits >= 32 ? ~uint32_t{0} : (uint32_t{1} << bits) - 1; }

// Adds (or, with !add, takes away) the mask stream of `key` to `v`, mod 2^b.
absl::Status AddMask(const Key32& key, int bits, bool add, absl::Span<uint32_t> v,
                     std::vector<uint32_t>* scratch) {
  scratch->resize(v.size());
  if (absl::Status s = MaskStream(key, bits, absl::MakeSpan(*scratch)); !s.ok()) return s;
  const uint32_t mask = ModMask(bits);
  if (add) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = (v[i] + (*scratch)[i]) & mask;
  } else {
    for (size_t i = 0; i < v.size(); ++i) v[i] = (v[i] - (*scratch)[i]) & mask;
  }
  return absl::OkStatus();
}

// The pairwise mask of (self, peer) enters self's vector with + when self's id is the smaller
// and - otherwise, so that the pair's two masks cancel in the sum.
bool PairMaskAdds(uint32_t self, uint32_t peer) { return self < peer; }

absl::Status CheckPublicKey(const std::string& key, uint32_t id) {
  if (key.size() != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("client ", id, "'s X25519 public key is ", key.size(), " bytes, not 32"));
  }
  return absl::OkStatus();
}

uint32_t Degree(uint32_t k, size_t n) {
  const uint64_t even = 2 * ((uint64_t{k} + 1) / 2);
  return static_cast<uint32_t>(std::min<uint64_t>(even, n == 0 ? 0 : n - 1));
}

}  // namespace

absl::Status CheckSecAggParams(const v1::SecAggParams& p, uint32_t round_clients) {
  if (p.neighbours() < 1) return absl::InvalidArgumentError("secure aggregation needs k >= 1");
  if (p.threshold() < 1 || p.threshold() > p.neighbours()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the threshold t = ", p.threshold(), " must be in 1..k = ", p.neighbours()));
  }
  if (p.modulus_bits() < 1 || p.modulus_bits() > 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("the modulus bits b = ", p.modulus_bits(), " must be in 1..32"));
  }
  if (p.levels() < 1) return absl::InvalidArgumentError("the quantization levels Q must be >= 1");
  if (uint64_t{round_clients} * p.levels() >= (uint64_t{1} << p.modulus_bits())) {
    return absl::InvalidArgumentError(absl::StrCat(
        round_clients, " clients' sums of values up to Q = ", p.levels(), " wrap mod 2^",
        p.modulus_bits(), ": raise the modulus bits or lower the levels"));
  }
  if (!(p.clip_range() > 0) || !std::isfinite(p.clip_range())) {
    return absl::InvalidArgumentError("the clipping range r must be positive and finite");
  }
  if (!(p.noise_sd() >= 0) || !std::isfinite(p.noise_sd())) {
    return absl::InvalidArgumentError("the clients' noise sd must be >= 0 and finite");
  }
  return absl::OkStatus();
}

absl::btree_map<uint32_t, std::vector<uint32_t>> SecAggGraph(std::vector<uint32_t> ids, uint32_t k,
                                                             uint64_t seed) {
  std::sort(ids.begin(), ids.end());
  std::mt19937_64 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  const size_t n = ids.size();
  const uint32_t half = Degree(k, n) / 2;
  const bool complete = Degree(k, n) == n - 1 || n <= 1;
  absl::btree_map<uint32_t, std::vector<uint32_t>> graph;
  for (size_t i = 0; i < n; ++i) {
    std::vector<uint32_t>& out = graph[ids[i]];
    if (complete) {
      for (size_t j = 0; j < n; ++j) {
        if (j != i) out.push_back(ids[j]);
      }
    } else {
      for (uint32_t d = 1; d <= half; ++d) {
        out.push_back(ids[(i + d) % n]);
        out.push_back(ids[(i + n - d) % n]);
      }
    }
    std::sort(out.begin(), out.end());
  }
  return graph;
}

std::vector<uint32_t> SecAggQuantize(absl::Span<const float> x, const v1::SecAggParams& p,
                                     uint64_t seed, bool wrap) {
  const RngKey key = MakeRngKey(seed, 0x5eca99);
  const double r = p.clip_range(), q = p.levels();
  const uint32_t mask = ModMask(static_cast<int>(p.modulus_bits()));
  // Past this a double's whole part no longer converts safely (and no sum could mean it).
  constexpr double kFar = 0x1.0p52;
  std::vector<uint32_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double v = std::isnan(x[i]) ? 0.0 : static_cast<double>(x[i]);
    v = wrap ? std::clamp((v + r) / (2 * r) * q, -kFar, kFar)
             : (std::clamp(v, -r, r) + r) / (2 * r) * q;
    double whole = std::floor(v);
    if (Uniform01(key, i) < v - whole) whole += 1;
    out[i] = wrap ? static_cast<uint32_t>(static_cast<uint64_t>(static_cast<int64_t>(whole)) & mask)
                  : static_cast<uint32_t>(std::min(whole, q));
  }
  return out;
}

std::vector<float> SecAggMean(absl::Span<const uint32_t> sum, uint32_t clients,
                              const v1::SecAggParams& p) {
  const double r = p.clip_range(), q = p.levels(), n = clients;
  const int bits = static_cast<int>(p.modulus_bits());
  const uint64_t ring = uint64_t{1} << bits;
  // Read centred on the sum of n zeros (nQ/2): the same as sum / n / Q * 2r - r for any sum of
  // values in 0..Q (nQ < 2^b), and right too for noised values that wrapped, as long as the
  // mean is within [-r, r].
  const uint64_t offset = (uint64_t{clients} * p.levels() + 1) / 2;
  const double scale = 2 * r / (n * q);
  std::vector<float> out(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) {
    int64_t d = static_cast<int64_t>((sum[i] + ring - offset % ring) % ring);
    if (d >= static_cast<int64_t>(ring / 2)) d -= static_cast<int64_t>(ring);
    out[i] = static_cast<float>((static_cast<double>(d) + static_cast<double>(offset) - n * q / 2) *
                                scale);
  }
  return out;
}

std::vector<uint32_t> SecAggKept(const v1::SecAggParams& p, size_t dim) {
  std::vector<uint32_t> kept;
  if (p.keep() == 0 || p.keep() >= dim) return kept;
  const format::RandomKPermutation perm = format::RandomKPermutation::Make(p.keep_seed(), dim);
  kept.resize(p.keep());
  for (uint32_t j = 0; j < p.keep(); ++j) kept[j] = perm(j);
  return kept;
}

size_t SecAggMaskedDim(const v1::SecAggParams& p, size_t dim) {
  return p.keep() == 0 ? dim : std::min<size_t>(p.keep(), dim);
}

std::vector<float> SecAggScatter(const v1::SecAggParams& p, std::vector<float> mean, size_t dim) {
  const std::vector<uint32_t> kept = SecAggKept(p, dim);
  if (kept.empty()) return mean;
  const float scale =
      p.keep_unbiased() ? static_cast<float>(static_cast<double>(dim) / kept.size()) : 1.0f;
  std::vector<float> out(dim, 0.0f);
  for (size_t j = 0; j < kept.size() && j < mean.size(); ++j) out[kept[j]] = mean[j] * scale;
  return out;
}

size_t MaskedBytes(size_t dim, int bits) {
  return static_cast<size_t>((uint64_t{dim} * static_cast<uint64_t>(bits) + 7) / 8);
}

std::string EncodeMasked(absl::Span<const uint32_t> v, int bits) {
  std::string out;
  out.reserve(MaskedBytes(v.size(), bits));
  BitWriter w(&out);
  for (uint32_t x : v) w.Write(x, bits);
  w.Finish();
  return out;
}

absl::Status AddDecodedMasked(std::string_view bytes, int bits, absl::Span<uint32_t> sum) {
  if (bits < 1 || bits > 32) return absl::InvalidArgumentError("mask bits must be in 1..32");
  const size_t want = MaskedBytes(sum.size(), bits);
  if (bytes.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("a masked vector of ", sum.size(),
                                                   " coordinates of ", bits, " bits is ", want,
                                                   " bytes, not ", bytes.size()));
  }
  const uint32_t mask = ModMask(bits);
  BitReader r(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  for (uint32_t& x : sum) {
    uint64_t v = 0;
    r.Read(bits, &v);  // the length was checked
    x = static_cast<uint32_t>((x + v) & mask);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> DecodeMasked(std::string_view bytes, size_t dim, int bits) {
  std::vector<uint32_t> out(dim);
  if (absl::Status s = AddDecodedMasked(bytes, bits, absl::MakeSpan(out)); !s.ok()) return s;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Client

absl::StatusOr<SecAggClient> SecAggClient::Start(const v1::SecAggParams& params, uint32_t client_id,
                                                 uint64_t round) {
  if (absl::Status s = CheckSecAggParams(params, 1); !s.ok()) return s;
  SecAggClient c(params, client_id, round);
  absl::StatusOr<X25519KeyPair> share = NewX25519KeyPair();
  if (!share.ok()) return share.status();
  absl::StatusOr<X25519KeyPair> mask = NewX25519KeyPair();
  if (!mask.ok()) return mask.status();
  c.share_keys_ = *share;
  c.mask_keys_ = *mask;
  if (absl::Status s = SecureRandom(absl::MakeSpan(c.self_seed_)); !s.ok()) return s;
  return c;
}

v1::SecAggKeys SecAggClient::Keys() const {
  v1::SecAggKeys k;
  k.set_client_id(id_);
  k.set_round(round_);
  k.set_share_public(share_keys_.public_key.data(), share_keys_.public_key.size());
  k.set_mask_public(mask_keys_.public_key.data(), mask_keys_.public_key.size());
  return k;
}

absl::StatusOr<v1::SecAggShares> SecAggClient::Share(const v1::SecAggKeysReply& reply) {
  if (stage_ != Stage::kKeys) {
    return absl::FailedPreconditionError("this round's shares were already made");
  }
  const size_t n = static_cast<size_t>(reply.neighbours_size());
  const uint32_t max_degree = 2 * ((params_.neighbours() + 1) / 2);
  if (n < params_.threshold() || n > max_degree) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the server named ", n, " neighbours; a round ", "with t = ", params_.threshold(),
        " and k = ", params_.neighbours(), " has ", params_.threshold(), "..", max_degree));
  }
  std::vector<uint64_t> xs;
  absl::btree_map<uint32_t, v1::SecAggNeighbour> neighbours;
  for (const v1::SecAggNeighbour& nb : reply.neighbours()) {
    if (nb.client_id() == id_ || neighbours.contains(nb.client_id())) {
      return absl::InvalidArgumentError(
          absl::StrCat("neighbour ", nb.client_id(), " is this client or named twice"));
    }
    if (absl::Status s = CheckPublicKey(nb.share_public(), nb.client_id()); !s.ok()) return s;
    if (absl::Status s = CheckPublicKey(nb.mask_public(), nb.client_id()); !s.ok()) return s;
    neighbours[nb.client_id()] = nb;
    xs.push_back(uint64_t{nb.client_id()} + 1);
  }
  const int t = static_cast<int>(params_.threshold());
  absl::StatusOr<std::vector<ShamirShare>> self_shares = ShamirSplit(self_seed_, t, xs);
  if (!self_shares.ok()) return self_shares.status();
  absl::StatusOr<std::vector<ShamirShare>> key_shares = ShamirSplit(mask_keys_.private_key, t, xs);
  if (!key_shares.ok()) return key_shares.status();
  v1::SecAggShares out;
  out.set_client_id(id_);
  out.set_round(round_);
  const std::string info = RoundInfo("share", round_);
  absl::btree_map<uint32_t, Key32> sealing;
  size_t i = 0;
  for (const v1::SecAggNeighbour& nb : reply.neighbours()) {
    absl::StatusOr<Key32> key = AgreeKey(share_keys_.private_key, nb.share_public(), info);
    if (!key.ok()) return key.status();
    sealing[nb.client_id()] = *key;
    v1::SecAggSharePair pair;
    pair.set_from(id_);
    pair.set_to(nb.client_id());
    pair.set_round(round_);
    pair.set_self_mask_share(EncodeShamirShare((*self_shares)[i]));
    pair.set_mask_key_share(EncodeShamirShare((*key_shares)[i]));
    ++i;
    absl::StatusOr<std::string> sealed =
        Seal(*key, PairAad(id_, nb.client_id(), round_), pair.SerializeAsString());
    if (!sealed.ok()) return sealed.status();
    v1::SecAggSealedShare* s = out.add_shares();
    s->set_from(id_);
    s->set_to(nb.client_id());
    s->set_sealed(std::move(*sealed));
  }
  neighbours_ = std::move(neighbours);
  sealing_ = std::move(sealing);
  stage_ = Stage::kShared;
  return out;
}

absl::StatusOr<std::string> SecAggClient::Mask(const v1::SecAggSharesReply& reply,
                                               absl::Span<const float> update) {
  if (stage_ != Stage::kShared) {
    return absl::FailedPreconditionError(stage_ == Stage::kKeys
                                             ? "masking before sharing the keys"
                                             : "this round's update was already masked");
  }
  absl::btree_map<uint32_t, v1::SecAggSharePair> held;
  for (const v1::SecAggSealedShare& s : reply.shares()) {
    auto nb = neighbours_.find(s.from());
    if (nb == neighbours_.end() || s.to() != id_ || held.contains(s.from())) {
      return absl::InvalidArgumentError(absl::StrCat("a share from ", s.from(), " to ", s.to(),
                                                     ": not a neighbour's to this client, or "
                                                     "a repeat"));
    }
    if (s.sealed().size() > kMaxSealed) {
      return absl::InvalidArgumentError("a sealed share is too large");
    }
    absl::StatusOr<std::string> plain =
        Open(sealing_.at(s.from()), PairAad(s.from(), id_, round_), s.sealed());
    if (!plain.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the share from ", s.from(), ": ", plain.status().message()));
    }
    v1::SecAggSharePair pair;
    if (!pair.ParseFromString(*plain) || pair.from() != s.from() || pair.to() != id_ ||
        pair.round() != round_ || !DecodeShamirShare(pair.self_mask_share()).ok() ||
        !DecodeShamirShare(pair.mask_key_share()).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the share from ", s.from(), " is not a share pair of this round"));
    }
    held[s.from()] = std::move(pair);
  }
  if (held.size() < params_.threshold()) {
    return absl::FailedPreconditionError(
        absl::StrCat("only ", held.size(),
                     " neighbours shared their keys; masking needs t = ", params_.threshold()));
  }
  const int bits = static_cast<int>(params_.modulus_bits());
  uint64_t qseed = 0;
  if (absl::Status s = SecureRandom(absl::MakeSpan(reinterpret_cast<uint8_t*>(&qseed), 8));
      !s.ok()) {
    return s;
  }
  std::vector<float> kept;
  if (params_.keep() > 0) {
    // Random-k: the round's positions, the same for every client.
    if (params_.keep() > update.size()) {
      return absl::InvalidArgumentError(absl::StrCat("the round keeps ", params_.keep(),
                                                     " values of an update of ", update.size()));
    }
    const std::vector<uint32_t> at = SecAggKept(params_, update.size());
    if (!at.empty()) {
      kept.resize(at.size());
      for (size_t j = 0; j < at.size(); ++j) kept[j] = update[at[j]];
      update = kept;
    }
  }
  std::vector<uint32_t> v;
  if (const double sd = params_.noise_sd(); sd > 0) {
    // DP-FedAvg's distributed noise: this client's share of the round's, on the clipped values.
    const float r = params_.clip_range();
    std::vector<float> noised(update.size());
    for (size_t i = 0; i < update.size(); ++i) {
      noised[i] = std::isnan(update[i]) ? 0.0f : std::clamp(update[i], -r, r);
    }
    SecureNormals normals;
    if (absl::Status s = normals.AddTo(sd, absl::MakeSpan(noised)); !s.ok()) return s;
    v = SecAggQuantize(noised, params_, qseed, /*wrap=*/true);
  } else {
    v = SecAggQuantize(update, params_, qseed);
  }
  std::vector<uint32_t> scratch;
  if (absl::Status s = AddMask(self_seed_, bits, true, absl::MakeSpan(v), &scratch); !s.ok()) {
    return s;
  }
  const std::string mask_info = RoundInfo("mask", round_);
  for (const auto& [peer, pair] : held) {
    absl::StatusOr<Key32> key =
        AgreeKey(mask_keys_.private_key, neighbours_.at(peer).mask_public(), mask_info);
    if (!key.ok()) return key.status();
    if (absl::Status s = AddMask(*key, bits, PairMaskAdds(id_, peer), absl::MakeSpan(v), &scratch);
        !s.ok()) {
      return s;
    }
  }
  held_ = std::move(held);
  stage_ = Stage::kMasked;
  return EncodeMasked(v, bits);
}

absl::StatusOr<v1::SecAggReveal> SecAggClient::Reveal(const v1::SecAggUnmaskRequest& request) {
  if (stage_ == Stage::kRevealed) {
    if (request.SerializeAsString() != revealed_) {
      return absl::PermissionDeniedError(
          "this client already revealed its shares for another split of survivors and dropped");
    }
    return reveal_;
  }
  if (stage_ != Stage::kMasked) {
    return absl::FailedPreconditionError("revealing shares before masking");
  }
  if (request.round() != round_) {
    return absl::InvalidArgumentError(
        absl::StrCat("an unmask request for round ", request.round(), " in round ", round_));
  }
  absl::btree_set<uint32_t> asked;
  for (uint32_t id : request.survivors()) {
    if (!held_.contains(id) || !asked.insert(id).second) {
      return absl::InvalidArgumentError(absl::StrCat("survivor ", id,
                                                     " is not a masking "
                                                     "neighbour, or named twice"));
    }
  }
  for (uint32_t id : request.dropped()) {
    if (!held_.contains(id) || !asked.insert(id).second) {
      return absl::InvalidArgumentError(absl::StrCat("dropped client ", id,
                                                     " is not a masking "
                                                     "neighbour, or is also named a survivor"));
    }
  }
  // As SecAgg's clients abort below t survivors: with this client, t of its neighbourhood.
  if (request.survivors_size() + 1 < static_cast<int>(params_.threshold())) {
    return absl::FailedPreconditionError(
        absl::StrCat("only ", request.survivors_size(),
                     " neighbours survived; revealing needs t - 1 = ", params_.threshold() - 1));
  }
  v1::SecAggReveal out;
  out.set_client_id(id_);
  out.set_round(round_);
  for (uint32_t id : request.survivors()) {
    v1::SecAggRevealedShare* s = out.add_shares();
    s->set_owner(id);
    s->set_mask_key(false);
    s->set_share(held_.at(id).self_mask_share());
  }
  for (uint32_t id : request.dropped()) {
    v1::SecAggRevealedShare* s = out.add_shares();
    s->set_owner(id);
    s->set_mask_key(true);
    s->set_share(held_.at(id).mask_key_share());
  }
  revealed_ = request.SerializeAsString();
  reveal_ = out;
  stage_ = Stage::kRevealed;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Server

SecAggServerRound::SecAggServerRound(const v1::SecAggParams& params, uint64_t round, size_t dim,
                                     uint64_t seed)
    : params_(params), round_(round), seed_(seed), sum_(dim, 0) {}

std::vector<uint32_t> SecAggServerRound::NeighboursIn(uint32_t u,
                                                      const absl::btree_set<uint32_t>& set) const {
  std::vector<uint32_t> out;
  auto it = graph_.find(u);
  if (it == graph_.end()) return out;
  for (uint32_t j : it->second) {
    if (set.contains(j)) out.push_back(j);
  }
  return out;
}

absl::Status SecAggServerRound::AddKeys(const v1::SecAggKeys& keys) {
  if (stage_ != Stage::kKeys) {
    return absl::FailedPreconditionError(absl::StrCat("round ", round_, "'s key stage has closed"));
  }
  if (keys.round() != round_) {
    return absl::InvalidArgumentError(
        absl::StrCat("keys for round ", keys.round(), " in round ", round_));
  }
  if (absl::Status s = CheckPublicKey(keys.share_public(), keys.client_id()); !s.ok()) return s;
  if (absl::Status s = CheckPublicKey(keys.mask_public(), keys.client_id()); !s.ok()) return s;
  auto [it, inserted] = keys_.try_emplace(keys.client_id(), keys);
  if (!inserted && (it->second.share_public() != keys.share_public() ||
                    it->second.mask_public() != keys.mask_public())) {
    return absl::AlreadyExistsError(
        absl::StrCat("client ", keys.client_id(), " already sent other keys this round"));
  }
  return absl::OkStatus();
}

absl::Status SecAggServerRound::CloseKeys() {
  if (stage_ != Stage::kKeys) return absl::FailedPreconditionError("the key stage is closed");
  if (keys_.size() < size_t{params_.threshold()} + 1) {
    stage_ = Stage::kDone;
    return absl::FailedPreconditionError(
        absl::StrCat(keys_.size(), " clients sent keys; a threshold of ", params_.threshold(),
                     " needs ", params_.threshold() + 1));
  }
  std::vector<uint32_t> ids;
  for (const auto& [id, k] : keys_) ids.push_back(id);
  graph_ = SecAggGraph(std::move(ids), params_.neighbours(), seed_);
  stage_ = Stage::kShares;
  return absl::OkStatus();
}

absl::StatusOr<v1::SecAggKeysReply> SecAggServerRound::KeysFor(uint32_t client_id) const {
  auto it = graph_.find(client_id);
  if (it == graph_.end()) {
    return absl::NotFoundError(
        absl::StrCat("client ", client_id, " sent no keys in round ", round_, " before it closed"));
  }
  v1::SecAggKeysReply reply;
  for (uint32_t j : it->second) {
    const v1::SecAggKeys& k = keys_.at(j);
    v1::SecAggNeighbour* nb = reply.add_neighbours();
    nb->set_client_id(j);
    nb->set_share_public(k.share_public());
    nb->set_mask_public(k.mask_public());
  }
  return reply;
}

absl::Status SecAggServerRound::AddShares(const v1::SecAggShares& shares) {
  if (stage_ != Stage::kShares) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round_, " is not taking shares now"));
  }
  if (shares.round() != round_) {
    return absl::InvalidArgumentError(
        absl::StrCat("shares for round ", shares.round(), " in round ", round_));
  }
  auto g = graph_.find(shares.client_id());
  if (g == graph_.end()) {
    return absl::PermissionDeniedError(absl::StrCat("shares from client ", shares.client_id(),
                                                    ", which sent no keys in round ", round_));
  }
  const std::vector<uint32_t>& nbs = g->second;
  if (static_cast<size_t>(shares.shares_size()) != nbs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("client ", shares.client_id(), " sent ",
                                                   shares.shares_size(), " shares for ", nbs.size(),
                                                   " neighbours"));
  }
  absl::btree_set<uint32_t> to;
  for (const v1::SecAggSealedShare& s : shares.shares()) {
    if (s.from() != shares.client_id() || !std::binary_search(nbs.begin(), nbs.end(), s.to()) ||
        !to.insert(s.to()).second) {
      return absl::InvalidArgumentError(absl::StrCat("a share from ", s.from(), " to ", s.to(),
                                                     " in client ", shares.client_id(),
                                                     "'s message: not one for each neighbour"));
    }
    if (s.sealed().size() > kMaxSealed) {
      return absl::InvalidArgumentError(absl::StrCat("a sealed share of ", s.sealed().size(),
                                                     " bytes (at most ", kMaxSealed, ")"));
    }
  }
  auto [it, inserted] = shares_.try_emplace(shares.client_id(), shares);
  if (!inserted && it->second.SerializeAsString() != shares.SerializeAsString()) {
    return absl::AlreadyExistsError(
        absl::StrCat("client ", shares.client_id(), " already sent other shares this round"));
  }
  return absl::OkStatus();
}

absl::Status SecAggServerRound::CloseShares() {
  if (stage_ != Stage::kShares) return absl::FailedPreconditionError("not in the share stage");
  for (const auto& [id, s] : shares_) u2_.insert(id);
  // A client with fewer than t sharing neighbours refuses to mask: leave it out, and so its
  // shares, which may leave another short, until none is.
  for (bool changed = true; changed;) {
    changed = false;
    for (auto it = u2_.begin(); it != u2_.end();) {
      if (NeighboursIn(*it, u2_).size() < params_.threshold()) {
        it = u2_.erase(it);
        changed = true;
      } else {
        ++it;
      }
    }
  }
  stage_ = Stage::kMasked;
  return absl::OkStatus();
}

absl::StatusOr<v1::SecAggSharesReply> SecAggServerRound::SharesFor(uint32_t client_id) const {
  if (stage_ < Stage::kMasked) return absl::FailedPreconditionError("the share stage is open");
  if (!u2_.contains(client_id)) {
    return absl::NotFoundError(
        absl::StrCat("client ", client_id, " is not masking in round ", round_));
  }
  v1::SecAggSharesReply reply;
  for (uint32_t j : NeighboursIn(client_id, u2_)) {
    for (const v1::SecAggSealedShare& s : shares_.at(j).shares()) {
      if (s.to() == client_id) *reply.add_shares() = s;
    }
  }
  return reply;
}

absl::Status SecAggServerRound::AddMasked(uint32_t client_id, uint64_t round,
                                          std::string_view masked) {
  if (round != round_) {
    return absl::InvalidArgumentError(
        absl::StrCat("a masked update for round ", round, " in round ", round_));
  }
  if (stage_ != Stage::kMasked) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", round_, " is not taking masked updates now"));
  }
  if (!u2_.contains(client_id)) {
    return absl::PermissionDeniedError(absl::StrCat("a masked update from client ", client_id,
                                                    ", which is not masking in round ", round_));
  }
  if (u3_.contains(client_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("client ", client_id, "'s masked update is already in"));
  }
  const int bits = static_cast<int>(params_.modulus_bits());
  // Added as it is read; a refused vector leaves the sum as it was (its length is checked first).
  if (absl::Status s = AddDecodedMasked(masked, bits, absl::MakeSpan(sum_)); !s.ok()) return s;
  u3_.insert(client_id);
  return absl::OkStatus();
}

absl::Status SecAggServerRound::CloseMasked() {
  if (stage_ != Stage::kMasked) return absl::FailedPreconditionError("not in the masked stage");
  if (u3_.empty()) {
    stage_ = Stage::kDone;
    return absl::FailedPreconditionError(
        absl::StrCat("no masked update came in for round ", round_));
  }
  stage_ = Stage::kReveal;
  return absl::OkStatus();
}

absl::StatusOr<v1::SecAggUnmaskRequest> SecAggServerRound::UnmaskRequestFor(
    uint32_t client_id) const {
  if (stage_ != Stage::kReveal) {
    return absl::FailedPreconditionError(absl::StrCat("round ", round_, " is not unmasking"));
  }
  if (!u3_.contains(client_id)) {
    return absl::NotFoundError(absl::StrCat("client ", client_id, " sent no masked update"));
  }
  v1::SecAggUnmaskRequest req;
  req.set_round(round_);
  for (uint32_t j : NeighboursIn(client_id, u2_)) {
    if (u3_.contains(j)) {
      req.add_survivors(j);
    } else {
      req.add_dropped(j);
    }
  }
  return req;
}

absl::Status SecAggServerRound::AddReveal(const v1::SecAggReveal& reveal) {
  if (stage_ != Stage::kReveal) {
    return absl::FailedPreconditionError(absl::StrCat("round ", round_, " is not unmasking"));
  }
  if (reveal.round() != round_) {
    return absl::InvalidArgumentError(
        absl::StrCat("shares for round ", reveal.round(), " in round ", round_));
  }
  const uint32_t from = reveal.client_id();
  if (!u3_.contains(from)) {
    return absl::PermissionDeniedError(
        absl::StrCat("shares from client ", from, ", which sent no masked update"));
  }
  const std::vector<uint32_t> masking = NeighboursIn(from, u2_);
  // Check everything before keeping anything: a bad message changes nothing.
  std::vector<std::pair<std::pair<uint32_t, bool>, ShamirShare>> parsed;
  absl::btree_set<uint32_t> owners;
  for (const v1::SecAggRevealedShare& s : reveal.shares()) {
    const bool neighbour = std::binary_search(masking.begin(), masking.end(), s.owner());
    if (!neighbour || s.mask_key() == u3_.contains(s.owner()) || !owners.insert(s.owner()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("client ", from, " revealed a ", s.mask_key() ? "mask-key" : "self-mask",
                       " share of client ", s.owner(), ", which this round did not ask of it"));
    }
    absl::StatusOr<ShamirShare> share = DecodeShamirShare(s.share());
    if (!share.ok()) return share.status();
    if (share->x != uint64_t{from} + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("client ", from, "'s share of client ", s.owner(), " is not at its point"));
    }
    parsed.push_back({{s.owner(), s.mask_key()}, *share});
  }
  for (const auto& [key, share] : parsed) {
    auto [it, inserted] = revealed_[key].try_emplace(from, share);
    if (!inserted && (it->second.y != share.y)) {
      return absl::AlreadyExistsError(
          absl::StrCat("client ", from, " already revealed another share of client ", key.first));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SecAggServerRound::Result> SecAggServerRound::Finish() {
  if (stage_ != Stage::kReveal) {
    return absl::FailedPreconditionError(absl::StrCat("round ", round_, " is not unmasking"));
  }
  const int t = static_cast<int>(params_.threshold());
  const int bits = static_cast<int>(params_.modulus_bits());
  auto secret = [&](uint32_t owner, bool mask_key) -> absl::StatusOr<Key32> {
    std::vector<ShamirShare> shares;
    auto it = revealed_.find({owner, mask_key});
    if (it != revealed_.end()) {
      for (const auto& [from, s] : it->second) shares.push_back(s);
    }
    if (shares.size() < static_cast<size_t>(t)) {
      return absl::FailedPreconditionError(
          absl::StrCat("client ", owner, "'s ", mask_key ? "mask key" : "self-mask seed", " has ",
                       shares.size(), " shares of the ", t, " it needs to unmask round ", round_));
    }
    absl::StatusOr<Key32> k = ShamirCombine(shares, t);
    if (!k.ok()) {
      return absl::Status(k.status().code(),
                          absl::StrCat("client ", owner, "'s shares: ", k.status().message()));
    }
    return k;
  };
  std::vector<uint32_t> v = sum_;
  std::vector<uint32_t> scratch;
  for (uint32_t u : u3_) {
    absl::StatusOr<Key32> seed = secret(u, false);
    if (!seed.ok()) return seed.status();
    if (absl::Status s = AddMask(*seed, bits, false, absl::MakeSpan(v), &scratch); !s.ok()) {
      return s;
    }
  }
  Result result;
  const std::string mask_info = RoundInfo("mask", round_);
  for (uint32_t d : u2_) {
    if (u3_.contains(d)) continue;
    std::vector<uint32_t> survivors;
    for (uint32_t u : NeighboursIn(d, u2_)) {
      if (u3_.contains(u)) survivors.push_back(u);
    }
    result.dropped.push_back(d);
    if (survivors.empty()) continue;
    absl::StatusOr<Key32> key = secret(d, true);
    if (!key.ok()) return key.status();
    absl::StatusOr<Key32> pub = X25519PublicOf(*key);
    if (!pub.ok()) return pub.status();
    if (std::string_view(reinterpret_cast<const char*>(pub->data()), pub->size()) !=
        keys_.at(d).mask_public()) {
      return absl::DataLossError(absl::StrCat(
          "client ", d, "'s mask key rebuilt from its shares is not the one it advertised"));
    }
    for (uint32_t u : survivors) {
      absl::StatusOr<Key32> pair = AgreeKey(*key, keys_.at(u).mask_public(), mask_info);
      if (!pair.ok()) return pair.status();
      // u added its mask with d as (u, d): take that away.
      if (absl::Status s = AddMask(*pair, bits, !PairMaskAdds(u, d), absl::MakeSpan(v), &scratch);
          !s.ok()) {
        return s;
      }
    }
  }
  result.clients.assign(u3_.begin(), u3_.end());
  result.mean = SecAggMean(v, static_cast<uint32_t>(u3_.size()), params_);
  result.sum = std::move(v);
  sum_.clear();
  stage_ = Stage::kDone;
  return result;
}

}  // namespace tern

#include "core/federated/secagg.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "core/federated/secagg_crypto.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

v1::SecAggParams Params(uint32_t k, uint32_t t) {
  v1::SecAggParams p;
  p.set_threshold(t);
  p.set_neighbours(k);
  p.set_modulus_bits(24);
  p.set_levels(1u << 16);
  p.set_clip_range(1.0f);
  return p;
}

TEST(SecAggCrypto, BothEndsAgreeOneKeyAndEachInfoGivesAnother) {
  absl::StatusOr<X25519KeyPair> a = NewX25519KeyPair(), b = NewX25519KeyPair();
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string pa(a->public_key.begin(), a->public_key.end());
  const std::string pb(b->public_key.begin(), b->public_key.end());
  absl::StatusOr<Key32> ab = AgreeKey(a->private_key, pb, "x"),
                        ba = AgreeKey(b->private_key, pa, "x");
  ASSERT_TRUE(ab.ok() && ba.ok());
  EXPECT_EQ(*ab, *ba);
  absl::StatusOr<Key32> other = AgreeKey(a->private_key, pb, "y");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*ab, *other);
  EXPECT_THAT(AgreeKey(a->private_key, pb.substr(1), "x"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(AgreeKey(a->private_key, std::string(32, '\0'), "x"),  // a low-order point
              StatusIs(absl::StatusCode::kInvalidArgument));
  absl::StatusOr<Key32> pub = X25519PublicOf(a->private_key);
  ASSERT_TRUE(pub.ok());
  EXPECT_EQ(*pub, a->public_key);
}

TEST(SecAggCrypto, SealedBytesOpenOnlyUnchangedUnderTheirKeyAndAad) {
  Key32 key{};
  key[0] = 1;
  absl::StatusOr<std::string> sealed = Seal(key, "aad", "secret share");
  ASSERT_TRUE(sealed.ok());
  absl::StatusOr<std::string> open = Open(key, "aad", *sealed);
  ASSERT_TRUE(open.ok());
  EXPECT_EQ(*open, "secret share");
  EXPECT_FALSE(Open(key, "other", *sealed).ok());
  std::string flipped = *sealed;
  flipped[14] ^= 1;
  EXPECT_FALSE(Open(key, "aad", flipped).ok());
  EXPECT_FALSE(Open(key, "aad", sealed->substr(0, 20)).ok());
  Key32 other = key;
  other[1] = 2;
  EXPECT_FALSE(Open(other, "aad", *sealed).ok());
}

TEST(SecAggCrypto, MaskStreamsAreTheKeysAndFitTheirBits) {
  Key32 key{};
  std::vector<uint32_t> a(1000), b(1000);
  ASSERT_THAT(MaskStream(key, 12, absl::MakeSpan(a)), IsOk());
  ASSERT_THAT(MaskStream(key, 12, absl::MakeSpan(b)), IsOk());
  EXPECT_EQ(a, b);
  for (uint32_t v : a) EXPECT_LT(v, 1u << 12);
  key[5] = 1;
  ASSERT_THAT(MaskStream(key, 12, absl::MakeSpan(b)), IsOk());
  EXPECT_NE(a, b);
}

TEST(SecAggParamsCheck, RefusesASumThatWouldWrapAndBadThresholds) {
  v1::SecAggParams p = Params(4, 3);
  EXPECT_THAT(CheckSecAggParams(p, 255), IsOk());  // 255 * 2^16 < 2^24
  EXPECT_THAT(CheckSecAggParams(p, 256),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("wrap")));
  p.set_threshold(5);
  EXPECT_THAT(CheckSecAggParams(p, 10), StatusIs(absl::StatusCode::kInvalidArgument));
  p = Params(4, 3);
  p.set_modulus_bits(33);
  EXPECT_THAT(CheckSecAggParams(p, 10), StatusIs(absl::StatusCode::kInvalidArgument));
  p = Params(4, 3);
  p.set_clip_range(0);
  EXPECT_THAT(CheckSecAggParams(p, 10), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(SecAggGraphTest, IsRegularSymmetricAndTheSeeds) {
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 40; ++i) ids.push_back(i * 3 + 1);
  const auto g = SecAggGraph(ids, 5, 7);  // 5 rounds up to 6
  ASSERT_EQ(g.size(), ids.size());
  for (const auto& [u, nbs] : g) {
    EXPECT_EQ(nbs.size(), 6u);
    for (uint32_t v : nbs) {
      EXPECT_NE(u, v);
      const auto& back = g.at(v);
      EXPECT_TRUE(std::binary_search(back.begin(), back.end(), u)) << u << "-" << v;
    }
  }
  EXPECT_EQ(SecAggGraph(ids, 5, 7), g);
  EXPECT_NE(SecAggGraph(ids, 5, 8), g);
  const auto small = SecAggGraph({4, 9, 2}, 6, 1);
  for (const auto& [u, nbs] : small) EXPECT_EQ(nbs.size(), 2u);  // complete
}

TEST(SecAggQuantization, IsUnbiasedAndClips) {
  const v1::SecAggParams p = Params(4, 3);
  std::vector<float> x = {-5.0f, -1.0f, 0.0f, 0.3f, 1.0f, 7.0f};
  std::vector<uint32_t> sum(x.size(), 0);
  const int n = 200;
  for (int i = 0; i < n; ++i) {
    std::vector<uint32_t> q = SecAggQuantize(x, p, static_cast<uint64_t>(i));
    for (size_t j = 0; j < x.size(); ++j) {
      EXPECT_LE(q[j], p.levels());
      sum[j] += q[j];
    }
  }
  const std::vector<float> mean = SecAggMean(sum, n, p);
  const std::vector<float> want = {-1.0f, -1.0f, 0.0f, 0.3f, 1.0f, 1.0f};
  for (size_t j = 0; j < x.size(); ++j) EXPECT_NEAR(mean[j], want[j], 2e-5) << j;
}

TEST(SecAggMaskedBytes, RoundTripAndRefuseTruncatedOrOversized) {
  const std::vector<uint32_t> v = {0, 1, (1u << 20) - 1, 12345, 7};
  const std::string bytes = EncodeMasked(v, 20);
  EXPECT_EQ(bytes.size(), MaskedBytes(5, 20));
  absl::StatusOr<std::vector<uint32_t>> back = DecodeMasked(bytes, 5, 20);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, v);
  EXPECT_THAT(DecodeMasked(bytes.substr(1), 5, 20), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(DecodeMasked(bytes + "z", 5, 20), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(DecodeMasked(bytes, 5, 40), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(SecAggMaskedBytes, AddDecodedWrapsModTwoToTheBitsAndLeavesTheSumAloneOnABadLength) {
  const std::vector<uint32_t> v = {0, 1, (1u << 20) - 1, 12345, 7};
  const std::string bytes = EncodeMasked(v, 20);
  std::vector<uint32_t> sum = {5, 5, 5, 5, 5};
  ASSERT_THAT(AddDecodedMasked(bytes, 20, absl::MakeSpan(sum)), IsOk());
  EXPECT_EQ(sum, (std::vector<uint32_t>{5, 6, 4, 12350, 12}));
  const std::vector<uint32_t> before = sum;
  EXPECT_THAT(AddDecodedMasked(bytes.substr(1), 20, absl::MakeSpan(sum)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(sum, before);
}

// One round between n clients and a server, in process: who drops at which stage.
struct SecAggRun {
  v1::SecAggParams params;
  uint64_t round = 3;
  size_t dim = 257;
  std::vector<std::vector<float>> updates;  // by client id
  std::set<uint32_t> drop_before_shares, drop_before_mask, drop_after_mask;
  std::map<uint32_t, std::string> masked;  // what the server saw of each client
  std::vector<v1::SecAggReveal> reveals;
  std::map<uint32_t, SecAggClient> clients;
  std::function<void(v1::SecAggReveal*)> tamper;  // what a lying client changes in its reveal

  explicit SecAggRun(int n, uint32_t k, uint32_t t) : params(Params(k, t)) {
    for (int i = 0; i < n; ++i) {
      std::vector<float> u(dim);
      for (size_t j = 0; j < dim; ++j) {
        u[j] = std::sin(static_cast<float>(i * 31 + static_cast<int>(j))) * 0.9f;
      }
      updates.push_back(u);
    }
  }

  // Runs the stages to unmasking; Finish is the caller's.
  void Through(SecAggServerRound* server) {
    for (uint32_t id = 0; id < updates.size(); ++id) {
      absl::StatusOr<SecAggClient> c = SecAggClient::Start(params, id, round);
      ASSERT_TRUE(c.ok()) << c.status();
      clients.emplace(id, std::move(*c));
      ASSERT_THAT(server->AddKeys(clients.at(id).Keys()), IsOk());
    }
    ASSERT_THAT(server->CloseKeys(), IsOk());
    for (auto& [id, c] : clients) {
      if (drop_before_shares.contains(id)) continue;
      absl::StatusOr<v1::SecAggKeysReply> nbs = server->KeysFor(id);
      ASSERT_TRUE(nbs.ok()) << nbs.status();
      absl::StatusOr<v1::SecAggShares> shares = c.Share(*nbs);
      ASSERT_TRUE(shares.ok()) << shares.status();
      ASSERT_THAT(server->AddShares(*shares), IsOk());
    }
    ASSERT_THAT(server->CloseShares(), IsOk());
    for (auto& [id, c] : clients) {
      if (drop_before_shares.contains(id) || drop_before_mask.contains(id)) continue;
      absl::StatusOr<v1::SecAggSharesReply> shares = server->SharesFor(id);
      ASSERT_TRUE(shares.ok()) << shares.status();
      absl::StatusOr<std::string> m = c.Mask(*shares, updates[id]);
      ASSERT_TRUE(m.ok()) << m.status();
      if (drop_after_mask.contains(id)) continue;  // masked, then gone before it sent
      masked[id] = *m;
      ASSERT_THAT(server->AddMasked(id, round, *m), IsOk());
    }
    ASSERT_THAT(server->CloseMasked(), IsOk());
    for (const auto& [id, m] : masked) {
      absl::StatusOr<v1::SecAggUnmaskRequest> req = server->UnmaskRequestFor(id);
      ASSERT_TRUE(req.ok()) << req.status();
      absl::StatusOr<v1::SecAggReveal> r = clients.at(id).Reveal(*req);
      ASSERT_TRUE(r.ok()) << r.status();
      if (tamper) tamper(&*r);
      reveals.push_back(*r);
      ASSERT_THAT(server->AddReveal(*r), IsOk());
    }
  }

  std::vector<double> PlainMean() const {
    std::vector<double> mean(dim, 0);
    for (const auto& [id, m] : masked) {
      for (size_t j = 0; j < dim; ++j)
        mean[j] += updates[id][j] / static_cast<double>(masked.size());
    }
    return mean;
  }
};

TEST(SecAggRound, TenClientsTwoDroppingAfterMaskingUnmaskToThePlainMean) {
  SecAggRun run(10, 6, 4);
  run.drop_after_mask = {2, 7};
  SecAggServerRound server(run.params, run.round, run.dim, 11);
  ASSERT_NO_FATAL_FAILURE(run.Through(&server));
  absl::StatusOr<SecAggServerRound::Result> result = server.Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->clients.size(), 8u);
  EXPECT_EQ(result->dropped, (std::vector<uint32_t>{2, 7}));
  const std::vector<double> plain = run.PlainMean();
  const double step = 2.0 * run.params.clip_range() / run.params.levels();
  for (size_t j = 0; j < run.dim; ++j) EXPECT_NEAR(result->mean[j], plain[j], step) << j;
}

TEST(SecAggQuantize, WrappedValuesOutsideTheRangeSumAndDecodeCentred) {
  const v1::SecAggParams p = Params(4, 2);  // r = 1, Q = 2^16, b = 24
  // Clipped without wrap; with it, -1.7 and 1.5 stay themselves mod 2^b.
  const std::vector<float> x = {-1.7f, 1.5f, 0.25f};
  const std::vector<uint32_t> clipped = SecAggQuantize(x, p, 1);
  EXPECT_EQ(clipped[0], 0u);
  EXPECT_EQ(clipped[1], p.levels());
  const std::vector<uint32_t> a = SecAggQuantize(x, p, 1, /*wrap=*/true);
  const std::vector<uint32_t> b = SecAggQuantize(std::vector<float>{-0.3f, -0.5f, 0.25f}, p, 2,
                                                 /*wrap=*/true);
  std::vector<uint32_t> sum(3);
  for (size_t i = 0; i < 3; ++i) sum[i] = (a[i] + b[i]) & ((1u << 24) - 1);
  const std::vector<float> mean = SecAggMean(sum, 2, p);
  const std::vector<float> one = SecAggMean(a, 1, p);
  const double step = 2.0 / p.levels();
  EXPECT_NEAR(mean[0], -1.0, step);
  EXPECT_NEAR(mean[1], 0.5, step);
  EXPECT_NEAR(mean[2], 0.25, step);
  EXPECT_NEAR(one[0], -1.7, step);
  EXPECT_NEAR(one[1], 1.5, step);
}

TEST(SecAggRound, ClientsNoiseSumsToTheSurvivorsShareAroundThePlainMean) {
  SecAggRun run(10, 6, 4);
  run.dim = 4096;
  run.updates.clear();
  for (int i = 0; i < 10; ++i) {
    std::vector<float> u(run.dim);
    for (size_t j = 0; j < run.dim; ++j) u[j] = std::sin(static_cast<float>(i + 7 * j)) * 0.9f;
    run.updates.push_back(u);
  }
  run.params.set_noise_sd(0.2f);  // often past r = 1 with the update: those wrap
  run.drop_after_mask = {2, 7};
  SecAggServerRound server(run.params, run.round, run.dim, 13);
  ASSERT_NO_FATAL_FAILURE(run.Through(&server));
  absl::StatusOr<SecAggServerRound::Result> result = server.Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->clients.size(), 8u);
  // The 8 survivors' noise: their mean's sd is 0.2 sqrt(8) / 8 = 0.0707 a coordinate.
  const std::vector<double> plain = run.PlainMean();
  double sum = 0, sq = 0;
  for (size_t j = 0; j < run.dim; ++j) {
    const double e = result->mean[j] - plain[j];
    sum += e;
    sq += e * e;
  }
  EXPECT_NEAR(sum / run.dim, 0, 0.006);
  EXPECT_NEAR(std::sqrt(sq / run.dim), 0.2 * std::sqrt(8.0) / 8, 0.0707 * 0.06);
}

TEST(SecAggRound, RandomKMasksTheRoundsSharedPositionsAndScattersTheirMean) {
  SecAggRun run(10, 6, 4);
  run.params.set_keep(64);  // of 257
  run.params.set_keep_seed(0xfeed);
  run.params.set_keep_unbiased(true);
  run.drop_after_mask = {3};
  const std::vector<uint32_t> kept = SecAggKept(run.params, run.dim);
  ASSERT_EQ(kept.size(), 64u);
  EXPECT_EQ(std::set<uint32_t>(kept.begin(), kept.end()).size(), 64u);  // distinct positions
  for (uint32_t at : kept) EXPECT_LT(at, run.dim);
  SecAggServerRound server(run.params, run.round, SecAggMaskedDim(run.params, run.dim), 17);
  ASSERT_NO_FATAL_FAILURE(run.Through(&server));
  // 64 coordinates of 24 bits on the wire, not 257.
  EXPECT_EQ(run.masked.begin()->second.size(), MaskedBytes(64, 24));
  absl::StatusOr<SecAggServerRound::Result> result = server.Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  const std::vector<float> mean = SecAggScatter(run.params, result->mean, run.dim);
  ASSERT_EQ(mean.size(), run.dim);
  const std::vector<double> plain = run.PlainMean();
  const double step = 2.0 * run.params.clip_range() / run.params.levels();
  const std::set<uint32_t> at(kept.begin(), kept.end());
  for (size_t j = 0; j < run.dim; ++j) {
    // Kept: the survivors' mean times d / k (unbiased); the rest zero.
    const double want = at.contains(static_cast<uint32_t>(j)) ? plain[j] * 257 / 64 : 0;
    EXPECT_NEAR(mean[j], want, step * 257 / 64) << j;
  }
  // A round that keeps more values than a client has is refused by the client.
  v1::SecAggParams too_many = run.params;
  too_many.set_keep(1000);
  EXPECT_TRUE(SecAggKept(too_many, run.dim).empty());  // keep >= d: every value
}

TEST(SecAggRound, ClientsDroppingAtEveryStageLeaveTheSurvivorsSum) {
  SecAggRun run(12, 8, 3);  // at least 8 - 4 neighbours of each survive
  run.drop_before_shares = {0};
  run.drop_before_mask = {5};
  run.drop_after_mask = {9, 10};
  SecAggServerRound server(run.params, run.round, run.dim, 5);
  ASSERT_NO_FATAL_FAILURE(run.Through(&server));
  absl::StatusOr<SecAggServerRound::Result> result = server.Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->clients.size(), 8u);
  const std::vector<double> plain = run.PlainMean();
  const double step = 2.0 * run.params.clip_range() / run.params.levels();
  for (size_t j = 0; j < run.dim; ++j) EXPECT_NEAR(result->mean[j], plain[j], step) << j;
}

TEST(SecAggRound, TheServerNeverHoldsAnUpdateOrTheSharesToUnmaskOne) {
  SecAggRun run(10, 6, 4);
  run.dim = 4096;  // every update zero
  for (auto& u : run.updates) u.assign(run.dim, 0.0f);
  run.drop_after_mask = {4};
  SecAggServerRound server(run.params, run.round, run.dim, 3);
  ASSERT_NO_FATAL_FAILURE(run.Through(&server));
  // What reached the server of one client is uniform mod 2^b, not the update (all Q/2).
  for (const auto& [id, bytes] : run.masked) {
    absl::StatusOr<std::vector<uint32_t>> v = DecodeMasked(bytes, run.dim, 24);
    ASSERT_TRUE(v.ok());
    std::vector<int> buckets(16, 0);
    int at_update = 0;
    for (uint32_t x : *v) {
      ++buckets[x >> 20];
      at_update += x == run.params.levels() / 2;
    }
    EXPECT_LE(at_update, 2) << id;
    double chi2 = 0;
    const double want = run.dim / 16.0;
    for (int c : buckets) chi2 += (c - want) * (c - want) / want;
    EXPECT_LT(chi2, 60.0) << id;  // 15 degrees of freedom: p < 1e-7 above this
  }
  // Of a survivor the server got self-mask shares only; of the dropped one, mask-key shares only.
  for (const v1::SecAggReveal& r : run.reveals) {
    for (const v1::SecAggRevealedShare& s : r.shares()) {
      EXPECT_EQ(s.mask_key(), s.owner() == 4u) << r.client_id() << " of " << s.owner();
    }
  }
  // Asked again with a survivor called dropped, a client refuses: the server cannot get both
  // secrets of one client.
  uint32_t asked = 0;
  v1::SecAggUnmaskRequest lie;
  for (const auto& [id, c] : run.masked) {
    absl::StatusOr<v1::SecAggUnmaskRequest> req = server.UnmaskRequestFor(id);
    ASSERT_TRUE(req.ok());
    if (req->survivors_size() > 0) {
      asked = id;
      lie = *req;
      break;
    }
  }
  lie.add_dropped(lie.survivors(0));
  lie.mutable_survivors()->erase(lie.mutable_survivors()->begin());
  EXPECT_THAT(run.clients.at(asked).Reveal(lie), StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST(SecAggRound, AClientRefusesToRevealToAServerClaimingTooFewSurvivors) {
  SecAggRun run(8, 6, 4);
  SecAggServerRound server(run.params, run.round, run.dim, 3);
  run.drop_after_mask = {0, 1, 2, 3, 4, 5, 6};  // stop before the reveal stage
  for (uint32_t id = 0; id < 8; ++id) {
    absl::StatusOr<SecAggClient> c = SecAggClient::Start(run.params, id, run.round);
    ASSERT_TRUE(c.ok());
    run.clients.emplace(id, std::move(*c));
    ASSERT_THAT(server.AddKeys(run.clients.at(id).Keys()), IsOk());
  }
  ASSERT_THAT(server.CloseKeys(), IsOk());
  for (auto& [id, c] : run.clients)
    ASSERT_THAT(server.AddShares(*c.Share(*server.KeysFor(id))), IsOk());
  ASSERT_THAT(server.CloseShares(), IsOk());
  SecAggClient& c0 = run.clients.at(0);
  ASSERT_TRUE(c0.Mask(*server.SharesFor(0), run.updates[0]).ok());
  v1::SecAggUnmaskRequest req;
  req.set_round(run.round);
  const v1::SecAggKeysReply nbs = *server.KeysFor(0);
  req.add_survivors(nbs.neighbours(0).client_id());
  for (int i = 1; i < nbs.neighbours_size(); ++i) req.add_dropped(nbs.neighbours(i).client_id());
  EXPECT_THAT(c0.Reveal(req), StatusIs(absl::StatusCode::kFailedPrecondition));
  req.set_round(run.round + 1);
  EXPECT_THAT(c0.Reveal(req), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(SecAggRound, BadMessagesAreRefusedAndTheRoundGoesOn) {
  SecAggRun run(6, 4, 3);
  SecAggServerRound server(run.params, run.round, run.dim, 9);
  for (uint32_t id = 0; id < 6; ++id) {
    absl::StatusOr<SecAggClient> c = SecAggClient::Start(run.params, id, run.round);
    ASSERT_TRUE(c.ok());
    run.clients.emplace(id, std::move(*c));
  }
  v1::SecAggKeys wrong_round = run.clients.at(0).Keys();
  wrong_round.set_round(run.round + 1);
  EXPECT_THAT(server.AddKeys(wrong_round), StatusIs(absl::StatusCode::kInvalidArgument));
  v1::SecAggKeys short_key = run.clients.at(0).Keys();
  short_key.mutable_mask_public()->pop_back();
  EXPECT_THAT(server.AddKeys(short_key), StatusIs(absl::StatusCode::kInvalidArgument));
  for (auto& [id, c] : run.clients) ASSERT_THAT(server.AddKeys(c.Keys()), IsOk());
  EXPECT_THAT(server.AddKeys(run.clients.at(0).Keys()), IsOk());  // a retry
  absl::StatusOr<SecAggClient> other = SecAggClient::Start(run.params, 0, run.round);
  ASSERT_TRUE(other.ok());
  EXPECT_THAT(server.AddKeys(other->Keys()), StatusIs(absl::StatusCode::kAlreadyExists));
  ASSERT_THAT(server.CloseKeys(), IsOk());

  // Shares from a stranger, to a non-neighbour, or too few.
  std::map<uint32_t, v1::SecAggShares> shares;
  for (auto& [id, c] : run.clients) shares[id] = *c.Share(*server.KeysFor(id));
  v1::SecAggShares stranger = shares[1];
  stranger.set_client_id(77);
  for (auto& s : *stranger.mutable_shares()) s.set_from(77);
  EXPECT_THAT(server.AddShares(stranger),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("sent no keys")));
  v1::SecAggShares misaddressed = shares[1];
  misaddressed.mutable_shares(0)->set_to(1);
  EXPECT_THAT(server.AddShares(misaddressed), StatusIs(absl::StatusCode::kInvalidArgument));
  v1::SecAggShares few = shares[1];
  few.mutable_shares()->RemoveLast();
  EXPECT_THAT(server.AddShares(few), StatusIs(absl::StatusCode::kInvalidArgument));
  for (auto& [id, s] : shares) ASSERT_THAT(server.AddShares(s), IsOk());
  ASSERT_THAT(server.CloseShares(), IsOk());

  // A share tampered with on the way: the client refuses to mask with it.
  {
    v1::SecAggSharesReply reply = *server.SharesFor(2);
    (*reply.mutable_shares(0)->mutable_sealed())[20] ^= 1;
    absl::StatusOr<SecAggClient> c = SecAggClient::Start(run.params, 2, run.round);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c->Share(*server.KeysFor(2)).ok());
    EXPECT_THAT(c->Mask(reply, run.updates[2]), StatusIs(absl::StatusCode::kInvalidArgument));
  }

  std::map<uint32_t, std::string> masked;
  for (auto& [id, c] : run.clients) masked[id] = *c.Mask(*server.SharesFor(id), run.updates[id]);
  EXPECT_THAT(server.AddMasked(0, run.round + 1, masked[0]),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("for round 4")));
  EXPECT_THAT(server.AddMasked(42, run.round, masked[0]),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(server.AddMasked(0, run.round, masked[0].substr(3)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  for (auto& [id, m] : masked) ASSERT_THAT(server.AddMasked(id, run.round, m), IsOk());
  EXPECT_THAT(server.AddMasked(0, run.round, masked[0]),
              StatusIs(absl::StatusCode::kAlreadyExists));
  ASSERT_THAT(server.CloseMasked(), IsOk());

  std::map<uint32_t, v1::SecAggReveal> reveals;
  for (auto& [id, c] : run.clients) reveals[id] = *c.Reveal(*server.UnmaskRequestFor(id));
  v1::SecAggReveal unasked = reveals[0];
  unasked.mutable_shares(0)->set_mask_key(true);  // a survivor's mask key
  EXPECT_THAT(server.AddReveal(unasked),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("did not ask")));
  v1::SecAggReveal moved = reveals[0];
  *moved.mutable_shares(0)->mutable_share() = reveals[1].shares(0).share();  // another's point
  EXPECT_THAT(server.AddReveal(moved), StatusIs(absl::StatusCode::kInvalidArgument));
  v1::SecAggReveal truncated = reveals[0];
  truncated.mutable_shares(0)->mutable_share()->pop_back();
  EXPECT_THAT(server.AddReveal(truncated), StatusIs(absl::StatusCode::kInvalidArgument));
  v1::SecAggReveal from_stranger = reveals[0];
  from_stranger.set_client_id(99);
  EXPECT_THAT(server.AddReveal(from_stranger), StatusIs(absl::StatusCode::kPermissionDenied));

  // Two reveals only: too few shares for a threshold of 3, and the server says whose.
  ASSERT_THAT(server.AddReveal(reveals[0]), IsOk());
  ASSERT_THAT(server.AddReveal(reveals[1]), IsOk());
  SecAggServerRound copy = server;
  EXPECT_THAT(copy.Finish(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                      HasSubstr("shares of the 3 it needs")));
  for (auto& [id, r] : reveals) ASSERT_THAT(server.AddReveal(r), IsOk());
  absl::StatusOr<SecAggServerRound::Result> result = server.Finish();
  ASSERT_TRUE(result.ok()) << result.status();
  const double step = 2.0 * run.params.clip_range() / run.params.levels();
  for (size_t j = 0; j < run.dim; ++j) {
    double plain = 0;
    for (const auto& u : run.updates) plain += u[j] / 6.0;
    EXPECT_NEAR(result->mean[j], plain, step);
  }
}

TEST(SecAggRound, ALyingShareOfADroppedClientsMaskKeyIsDataLoss) {
  SecAggRun run(7, 6, 3);
  run.drop_after_mask = {3};
  run.tamper = [](v1::SecAggReveal* r) {
    for (v1::SecAggRevealedShare& s : *r->mutable_shares()) {
      if (s.mask_key()) (*s.mutable_share())[9] ^= 1;  // a value changed, still in the field
    }
  };
  SecAggServerRound server(run.params, run.round, run.dim, 9);
  ASSERT_NO_FATAL_FAILURE(run.Through(&server));
  EXPECT_THAT(server.Finish(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("client 3")));
}

}  // namespace
}  // namespace tern

// Secure aggregation through the aggregator: a round's clients driven by hand through the stages
// (core/federated/secagg.h's SecAggClient), the round's model the survivors' mean; clients that
// miss a stage are left out while the round goes on; bad messages are refused with the reason;
// a restarted server closes the round it cannot unmask and the next one works.
#include "server/secure_rounds.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/federated/secagg.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/aggregator.h"
#include "server/aggregator_fixture.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::tern::testing::ValueOrFailure;
using ::testing::HasSubstr;
using testing_fixture::AggregatorTest;
using testing_fixture::TempPath;

const absl::Time kSecT0 = testing_fixture::kT0;

// A client's side of a round (it aborts the test, naming why, if it cannot start).
SecAggClient StartClient(absl::StatusOr<SecAggClient> c) { return *std::move(c); }

class SecureRoundTest : public AggregatorTest {
 protected:
  SecureRoundTest() {
    options_.secagg.enabled = true;
    options_.secagg.neighbours = 4;
    options_.secagg.bits = 24;
    options_.secagg.range = 4.0;
    options_.secagg.stage_timeout = absl::Seconds(5);
    options_.policy.clients_per_round = 5;
    options_.policy.min_replies = 5;
  }

  // Client `id`'s update: distinct per client.
  static std::vector<float> Delta(uint32_t id) {
    std::vector<float> d(9);
    for (size_t i = 0; i < d.size(); ++i) d[i] = 0.1f * static_cast<float>(id + 1) - 0.05f * i;
    return d;
  }

  v1::SecAggReply Ask(Aggregator& a, uint32_t id, int64_t round, v1::SecAggRequest::Want want,
                      absl::Time now = kSecT0) {
    v1::SecAggRequest r;
    r.set_client_id(id);
    r.set_round(static_cast<uint64_t>(round));
    r.set_want(want);
    return ValueOrFailure(a.SecAgg(r, now));
  }

  absl::Status Send(Aggregator& a, v1::SecAggRequest r, absl::Time now = kSecT0) {
    absl::Status s = a.SecAgg(r, now).status();
    EXPECT_THAT(a.Tick(now), IsOk());
    return s;
  }

  absl::StatusOr<v1::UpdateReply> PushMasked(Aggregator& a, uint32_t id, int64_t round,
                                             const std::string& masked, absl::Time now = kSecT0) {
    v1::UpdateInfo info;
    info.set_client_id(id);
    info.set_round(static_cast<uint64_t>(round));
    info.set_weight(10);
    info.set_loss(0.5f);
    v1::TensorBundle b;
    b.set_run_id("r");
    b.set_round(static_cast<uint64_t>(round));
    v1::NamedTensor* t = b.add_tensors();
    t->set_name("secagg");
    t->mutable_tensor()->set_codec("secagg");
    t->mutable_tensor()->set_numel(9);
    t->mutable_tensor()->set_payload(masked);
    absl::StatusOr<v1::UpdateReply> r = a.Push(info, b, masked.size(), now);
    EXPECT_THAT(a.Tick(now), IsOk());
    return r;
  }

  // Takes `ids` through keys and shares; returns their clients and shares.
  struct Ready {
    std::map<uint32_t, SecAggClient> clients;
    std::map<uint32_t, v1::SecAggSharesReply> shares;
  };
  Ready ThroughShares(Aggregator& a, const std::vector<uint32_t>& ids, int64_t round) {
    Ready r;
    for (uint32_t id : ids) {
      const v1::Task task = ValueOrFailure(a.Fetch(id, kSecT0)).task;
      EXPECT_TRUE(task.has_secagg());
      absl::StatusOr<SecAggClient> c = SecAggClient::Start(task.secagg(), id, task.round());
      EXPECT_THAT(c.status(), IsOk());
      r.clients.emplace(id, *std::move(c));
    }
    for (auto& [id, c] : r.clients) {
      v1::SecAggRequest req;
      req.set_client_id(id);
      req.set_round(static_cast<uint64_t>(round));
      *req.mutable_keys() = c.Keys();
      EXPECT_THAT(Send(a, req), IsOk());
    }
    for (auto& [id, c] : r.clients) {
      const v1::SecAggReply nb = Ask(a, id, round, v1::SecAggRequest::NEIGHBOURS);
      EXPECT_FALSE(nb.pending());
      v1::SecAggRequest req;
      req.set_client_id(id);
      req.set_round(static_cast<uint64_t>(round));
      *req.mutable_shares() = ValueOrFailure(c.Share(nb.neighbours()));
      EXPECT_THAT(Send(a, req), IsOk());
    }
    for (auto& [id, c] : r.clients) {
      const v1::SecAggReply sh = Ask(a, id, round, v1::SecAggRequest::SHARES);
      EXPECT_FALSE(sh.pending());
      r.shares[id] = sh.shares();
    }
    return r;
  }

  void Reveal(Aggregator& a, Ready& r, const std::vector<uint32_t>& ids, int64_t round) {
    for (uint32_t id : ids) {
      const v1::SecAggReply u = Ask(a, id, round, v1::SecAggRequest::UNMASK);
      ASSERT_FALSE(u.pending());
      v1::SecAggRequest req;
      req.set_client_id(id);
      req.set_round(static_cast<uint64_t>(round));
      *req.mutable_reveal() = ValueOrFailure(r.clients.at(id).Reveal(u.unmask()));
      ASSERT_THAT(Send(a, req), IsOk());
    }
  }
};

TEST_F(SecureRoundTest, FiveClientsOneLostAfterMaskingGiveTheOthersMean) {
  options_.policy.min_replies = 4;
  options_.policy.grace = absl::ZeroDuration();
  auto a = Start(5);
  ASSERT_NE(a, nullptr);
  Ready r = ThroughShares(*a, {0, 1, 2, 3, 4}, 1);
  std::map<uint32_t, std::string> masked;
  for (uint32_t id = 0; id < 5; ++id) {
    masked[id] = ValueOrFailure(r.clients.at(id).Mask(r.shares.at(id), Delta(id)));
  }
  // The unmask question waits for the masked vectors.
  EXPECT_TRUE(Ask(*a, 0, 1, v1::SecAggRequest::UNMASK).pending());
  for (uint32_t id = 0; id < 4; ++id) {  // client 4's never comes
    ASSERT_EQ(ValueOrFailure(PushMasked(*a, id, 1, masked[id])).verdict(),
              v1::UpdateReply::ACCEPTED);
  }
  EXPECT_THAT(PushMasked(*a, 4, 1, masked[4]),  // too late: the stage closed with 4 replies
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_NO_FATAL_FAILURE(Reveal(*a, r, {0, 1, 2, 3}, 1));
  const v1::ServerStatus st = a->Status(kSecT0);
  EXPECT_EQ(st.round(), 1u);
  EXPECT_EQ(st.last_round_updates(), 4u);
  EXPECT_EQ(st.secagg_dropped(), 1u);
  const std::vector<float> x = ModelOf(*a, 1);
  const double step = 2 * 4.0 / ValueOrFailure(a->Fetch(0, kSecT0)).task.secagg().levels();
  for (size_t i = 0; i < x.size(); ++i) {
    double mean = 0;
    for (uint32_t id = 0; id < 4; ++id) mean += Delta(id)[i] / 4.0;
    EXPECT_NEAR(x[i], x0_[i] + mean, step + 1e-5) << i;
  }
}

TEST_F(SecureRoundTest, AClientThatMissesTheKeyStageIsLeftOutAndTheRoundGoesOn) {
  options_.policy.min_replies = 4;
  auto a = Start(5);
  ASSERT_NE(a, nullptr);
  // Client 4 fetched but never sent keys: the stage closes at its timeout without it.
  for (uint32_t id = 0; id < 5; ++id)
    ASSERT_TRUE(ValueOrFailure(a->Fetch(id, kSecT0)).task.has_secagg());
  std::map<uint32_t, SecAggClient> clients;
  for (uint32_t id = 0; id < 4; ++id) {
    const v1::Task task = ValueOrFailure(a->Fetch(id, kSecT0)).task;
    clients.emplace(id, StartClient(SecAggClient::Start(task.secagg(), id, task.round())));
    v1::SecAggRequest req;
    req.set_client_id(id);
    req.set_round(1);
    *req.mutable_keys() = clients.at(id).Keys();
    ASSERT_THAT(Send(*a, req), IsOk());
  }
  EXPECT_TRUE(Ask(*a, 0, 1, v1::SecAggRequest::NEIGHBOURS).pending());
  const absl::Time later = kSecT0 + absl::Seconds(6);
  ASSERT_THAT(a->Tick(later), IsOk());
  const v1::SecAggReply nb = Ask(*a, 0, 1, v1::SecAggRequest::NEIGHBOURS, later);
  ASSERT_FALSE(nb.pending());
  for (const v1::SecAggNeighbour& n : nb.neighbours().neighbours()) EXPECT_NE(n.client_id(), 4u);
  v1::SecAggRequest late;
  late.set_client_id(4);
  late.set_round(1);
  late.set_want(v1::SecAggRequest::NEIGHBOURS);
  EXPECT_THAT(a->SecAgg(late, later), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(SecureRoundTest, BadMessagesAreRefusedWithTheReasonAndTheRoundGoesOn) {
  auto a = Start(6);  // 5 of 6 sampled
  ASSERT_NE(a, nullptr);
  std::vector<uint32_t> sampled, other;
  for (uint32_t id = 0; id < 6; ++id) {
    (ValueOrFailure(a->Fetch(id, kSecT0)).task.kind() == v1::Task::TRAIN ? sampled : other)
        .push_back(id);
  }
  ASSERT_EQ(sampled.size(), 5u);
  ASSERT_EQ(other.size(), 1u);
  // A client the round did not sample, and a round that is not the open one.
  EXPECT_THAT(a->SecAgg(
                  [&] {
                    v1::SecAggRequest r;
                    r.set_client_id(other[0]);
                    r.set_round(1);
                    r.set_want(v1::SecAggRequest::NEIGHBOURS);
                    return r;
                  }(),
                  kSecT0),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("not sampled")));
  {
    v1::SecAggRequest r;
    r.set_client_id(sampled[0]);
    r.set_round(7);
    r.set_want(v1::SecAggRequest::NEIGHBOURS);
    EXPECT_THAT(a->SecAgg(r, kSecT0), StatusIs(absl::StatusCode::kFailedPrecondition));
  }
  // Keys sent in another client's name.
  {
    const v1::Task task = ValueOrFailure(a->Fetch(sampled[0], kSecT0)).task;
    SecAggClient c = StartClient(SecAggClient::Start(task.secagg(), sampled[1], 1));
    v1::SecAggRequest r;
    r.set_client_id(sampled[0]);
    r.set_round(1);
    *r.mutable_keys() = c.Keys();
    EXPECT_THAT(a->SecAgg(r, kSecT0), StatusIs(absl::StatusCode::kInvalidArgument));
  }
  Ready ready = ThroughShares(*a, sampled, 1);
  // A plain update, and a masked one for another round or of the wrong size.
  EXPECT_THAT(Push(*a, sampled[0], 1, 10, Delta(0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("aggregates securely")));
  const std::string m0 = ValueOrFailure(
      ready.clients.at(sampled[0]).Mask(ready.shares.at(sampled[0]), Delta(sampled[0])));
  EXPECT_THAT(PushMasked(*a, sampled[0], 2, m0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PushMasked(*a, sampled[0], 1, m0.substr(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(PushMasked(*a, other[0], 1, m0), StatusIs(absl::StatusCode::kPermissionDenied));
  // Then the round, all of it: the mean of the five.
  ASSERT_EQ(ValueOrFailure(PushMasked(*a, sampled[0], 1, m0)).verdict(), v1::UpdateReply::ACCEPTED);
  EXPECT_THAT(PushMasked(*a, sampled[0], 1, m0), StatusIs(absl::StatusCode::kAlreadyExists));
  for (size_t i = 1; i < sampled.size(); ++i) {
    const uint32_t id = sampled[i];
    ASSERT_THAT(
        PushMasked(*a, id, 1,
                   ValueOrFailure(ready.clients.at(id).Mask(ready.shares.at(id), Delta(id)))),
        IsOk());
  }
  ASSERT_THAT(a->Tick(kSecT0 + absl::Seconds(2)), IsOk());  // the grace: the stage closes
  // A reveal of a share it was not asked for.
  {
    const v1::SecAggReply u = Ask(*a, sampled[0], 1, v1::SecAggRequest::UNMASK);
    ASSERT_FALSE(u.pending());
    v1::SecAggReveal bad = ValueOrFailure(ready.clients.at(sampled[0]).Reveal(u.unmask()));
    bad.mutable_shares(0)->set_mask_key(true);
    v1::SecAggRequest r;
    r.set_client_id(sampled[0]);
    r.set_round(1);
    *r.mutable_reveal() = bad;
    EXPECT_THAT(a->SecAgg(r, kSecT0), StatusIs(absl::StatusCode::kInvalidArgument));
  }
  ASSERT_NO_FATAL_FAILURE(Reveal(*a, ready, sampled, 1));
  const v1::ServerStatus st = a->Status(kSecT0);
  EXPECT_EQ(st.round(), 1u);
  EXPECT_EQ(st.last_round_updates(), 5u);
  EXPECT_GE(st.updates_refused(), 5u);
  const std::vector<float> x = ModelOf(*a, 1);
  for (size_t i = 0; i < x.size(); ++i) {
    double mean = 0;
    for (uint32_t id : sampled) mean += Delta(id)[i] / 5.0;
    EXPECT_NEAR(x[i], x0_[i] + mean, 1e-4) << i;
  }
}

TEST_F(SecureRoundTest, ARestartedServerClosesTheRoundItCannotUnmaskAndTheNextOneWorks) {
  options_.checkpoint_path = TempPath("server.ckpt");
  options_.policy.grace = absl::ZeroDuration();
  {
    auto a = Start(5);
    ASSERT_NE(a, nullptr);
    Ready r = ThroughShares(*a, {0, 1, 2, 3, 4}, 1);
    ASSERT_THAT(
        PushMasked(*a, 0, 1, ValueOrFailure(r.clients.at(0).Mask(r.shares.at(0), Delta(0)))),
        IsOk());
  }
  auto b = ValueOrFailure(Aggregator::Create(options_, &registries_, kSecT0));
  ASSERT_THAT(b->Tick(kSecT0), IsOk());
  EXPECT_EQ(b->Status(kSecT0).secagg_failed_rounds(), 1u);
  EXPECT_EQ(b->Status(kSecT0).round(), 1u);
  EXPECT_EQ(ModelOf(*b, 1), x0_);  // closed without an update
  // Round 2 opens and runs securely.
  for (uint32_t id = 0; id < 5; ++id) {
    v1::JoinRequest j;
    j.set_run_id("r");
    j.set_client_id(id);
    absl::Status s;
    b->Join(j, kSecT0, &s);
    ASSERT_THAT(s, IsOk());
  }
  ASSERT_THAT(b->Tick(kSecT0), IsOk());
  Ready r = ThroughShares(*b, {0, 1, 2, 3, 4}, 2);
  for (uint32_t id = 0; id < 5; ++id) {
    ASSERT_THAT(
        PushMasked(*b, id, 2, ValueOrFailure(r.clients.at(id).Mask(r.shares.at(id), Delta(id)))),
        IsOk());
  }
  ASSERT_NO_FATAL_FAILURE(Reveal(*b, r, {0, 1, 2, 3, 4}, 2));
  EXPECT_EQ(b->Status(kSecT0).round(), 2u);
  EXPECT_EQ(b->Status(kSecT0).last_round_updates(), 5u);
}

TEST_F(SecureRoundTest, OptionsThatCannotRunSecurelyAreRefused) {
  EXPECT_THAT(Normalized([](AggregatorOptions& o) { o.rule = "median"; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--rule=fedavg")));
  EXPECT_THAT(Normalized([](AggregatorOptions& o) { o.task.set_update_codec("topk:ratio=0.1"); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not an integer vector")));
  // Random-k adds up with one seed a round for all; not with a residual, nor with a bad spec.
  EXPECT_THAT(
      Normalized([](AggregatorOptions& o) { o.task.set_update_codec("randomk:ratio=0.1"); }),
      IsOk());
  EXPECT_THAT(Normalized([](AggregatorOptions& o) {
                o.task.set_update_codec("randomk:ratio=0.1");
                o.task.set_error_feedback(true);
              }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--error_feedback")));
  EXPECT_THAT(Normalized([](AggregatorOptions& o) { o.task.set_update_codec("randomk:ratio=2"); }),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Normalized([](AggregatorOptions& o) { o.mode = "fedbuff"; }),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // DP with a fixed clip: the clients' own noise; an adaptive one would count in the clear.
  EXPECT_THAT(Normalized([](AggregatorOptions& o) { o.dp.clip = 1; }), IsOk());
  EXPECT_THAT(Normalized([](AggregatorOptions& o) {
                o.dp.clip = 1;
                o.dp.noise = 0;
                o.dp.clip_quantile = 0.5;
              }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("in the clear")));
  EXPECT_THAT(Normalized([](AggregatorOptions& o) { o.secagg.bits = 40; }),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Normalized([](AggregatorOptions&) {}), IsOk());
}

TEST(SecureRounds, ARoundOfTwoIsNotMaskedAndItsMessagesAreRefused) {
  SecureRounds rounds(SecAggOptions{.enabled = true, .neighbours = 2});
  std::string why;
  rounds.Open(1, {0, 1}, 4, 1, kSecT0, &why);  // two clients: a threshold of 2 needs 3
  EXPECT_FALSE(rounds.active());
  EXPECT_THAT(why, HasSubstr("needs 3 at least"));
  v1::SecAggRequest r;
  r.set_round(1);
  EXPECT_THAT(rounds.Handle(r), StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace tern

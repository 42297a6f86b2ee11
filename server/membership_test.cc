#include "server/membership.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tern {
namespace {

class MembershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    topologies_ = NewBuiltinTopologyRegistry();
    SchedulerOptions o;
    o.heartbeat_interval = absl::Seconds(1);
    o.heartbeat_timeout = absl::Seconds(3);
    o.topology = "ring";
    auto m = Membership::Create(o, *topologies_);
    ASSERT_TRUE(m.ok()) << m.status();
    m_ = std::move(*m);
  }
  uint32_t Join(int64_t want, absl::Time now) {
    v1::MemberRegisterRequest r;
    r.set_run_id("tern");
    r.set_name("w");
    r.set_address("10.0.0.1:" + std::to_string(7000 + (want < 0 ? 0 : want)));
    r.set_worker_id(want);
    auto reply = m_->Register(r, now);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->worker_id() : 0;
  }
  absl::Status Beat(uint32_t id, absl::Time now, int64_t round = -1) {
    v1::HeartbeatRequest h;
    h.set_worker_id(id);
    h.set_round(round);
    return m_->Heartbeat(h, now).status();
  }
  std::set<uint32_t> Neighbours(uint32_t id, absl::Time now) {
    auto v = m_->GetView(id, 0, now);
    EXPECT_TRUE(v.ok()) << v.status();
    std::set<uint32_t> out;
    if (v.ok()) {
      for (const auto& n : v->neighbors()) out.insert(n.id());
    }
    return out;
  }

  std::unique_ptr<TopologyRegistry> topologies_;
  std::unique_ptr<Membership> m_;
  const absl::Time t0_ = absl::FromUnixSeconds(1000);
};

TEST_F(MembershipTest, ASilentWorkerIsDeclaredDeadAfterTheTimeoutAndTheRingIsRepaired) {
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Join(i, t0_), static_cast<uint32_t>(i));
  const uint64_t e0 = m_->epoch();
  EXPECT_EQ(Neighbours(1, t0_), (std::set<uint32_t>{0, 2}));
  EXPECT_EQ(Neighbours(3, t0_), (std::set<uint32_t>{2, 4}));
  // Worker 2 stops; the others heartbeat every second.
  for (int s = 1; s <= 3; ++s) {
    for (uint32_t id : {0u, 1u, 3u, 4u}) {
      ASSERT_TRUE(Beat(id, t0_ + absl::Seconds(s), 10 * s + id).ok());
    }
    EXPECT_TRUE(m_->Tick(t0_ + absl::Seconds(s)).empty()) << "at " << s << " s";
  }
  const auto dead = m_->Tick(t0_ + absl::Seconds(3) + absl::Milliseconds(20));
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].id(), 2u);
  EXPECT_NEAR(dead[0].detected_after_s(), 3.02, 1e-9);
  EXPECT_EQ(m_->epoch(), e0 + 1);
  const absl::Time t = t0_ + absl::Seconds(4);
  EXPECT_EQ(Neighbours(1, t), (std::set<uint32_t>{0, 3}));
  EXPECT_EQ(Neighbours(3, t), (std::set<uint32_t>{1, 4}));
  auto v = m_->GetView(3, 0, t);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->members_size(), 4);
  EXPECT_EQ(v->rank(), 2u);
  EXPECT_NEAR(v->self_weight() + v->neighbors(0).weight() + v->neighbors(1).weight(), 1.0, 1e-12);
  EXPECT_EQ(v->neighbors(1).address(), "10.0.0.1:7004");
  // The repaired graph applies past the furthest survivor's round (34) plus the lag (2) plus
  // two heartbeat intervals of the fastest member's progress (10 rounds a second).
  EXPECT_EQ(v->from_round(), 34 + 1 + 2 + 20);
  // The dead worker hears it must register again, and comes back with its id.
  EXPECT_EQ(Beat(2, t).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Join(2, t), 2u);
  EXPECT_EQ(Neighbours(3, t), (std::set<uint32_t>{2, 4}));
  EXPECT_EQ(m_->Members(t).failures_size(), 1);
}

// Rounds of a few milliseconds outrun heartbeats: with a fixed lag of 2 rounds a fast member
// would be hundreds of rounds past the switch when it hears of it, while a slow one is not, and
// the two would wait for each other's messages of different rounds.
TEST_F(MembershipTest, ANewEpochStartsPastWhereTheFastestMemberWillBeWhenItHearsOfIt) {
  for (int i = 0; i < 3; ++i) Join(i, t0_);
  // Member 0 runs 250 rounds a second, the others 5; each heartbeats every second.
  for (int s = 1; s <= 3; ++s) {
    ASSERT_TRUE(Beat(0, t0_ + absl::Seconds(s), 250 * s).ok());
    ASSERT_TRUE(Beat(1, t0_ + absl::Seconds(s), 5 * s).ok());
    ASSERT_TRUE(Beat(2, t0_ + absl::Seconds(s), 5 * s).ok());
  }
  ASSERT_EQ(m_->Tick(t0_ + absl::Seconds(3)).size(), 0u);
  const absl::Time t = t0_ + absl::Seconds(3) + absl::Milliseconds(500);
  ASSERT_TRUE(m_->Leave(2).ok());
  auto v = m_->GetView(0, 0, t);
  ASSERT_TRUE(v.ok()) << v.status();
  // The furthest round (750) + 1 + the lag (2) + two intervals at 250 rounds a second.
  EXPECT_EQ(v->from_round(), 750 + 1 + 2 + 500);
}

// A joiner's first move is a jump to where the group is (it takes the group's state), not its
// speed: the lag of the next epoch stays that of the members' real pace.
TEST_F(MembershipTest, AJoinersJumpToTheGroupsRoundIsNotTakenForSpeed) {
  for (int i = 0; i < 2; ++i) Join(i, t0_);
  for (int s = 1; s <= 3; ++s) {
    ASSERT_TRUE(Beat(0, t0_ + absl::Seconds(s), 10 * s).ok());
    ASSERT_TRUE(Beat(1, t0_ + absl::Seconds(s), 10 * s).ok());
  }
  Join(2, t0_ + absl::Seconds(3));
  ASSERT_TRUE(Beat(2, t0_ + absl::Seconds(4), 0).ok());   // registered, not started yet
  ASSERT_TRUE(Beat(2, t0_ + absl::Seconds(5), 40).ok());  // took the state of round 40
  ASSERT_TRUE(Beat(0, t0_ + absl::Seconds(5), 50).ok());
  ASSERT_TRUE(Beat(1, t0_ + absl::Seconds(5), 50).ok());
  ASSERT_TRUE(m_->Leave(1).ok());
  auto v = m_->GetView(0, 0, t0_ + absl::Seconds(5));
  ASSERT_TRUE(v.ok()) << v.status();
  // The furthest round (50) + 1 + the lag (2) + two intervals at 10 rounds a second.
  EXPECT_EQ(v->from_round(), 50 + 1 + 2 + 20);
}

// Two epochs between a member's heartbeats (two joins close together, each from its own round):
// the view lists the earlier ones too, so the member applies each where every other does.
TEST_F(MembershipTest, AViewListsTheEpochsBeforeItEachWithItsOwnFirstRound) {
  for (int i = 0; i < 2; ++i) Join(i, t0_);
  for (int s = 1; s <= 3; ++s) {
    ASSERT_TRUE(Beat(0, t0_ + absl::Seconds(s), 10 * s).ok());
    ASSERT_TRUE(Beat(1, t0_ + absl::Seconds(s), 10 * s).ok());
  }
  Join(2, t0_ + absl::Seconds(3));
  const uint64_t two = m_->epoch();
  ASSERT_TRUE(Beat(0, t0_ + absl::Seconds(4), 50).ok());
  Join(3, t0_ + absl::Seconds(4));
  auto v = m_->GetView(0, 0, t0_ + absl::Seconds(4));
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_GE(v->recent_size(), 2);
  const v1::EpochRecord& before = v->recent(v->recent_size() - 1);
  EXPECT_EQ(before.epoch(), two);
  EXPECT_EQ(std::vector<uint32_t>(before.members().begin(), before.members().end()),
            (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_LT(before.from_round(), v->from_round());
  EXPECT_EQ(v->epoch(), two + 1);
  for (int i = 1; i < v->recent_size(); ++i) {
    EXPECT_LT(v->recent(i - 1).epoch(), v->recent(i).epoch());
  }
}

TEST_F(MembershipTest, BarrierReleasesWhenEveryMemberArrivedOrTheMissingOneDies) {
  for (int i = 0; i < 3; ++i) Join(i, t0_);
  v1::BarrierRequest b;
  b.set_name("epoch-1");
  b.set_worker_id(0);
  auto r0 = m_->Barrier(b);
  ASSERT_TRUE(r0.ok());
  EXPECT_FALSE(r0->released());
  EXPECT_EQ(r0->waiting_for(), 2u);
  b.set_worker_id(1);
  auto r1 = m_->Barrier(b);
  ASSERT_TRUE(r1.ok());
  EXPECT_FALSE(r1->released());
  // Worker 2 dies instead of arriving: the barrier releases without it.
  ASSERT_TRUE(Beat(0, t0_ + absl::Seconds(3)).ok());
  ASSERT_TRUE(Beat(1, t0_ + absl::Seconds(3)).ok());
  ASSERT_EQ(m_->Tick(t0_ + absl::Seconds(4)).size(), 1u);
  v1::BarrierRequest again = b;
  again.set_generation(r0->generation());
  auto r2 = m_->Barrier(again);
  ASSERT_TRUE(r2.ok());
  EXPECT_TRUE(r2->released());
  // The next use of the name is a new generation that needs both survivors again.
  b.set_worker_id(0);
  auto r3 = m_->Barrier(b);
  ASSERT_TRUE(r3.ok());
  EXPECT_FALSE(r3->released());
  EXPECT_EQ(r3->generation(), r0->generation() + 1);
  b.set_worker_id(1);
  auto r4 = m_->Barrier(b);
  ASSERT_TRUE(r4.ok());
  EXPECT_TRUE(r4->released());
}

TEST_F(MembershipTest, AMemberIdBelongsToWhoRegisteredIt) {
  v1::MemberRegisterRequest r;
  r.set_run_id("tern");
  r.set_worker_id(3);
  ASSERT_TRUE(m_->Register(r, t0_, "worker-3").ok());
  EXPECT_EQ(m_->Register(r, t0_, "worker-4").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(m_->CheckCaller(3, "worker-3").ok());
  EXPECT_EQ(m_->CheckCaller(3, "worker-4").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(m_->Register(r, t0_ + absl::Seconds(1), "worker-3").ok())
      << "a restart takes it back";
}

TEST_F(MembershipTest, UnderMemberNamesACallersNameIsItsIdAndNoOtherNameMayRegister) {
  SchedulerOptions o;
  o.member_names = {"worker-*"};
  auto named = Membership::Create(o, *topologies_);
  ASSERT_TRUE(named.ok()) << named.status();
  v1::MemberRegisterRequest r;
  r.set_run_id("tern");
  r.set_worker_id(-1);
  auto two = (*named)->Register(r, t0_, "worker-2");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->worker_id(), 2u);  // its name's id, not the first free one
  r.set_worker_id(1);
  const absl::Status as_one = (*named)->Register(r, t0_, "worker-2").status();
  EXPECT_EQ(as_one.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(as_one.message().find("its name makes it worker 2"), absl::string_view::npos);
  EXPECT_EQ((*named)->Register(r, t0_, "client").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ((*named)->Register(r, t0_, "worker-x").status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE((*named)->Register(r, t0_, "worker-1").ok());
}

TEST_F(MembershipTest, RequestsFromStrangersAndBadInputAreRefused) {
  v1::MemberRegisterRequest r;
  r.set_run_id("other");
  EXPECT_EQ(m_->Register(r, t0_).status().code(), absl::StatusCode::kFailedPrecondition);
  r.set_run_id("tern");
  r.set_worker_id(1 << 20);
  EXPECT_EQ(m_->Register(r, t0_).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m_->GetView(7, 0, t0_).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(m_->Leave(7).status().code(), absl::StatusCode::kNotFound);
  const uint32_t id = Join(-1, t0_);
  v1::BarrierRequest b;
  b.set_worker_id(id);
  EXPECT_EQ(m_->Barrier(b).status().code(), absl::StatusCode::kInvalidArgument);  // no name
  b.set_name("x");
  b.set_generation(99);
  EXPECT_EQ(m_->Barrier(b).status().code(), absl::StatusCode::kInvalidArgument);
  SchedulerOptions bad;
  bad.heartbeat_timeout = bad.heartbeat_interval;
  EXPECT_FALSE(Membership::Create(bad, *topologies_).ok());
  bad = SchedulerOptions();
  bad.topology = "moebius";
  EXPECT_FALSE(Membership::Create(bad, *topologies_).ok());
}

TEST_F(MembershipTest, NewWorkersTakeTheLowestFreeIdAndEveryChangeIsAnEpoch) {
  EXPECT_EQ(Join(-1, t0_), 0u);
  EXPECT_EQ(Join(-1, t0_), 1u);
  EXPECT_EQ(Join(-1, t0_), 2u);
  const uint64_t e = m_->epoch();
  ASSERT_TRUE(m_->Leave(1).ok());
  EXPECT_EQ(m_->epoch(), e + 1);
  EXPECT_EQ(Join(-1, t0_), 1u);
  EXPECT_EQ(m_->epoch(), e + 2);
}

TEST_F(MembershipTest, AnIdIsAssignedBelowTheRunsSizeAndRefusedOnceEveryOneIsTaken) {
  v1::MemberRegisterRequest r;
  r.set_run_id("tern");
  r.set_worker_id(-1);
  r.set_ids_below(2);
  ASSERT_EQ(Join(0, t0_), 0u);
  auto one = m_->Register(r, t0_);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->worker_id(), 1u);
  const uint64_t e = m_->epoch();
  const absl::Status full = m_->Register(r, t0_).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find("below 2"), std::string::npos) << full;
  EXPECT_EQ(m_->epoch(), e) << "a refused registration is no epoch";
  EXPECT_EQ(m_->Members(t0_).members_size(), 2);
  // A member declared dead frees its id for the next newcomer.
  ASSERT_TRUE(Beat(0, t0_ + absl::Seconds(2)).ok());
  EXPECT_EQ(m_->Tick(t0_ + absl::Seconds(4)).size(), 1u);
  auto again = m_->Register(r, t0_ + absl::Seconds(4));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->worker_id(), 1u);
}

TEST_F(MembershipTest, AMemberRegisteringAgainWithItsIdMovesToItsNewAddress) {
  ASSERT_EQ(Join(-1, t0_), 0u);
  v1::MemberRegisterRequest r;
  r.set_run_id("tern");
  r.set_worker_id(0);
  r.set_address("10.0.0.9:7100");
  const uint64_t e = m_->epoch();
  ASSERT_TRUE(m_->Register(r, t0_).ok());
  EXPECT_EQ(m_->epoch(), e + 1) << "peers learn of the move with the next epoch";
  const v1::MembersReply members = m_->Members(t0_);
  ASSERT_EQ(members.members_size(), 1);
  EXPECT_EQ(members.members(0).address(), "10.0.0.9:7100");
}

// An elastic run starts once as many members as asked for have addresses: those, and only
// those, are its first epoch. A member still without an address is not in it, one joining later
// is not either, and the start stays as it was through later joins, leaves and deaths.
TEST_F(MembershipTest, AnElasticRunStartsWithTheMembersThatHaveAddressesOnceThereAreEnough) {
  const auto join = [&](const std::string& address) {
    v1::MemberRegisterRequest r;
    r.set_run_id("tern");
    r.set_worker_id(-1);
    r.set_ids_below(4);
    r.set_start_with(2);
    r.set_address(address);
    auto reply = m_->Register(r, t0_);
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->worker_id() : 99u;
  };
  EXPECT_EQ(join("10.0.0.1:7000"), 0u);
  EXPECT_EQ(join(""), 1u);  // registered for its id; its address comes once it listens
  EXPECT_FALSE(m_->start().has_value()) << "one member with an address of the two asked for";
  EXPECT_FALSE(m_->Members(t0_).has_start());
  EXPECT_EQ(join("10.0.0.3:7000"), 2u);
  ASSERT_TRUE(m_->start().has_value());
  const v1::RunStart start = *m_->start();
  EXPECT_EQ(start.epoch(), m_->epoch());
  EXPECT_EQ(std::vector<uint32_t>(start.members().begin(), start.members().end()),
            (std::vector<uint32_t>{0, 2}));
  auto view = m_->GetView(2, 0, t0_);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->start().SerializeAsString(), start.SerializeAsString());
  // Later members, a leave and a death leave the start as it was.
  EXPECT_EQ(join("10.0.0.4:7000"), 3u);
  ASSERT_TRUE(m_->Leave(3).ok());
  ASSERT_TRUE(Beat(0, t0_ + absl::Seconds(2)).ok());
  ASSERT_TRUE(Beat(2, t0_ + absl::Seconds(2)).ok());
  EXPECT_EQ(m_->Tick(t0_ + absl::Seconds(4)).size(), 1u);  // 1, silent since t0
  EXPECT_EQ(m_->Members(t0_).start().SerializeAsString(), start.SerializeAsString());
  // Beyond the run's size: refused, and the run goes on.
  EXPECT_EQ(join("10.0.0.5:7000"), 1u);
  EXPECT_EQ(join("10.0.0.6:7000"), 3u);
  v1::MemberRegisterRequest extra;
  extra.set_run_id("tern");
  extra.set_worker_id(-1);
  extra.set_ids_below(4);
  extra.set_start_with(2);
  const absl::Status full = m_->Register(extra, t0_).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(m_->Members(t0_).members_size(), 4);
}

}  // namespace
}  // namespace tern

#include "worker/state_fetch.h"

#include <atomic>
#include <map>
#include <set>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

constexpr uint64_t kN = 1000;

GroupState AState(int64_t step, float base) {
  GroupState s;
  s.step = step;
  for (uint64_t i = 0; i < kN; ++i) {
    s.theta.push_back(base + static_cast<float>(i));
    s.momentum.push_back(base - static_cast<float>(i));
  }
  return s;
}

// Peers that answer Gossip.State from a state each (or a refusal), counting what each sent.
class Peers : public PeerTransport {
 public:
  void Send(int, Chunks, absl::Time, Reach, std::function<void(absl::Status)> done) override {
    done(absl::UnimplementedError("not here"));
  }
  absl::StatusOr<v1::TensorBundle> FetchState(int to, const std::string& run_id, int64_t min_step,
                                              uint32_t slice, uint32_t slices,
                                              absl::Time) override {
    absl::MutexLock lock(&mu);
    ++asked[to];
    if (auto it = refusal.find(to); it != refusal.end()) return it->second;
    if (not_yet[to] > 0) {
      --not_yet[to];
      return absl::UnavailableError(
          absl::StrCat("no state after step ", min_step, " or later yet; ask again"));
    }
    if (advances.count(to) > 0 && state.at(to).state.step < min_step) {
      // A worker asked for a later step than it handed over: it publishes at the end of its
      // next one, the group having moved on meanwhile (another outer step: another θ).
      GroupState later = AState(min_step + 100, 100.0f + static_cast<float>(min_step));
      const uint32_t crc = GroupStateCrc(later);
      state[to] = PublishedState{.state = std::move(later), .crc = crc};
    }
    const PublishedState& s = state.at(to);
    if (s.state.step < min_step) {
      return absl::UnavailableError("no state after that step yet; ask again");
    }
    ++slices_sent[to];
    absl::StatusOr<v1::TensorBundle> b = GroupStateToBundle(s, run_id, to, slice, slices);
    if (b.ok() && corrupt.count(to) > 0) {
      std::string* p = b->mutable_tensors(0)->mutable_tensor()->mutable_payload();
      p->resize(p->size() - 1);
    }
    return b;
  }

  void Set(int peer, GroupState s) {
    const uint32_t crc = GroupStateCrc(s);
    absl::MutexLock lock(&mu);
    state[peer] = PublishedState{.state = std::move(s), .crc = crc};
  }

  absl::Mutex mu;
  std::map<int, PublishedState> state ABSL_GUARDED_BY(mu);
  std::map<int, absl::Status> refusal ABSL_GUARDED_BY(mu);
  std::map<int, int> not_yet ABSL_GUARDED_BY(mu);  // "ask again" answers before the state
  std::set<int> corrupt ABSL_GUARDED_BY(mu);
  std::set<int> advances ABSL_GUARDED_BY(mu);  // asked for a later step, they move on
  std::map<int, int> asked ABSL_GUARDED_BY(mu);
  std::map<int, int> slices_sent ABSL_GUARDED_BY(mu);
};

class StateFetchTest : public ::testing::Test {
 protected:
  StateFetchOptions Options(bool one_state = true) {
    return {.run_id = "run",
            .num_params = kN,
            .codecs = codecs_.get(),
            .one_state = one_state,
            .poll = absl::Milliseconds(1),
            .straggler = absl::Milliseconds(200)};
  }
  absl::StatusOr<FetchedState> Fetch(std::vector<int> sources, int64_t min_step,
                                     bool one_state = true) {
    return FetchStateSlices(peers_, Options(one_state), std::move(sources), min_step,
                            absl::Now() + absl::Seconds(10));
  }

  std::unique_ptr<CodecRegistry> codecs_ = NewBuiltinCodecRegistry();
  Peers peers_;
};

TEST_F(StateFetchTest, EachSourceSendsOneSliceAndTheyMakeTheState) {
  for (int p : {1, 2, 3}) peers_.Set(p, AState(40, 7.0f));
  auto got = Fetch({3, 1, 2}, 40);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->state.theta, AState(40, 7.0f).theta);
  EXPECT_EQ(got->state.momentum, AState(40, 7.0f).momentum);
  EXPECT_EQ(got->state.step, 40);
  EXPECT_THAT(got->sources, ElementsAre(3, 1, 2));
  absl::MutexLock lock(&peers_.mu);
  EXPECT_EQ(peers_.slices_sent[1], 1);
  EXPECT_EQ(peers_.slices_sent[2], 1);
  EXPECT_EQ(peers_.slices_sent[3], 1);
  // Each slice a third of 2 x 1000 values and its framing: together about the state's size once.
  EXPECT_GT(got->bytes, 2 * kN * sizeof(float));
  EXPECT_LT(got->bytes, 2 * kN * sizeof(float) + 1000);
}

TEST_F(StateFetchTest, ASourceThatIsGoneOrSendsBadBytesLosesItsSliceToTheOthers) {
  for (int p : {1, 2, 3}) peers_.Set(p, AState(40, 7.0f));
  {
    absl::MutexLock lock(&peers_.mu);
    peers_.refusal[2] = absl::UnavailableError("connection refused");
    peers_.corrupt.insert(3);
  }
  auto got = Fetch({1, 2, 3}, 40);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->state.theta, AState(40, 7.0f).theta);
  EXPECT_THAT(got->sources, ElementsAre(1, 1, 1));
}

TEST_F(StateFetchTest, EverySourceGoneIsUnavailableForTheCallerToFindOthers) {
  {
    absl::MutexLock lock(&peers_.mu);
    peers_.refusal[1] = absl::UnavailableError("connection refused");
    peers_.refusal[2] = absl::UnavailableError("connection refused");
  }
  EXPECT_THAT(Fetch({1, 2}, 40).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("connection refused")));
}

TEST_F(StateFetchTest, ARefusalEverySourceWouldGiveEndsTheFetch) {
  for (int p : {1, 2}) peers_.Set(p, AState(40, 7.0f));
  {
    absl::MutexLock lock(&peers_.mu);
    peers_.refusal[2] = absl::OutOfRangeError("more than 65536 steps ahead");
  }
  EXPECT_THAT(Fetch({1, 2}, 40).status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("worker 2: more than")));
}

// A source that handed over after another step (it had published a later state for another
// joiner, or was past the step asked for): the state most slices are of is kept, the others
// asked again of its sources; between as many, the newest.
TEST_F(StateFetchTest, SlicesOfTwoStatesAreTakenAgainAsTheStateMostOfThemAreOf) {
  peers_.Set(1, AState(40, 7.0f));
  peers_.Set(2, AState(40, 7.0f));
  peers_.Set(3, AState(45, 9.0f));
  auto got = Fetch({1, 2, 3}, 40);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->state.step, 40);
  EXPECT_EQ(got->state.theta, AState(40, 7.0f).theta);
  EXPECT_THAT(got->sources, ElementsAre(1, 2, 1));
  got = Fetch({1, 3}, 40);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->state.step, 45);
  EXPECT_EQ(got->state.theta, AState(45, 9.0f).theta);
  EXPECT_THAT(got->sources, ElementsAre(3, 3));
  // The state most are of, after two steps of one round (the same bytes): asked again after its
  // latest step of the peer that handed it over then, which still holds it; the other, asked
  // for that later step, would have moved on to the next round's state.
  peers_.Set(1, AState(40, 7.0f));
  peers_.Set(2, AState(44, 7.0f));
  peers_.Set(3, AState(49, 9.0f));
  {
    absl::MutexLock lock(&peers_.mu);
    peers_.advances = {1, 2, 3};
  }
  got = Fetch({2, 3, 1}, 40);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->state.step, 44);
  EXPECT_EQ(got->state.theta, AState(44, 7.0f).theta);
  EXPECT_THAT(got->sources, ElementsAre(2, 2, 1));
  // A gossip joiner takes its peers' models as they are: a mosaic, each slice a peer's own.
  auto mosaic = Fetch({1, 3}, 40, /*one_state=*/false);
  ASSERT_THAT(mosaic, IsOk());
  EXPECT_EQ(mosaic->state.theta[0], 7.0f);
  EXPECT_EQ(mosaic->state.theta[kN - 1], 9.0f + static_cast<float>(kN - 1));
  EXPECT_EQ(mosaic->state.step, 49);
}

TEST_F(StateFetchTest, ASourceNotThereYetIsWaitedForAndAStragglerLosesItsSlice) {
  for (int p : {1, 2}) peers_.Set(p, AState(40, 7.0f));
  {
    absl::MutexLock lock(&peers_.mu);
    peers_.not_yet[1] = 3;  // a step behind: three polls
  }
  auto got = Fetch({1, 2}, 40);
  ASSERT_THAT(got, IsOk());
  EXPECT_THAT(got->sources, ElementsAre(1, 2));
  {
    absl::MutexLock lock(&peers_.mu);
    peers_.not_yet[2] = 1 << 30;  // never there
  }
  got = Fetch({1, 2}, 40);
  ASSERT_THAT(got, IsOk());
  EXPECT_THAT(got->sources, ElementsAre(1, 1));
  EXPECT_EQ(got->state.theta, AState(40, 7.0f).theta);
}

TEST_F(StateFetchTest, NoStateByTheDeadlineIsDeadlineExceeded) {
  peers_.Set(1, AState(10, 7.0f));
  EXPECT_THAT(
      FetchStateSlices(peers_, Options(), {1}, 40, absl::Now() + absl::Milliseconds(50)).status(),
      StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("after step 40")));
}

// A worker shut down while its sources have no state yet stops asking: CANCELLED at once, not
// DeadlineExceeded at the rejoin's deadline (minutes), which its shutdown would wait for.
TEST_F(StateFetchTest, AFetchEndsCancelledOnceTheWorkerIsStopping) {
  for (int p : {1, 2}) peers_.Set(p, AState(10, 7.0f));
  std::atomic<int> asked{0};
  StateFetchOptions o = Options();
  o.stopped = [&asked] { return asked.fetch_add(1) >= 6; };
  const absl::Time t0 = absl::Now();
  EXPECT_THAT(FetchStateSlices(peers_, o, {1, 2}, 40, absl::Now() + absl::Seconds(60)).status(),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr("shutting down")));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(30));
}

TEST_F(StateFetchTest, MoreSourcesThanValuesTakeOneValueEach) {
  StateFetchOptions o = Options();
  o.num_params = 2;
  GroupState tiny;
  tiny.step = 3;
  tiny.theta = {1.0f, 2.0f};
  for (int p : {1, 2, 3}) peers_.Set(p, tiny);
  auto got = FetchStateSlices(peers_, o, {1, 2, 3}, 3, absl::Now() + absl::Seconds(5));
  ASSERT_THAT(got, IsOk());
  EXPECT_THAT(got->state.theta, ElementsAre(1.0f, 2.0f));
  EXPECT_THAT(got->sources, UnorderedElementsAre(1, 2));
}

PeerTransport::Position At(int64_t next_step, int64_t rounds_mixed) {
  PeerTransport::Position p;
  p.next_step = next_step;
  p.rounds_mixed = rounds_mixed;
  return p;
}

// Worker 2, admitted from round 4 with workers 0 and 1, restarted at round 40: worker 3,
// admitted later and mixing since, is there (it was taken for a newcomer and not awaited, and a
// round could close without it on worker 2 and with it on the others); worker 4, which answered
// without an exchange mixed, is still taking the state, and worker 5 did not answer (admitted
// after the question): both newcomers.
TEST(MembersAlreadyThere, ThoseThatMixedAndTheMembersThenLessAnyStillTakingTheState) {
  const std::vector<absl::StatusOr<PeerTransport::Position>> positions = {
      At(40, 9), At(40, 9), absl::UnavailableError("me"),
      At(40, 6), At(40, 0), absl::UnavailableError("no address yet")};
  EXPECT_THAT(MembersAlreadyThere({0, 1, 2}, positions, 2), ElementsAre(0, 1, 2, 3));
  // A member then that is down now is still one (the round deadline finds it out, as for any).
  std::vector<absl::StatusOr<PeerTransport::Position>> one_down = positions;
  one_down[1] = absl::UnavailableError("down");
  EXPECT_THAT(MembersAlreadyThere({0, 1, 2}, one_down, 2), ElementsAre(0, 1, 2, 3));
  // A member then that answered without an exchange is taking the state, like worker 4.
  std::vector<absl::StatusOr<PeerTransport::Position>> restarted = positions;
  restarted[1] = At(40, 0);
  EXPECT_THAT(MembersAlreadyThere({0, 1, 2}, restarted, 2), ElementsAre(0, 2, 3));
}

// Before any exchange is mixed (the run just started), every member then is there.
TEST(MembersAlreadyThere, BeforeAnyExchangeEveryMemberThenIsThere) {
  const std::vector<absl::StatusOr<PeerTransport::Position>> positions = {At(3, 0), At(3, 0),
                                                                          At(0, 0)};
  EXPECT_THAT(MembersAlreadyThere({0, 1}, positions, 2), ElementsAre(0, 1, 2));
}

}  // namespace
}  // namespace tern

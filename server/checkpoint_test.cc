// The aggregator's durable state under damage (docs/server.md, "Checkpoints and restarts"): a
// restart either replays every acknowledged update exactly or refuses to start with DATA_LOSS
// naming the damage; an update the log could not take is not counted.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/record_log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/aggregator.h"
#include "server/aggregator_fixture.h"
#include "server/state_store.h"
#include "server/update_log.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::tern::testing::ValueOrFailure;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testing_fixture::AggregatorTest;
using testing_fixture::kT0;
using testing_fixture::kX0;
using testing_fixture::ReadAll;
using testing_fixture::TempPath;

constexpr int kClients = 6;
const absl::Time kLater = kT0 + absl::Minutes(1);

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::trunc | std::ios::binary) << bytes;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

class CheckpointTest : public AggregatorTest {
 protected:
  CheckpointTest() {
    options_.policy.clients_per_round = kClients;
    options_.policy.min_replies = kClients;
    options_.checkpoint_path = TempPath("server.ckpt");
    log_path_ = UpdateLog::PathFor(options_.checkpoint_path);
  }

  // A run with round 1 open and clients 0-4's updates (c + 1 everywhere) acknowledged; returns
  // the snapshot's and the log's bytes as the killed server left them.
  std::pair<std::string, std::string> FiveAcknowledged() {
    auto a = Start(kClients);
    EXPECT_NE(a, nullptr);
    if (a == nullptr) return {};
    for (uint32_t c = 0; c < 5; ++c) {
      EXPECT_EQ(ValueOrFailure(Push(*a, c, 1, 1, std::vector<float>(9, c + 1.0f))).verdict(),
                v1::UpdateReply::ACCEPTED);
    }
    return {ReadAll(options_.checkpoint_path), ReadAll(log_path_)};
  }

  // Restarts on `snapshot` and `log`: OK only when the five updates came back exactly (the last
  // client's update then closes the round on the mean of all six), else its error.
  absl::Status RestartOn(const std::string& snapshot, const std::string& log) {
    WriteAll(options_.checkpoint_path, snapshot);
    WriteAll(log_path_, log);
    auto b = Aggregator::Create(options_, &registries_, kLater);
    if (!b.ok()) return b.status();
    EXPECT_EQ((*b)->Status(kLater).updates_accepted(), 5u);
    EXPECT_THAT(Push(**b, 5, 1, 1, std::vector<float>(9, 6.0f), kLater), IsOk());
    EXPECT_THAT((*b)->Tick(kLater), IsOk());
    std::vector<float> want = kX0;
    for (float& v : want) v += 3.5f;  // the mean of 1..6
    EXPECT_THAT(ModelOf(**b), ElementsAreArray(want));
    return absl::OkStatus();
  }

  std::string log_path_;
};

TEST_F(CheckpointTest, AnyBitFlippedInTheSnapshotOrTheLogIsDataLossNeverFewerUpdates) {
  const auto [snapshot, log] = FiveAcknowledged();
  ASSERT_FALSE(snapshot.empty());
  ASSERT_FALSE(log.empty());
  TERN_ASSERT_OK(RestartOn(snapshot, log));
  for (size_t i = 0; i < snapshot.size(); ++i) {
    std::string damaged = snapshot;
    damaged[i] ^= static_cast<char>(1 << (i % 8));
    EXPECT_THAT(RestartOn(damaged, log),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(options_.checkpoint_path)))
        << "snapshot byte " << i;
  }
  for (size_t i = 0; i < log.size(); ++i) {
    std::string damaged = log;
    damaged[i] ^= static_cast<char>(1 << (i % 8));
    EXPECT_THAT(RestartOn(snapshot, damaged),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(log_path_)))
        << "log byte " << i;
  }
}

TEST_F(CheckpointTest, ASnapshotCutShortOrExtendedIsDataLoss) {
  const auto [snapshot, log] = FiveAcknowledged();
  for (size_t cut = 0; cut < snapshot.size(); ++cut) {
    EXPECT_THAT(RestartOn(snapshot.substr(0, cut), log), StatusIs(absl::StatusCode::kDataLoss))
        << "cut at " << cut;
  }
  std::string extended = snapshot;
  extended.push_back('x');
  EXPECT_THAT(RestartOn(extended, log),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated or extended")));
}

// A log cut short anywhere, at a record boundary too, is DATA_LOSS: the length file beside it
// says how much was acknowledged. Only bytes past that, an append a crash interrupted, are a
// torn tail; a log without the length file (an older tern's) is read by the old rule.
TEST_F(CheckpointTest, ALogCutShortAnywhereIsDataLossAndOnlyAnUnacknowledgedTailIsTorn) {
  const auto [snapshot, log] = FiveAcknowledged();
  ASSERT_TRUE(Exists(LogLengthPath(log_path_)));
  for (size_t cut = 0; cut < log.size(); ++cut) {
    EXPECT_THAT(RestartOn(snapshot, log.substr(0, cut)),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("acknowledged")))
        << "cut at " << cut;
  }
  TERN_EXPECT_OK(RestartOn(snapshot, log));
  // A sixth append cut short by a crash: never acknowledged, dropped; the five come back.
  const std::string sixth = log.substr(8, 30);
  TERN_EXPECT_OK(RestartOn(snapshot, log + sixth));

  // Without the length file every cut replays the whole records before it.
  const internal::AggregatorCheckpoint ckpt =
      ValueOrFailure(StateStore::ParseSnapshot(snapshot, nullptr));
  ASSERT_EQ(std::remove(LogLengthPath(log_path_).c_str()), 0);
  size_t last_whole = 0;
  for (size_t cut = 8; cut <= log.size(); ++cut) {
    WriteAll(log_path_, log.substr(0, cut));
    auto read = UpdateLog::Read(options_.checkpoint_path, ckpt.generation());
    ASSERT_THAT(read, IsOk()) << cut;
    EXPECT_GE(read->updates.size(), last_whole);
    last_whole = read->updates.size();
    EXPECT_LT(read->torn_bytes, cut);
  }
  EXPECT_EQ(last_whole, 5u);
}

TEST_F(CheckpointTest, AMissingLogOrSnapshotIsDataLossUnlessToldToStartFresh) {
  const auto [snapshot, log] = FiveAcknowledged();
  // The log deleted: the five updates would be gone.
  WriteAll(options_.checkpoint_path, snapshot);
  ASSERT_EQ(std::remove(log_path_.c_str()), 0);
  EXPECT_THAT(Aggregator::Create(options_, &registries_, kLater).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("is missing")));
  // The snapshot deleted, the log kept: not a new run.
  ASSERT_EQ(std::remove(options_.checkpoint_path.c_str()), 0);
  WriteAll(log_path_, log);
  EXPECT_THAT(Aggregator::Create(options_, &registries_, kLater).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("holds 5 records")));
  // On the operator's word: the files moved aside, a new run.
  options_.fresh_start_if_damaged = true;
  auto fresh = Aggregator::Create(options_, &registries_, kLater);
  ASSERT_THAT(fresh, IsOk());
  EXPECT_EQ((*fresh)->Status(kLater).updates_accepted(), 0u);
  EXPECT_TRUE((*fresh)->layout().empty());
  EXPECT_FALSE(Exists(log_path_));
}

TEST_F(CheckpointTest, WhatVerifySaysOfAGoodCheckpoint) {
  FiveAcknowledged();
  StateStore store(options_.checkpoint_path);
  auto saved = store.Read();
  ASSERT_THAT(saved, IsOk());
  ASSERT_TRUE(saved->has_value());
  const std::string says = store.Describe(**saved);
  EXPECT_THAT(says, HasSubstr("checksum good"));
  EXPECT_THAT(says, HasSubstr("5 updates to replay"));
  EXPECT_THAT(says, HasSubstr("bytes acknowledged there"));
}

// Disk full: the process may write no file past the log's current size (RLIMIT_FSIZE).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead
    getrlimit(RLIMIT_FSIZE, &old_);
    rlimit r = old_;
    r.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &r);
  }
  ~FileSizeLimit() { Lift(); }
  void Lift() { setrlimit(RLIMIT_FSIZE, &old_); }

 private:
  rlimit old_;
};

TEST_F(CheckpointTest, AnUpdateTheLogCannotTakeIsNotCountedAndMaySendAgain) {
  auto a = Start(kClients);
  ASSERT_NE(a, nullptr);
  for (uint32_t c = 0; c < 3; ++c) {
    ASSERT_THAT(Push(*a, c, 1, 1, std::vector<float>(9, c + 1.0f)), IsOk());
  }
  {
    FileSizeLimit full(static_cast<rlim_t>(ReadAll(log_path_).size()));
    EXPECT_THAT(Push(*a, 3, 1, 1, std::vector<float>(9, 4.0f)),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("not counted")));
    const v1::ServerStatus st = a->Status(kT0);
    EXPECT_EQ(st.updates_accepted(), 3u);
    EXPECT_TRUE(st.round_open());
    // Its reply slot is free again: the client is still asked for its update.
    EXPECT_EQ(ValueOrFailure(a->Fetch(3, kT0)).task.kind(), v1::Task::TRAIN);
    full.Lift();
    // Room again: a retry is logged (the first may still meet the broken log and start a
    // fresh one).
    absl::StatusOr<v1::UpdateReply> retry = Push(*a, 3, 1, 1, std::vector<float>(9, 4.0f));
    if (!retry.ok()) retry = Push(*a, 3, 1, 1, std::vector<float>(9, 4.0f));
    ASSERT_THAT(retry, IsOk());
  }
  for (uint32_t c = 4; c < kClients; ++c) {
    ASSERT_THAT(Push(*a, c, 1, 1, std::vector<float>(9, c + 1.0f)), IsOk());
  }
  ASSERT_THAT(a->Tick(kT0), IsOk());
  const v1::ServerStatus st = a->Status(kT0);
  EXPECT_EQ(st.round(), 1u);
  EXPECT_EQ(st.updates_accepted(), 6u);
  EXPECT_EQ(st.last_round_updates(), 6u);
  std::vector<float> want = kX0;
  for (float& v : want) v += 3.5f;
  EXPECT_THAT(ModelOf(*a), ElementsAreArray(want));
  a.reset();
  // And what is on disk says the same.
  auto b = Aggregator::Create(options_, &registries_, kLater);
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ((*b)->Status(kLater).round(), 1u);
  EXPECT_THAT(ModelOf(**b), ElementsAreArray(want));
}

}  // namespace
}  // namespace tern

// The aggregator's rooms alone: its clients (ClientBook), its published models (ModelHistory)
// and its durable state (StateStore).

#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/aggregator_fixture.h"
#include "server/client_book.h"
#include "server/model_history.h"
#include "server/state_store.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_fixture::kT0;
using testing_fixture::TempPath;

TEST(ClientBook, AnIdIsBoundToWhoJoinedAndOnlyTheyTakeItBackOrActInItsName) {
  ClientBook book(absl::Seconds(30));
  absl::StatusOr<uint32_t> a = book.Join(-1, "alice", "a", 10, kT0);
  absl::StatusOr<uint32_t> b = book.Join(-1, "bob", "b", 20, kT0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(*b, 1u);
  TERN_EXPECT_OK(book.CheckCaller(0, "alice"));
  EXPECT_THAT(book.CheckCaller(0, "bob"), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(book.CheckCaller(7, "bob"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(book.Join(0, "bob", "b", 20, kT0).status(),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("joined as 'alice'")));
  EXPECT_EQ(*book.Join(0, "alice", "a", 10, kT0), 0u);  // its own id back
  EXPECT_EQ(*book.Join(9, "carol", "c", 5, kT0), 2u);   // an id nobody had: a new one
  // An id joined without credentials goes to the first authenticated caller taking it back.
  ASSERT_EQ(*book.Join(-1, "", "anon", 1, kT0), 3u);
  EXPECT_EQ(*book.Join(3, "dave", "d", 1, kT0), 3u);
  EXPECT_THAT(book.CheckCaller(3, ""), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(book.size(), 4u);
}

TEST(ClientBook, AClientIsAvailableUntilItLeavesOrGoesSilentForTheTimeout) {
  ClientBook book(absl::Seconds(30));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(book.Join(-1, "", "c", 1, kT0).ok());
  TERN_ASSERT_OK(book.Heard(1, kT0 + absl::Seconds(20)));
  TERN_ASSERT_OK(book.Leave(2));
  EXPECT_THAT(book.Available(kT0 + absl::Seconds(25)), ElementsAre(0, 1));
  EXPECT_THAT(book.Available(kT0 + absl::Seconds(45)), ElementsAre(1));
  EXPECT_EQ(book.CountAvailable(kT0 + absl::Seconds(60)), 0);
  book.HeardAll(kT0 + absl::Seconds(60));
  EXPECT_THAT(book.Available(kT0 + absl::Seconds(61)), ElementsAre(0, 1));  // not the one left
  EXPECT_THAT(book.Heard(5, kT0), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(book.Leave(5), StatusIs(absl::StatusCode::kNotFound));
}

TEST(ClientBook, ASavedBookRestoresWithItsBindingsAndWhoLeft) {
  ClientBook book(absl::Seconds(30));
  ASSERT_TRUE(book.Join(-1, "alice", "a", 10, kT0).ok());
  ASSERT_TRUE(book.Join(-1, "bob", "b", 20, kT0).ok());
  TERN_ASSERT_OK(book.Leave(1));
  internal::AggregatorCheckpoint ckpt;
  book.Save(&ckpt);
  ClientBook back(absl::Seconds(30));
  back.Restore(ckpt);
  back.HeardAll(kT0);
  EXPECT_EQ(back.size(), 2u);
  TERN_EXPECT_OK(back.CheckCaller(1, "bob"));
  EXPECT_THAT(back.CheckCaller(0, "bob"), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(back.Available(kT0), ElementsAre(0));
}

TEST(ClientBook, ClientsThatLeftOrWentSilentAreForgottenAndTheirIdsNeverGivenAgain) {
  ClientBook book(absl::Seconds(30));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(book.Join(-1, "", "c", 1, kT0).ok());
  TERN_ASSERT_OK(book.Leave(0));
  TERN_ASSERT_OK(book.Heard(1, kT0 + absl::Minutes(50)));
  TERN_ASSERT_OK(book.Leave(3));
  // At kT0 + 1 h: 0 and 3 left, 2 silent for an hour; 1 was heard 10 minutes ago. 3 is in the
  // open round: kept until it closes.
  EXPECT_EQ(book.Forget(kT0 + absl::Minutes(61), absl::Hours(1), {3}), 2u);
  EXPECT_EQ(book.size(), 2u);
  EXPECT_TRUE(book.Has(1) && book.Has(3) && !book.Has(0) && !book.Has(2));
  // The highest id was forgotten too, yet a newcomer gets a new one, also after a restore.
  EXPECT_EQ(book.Forget(kT0 + absl::Minutes(61), absl::Hours(1), {}), 1u);
  EXPECT_EQ(*book.Join(-1, "", "new", 1, kT0), 4u);
  internal::AggregatorCheckpoint ckpt;
  book.Save(&ckpt);
  ClientBook back(absl::Seconds(30));
  back.Restore(ckpt);
  EXPECT_EQ(*back.Join(2, "", "old", 1, kT0), 5u);  // a forgotten id asked back: a new one
}

KeptModel ModelOf(int64_t round) {
  KeptModel m;
  m.round = round;
  m.bundle = std::make_shared<v1::TensorBundle>();
  return m;
}

TEST(ModelHistory, KeepsTheNewestModelsAndTheCrcsAClientMayStillCatchUpFrom) {
  ModelHistory h(/*keep_models=*/2, /*keep_crcs=*/3);
  EXPECT_TRUE(h.empty());
  EXPECT_THAT(h.Find(0).status(), StatusIs(absl::StatusCode::kUnavailable));
  for (int64_t r = 0; r < 6; ++r) h.Publish(ModelOf(r), 100 + static_cast<uint32_t>(r));
  EXPECT_EQ(h.newest().round, 5);
  EXPECT_EQ(h.Find(0)->round, 5);
  EXPECT_EQ(h.Find(4)->round, 4);
  EXPECT_THAT(h.Find(3).status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(h.Find(6).status(), StatusIs(absl::StatusCode::kUnavailable));
  // Bounded, however long the run: three CRCs, not one a round.
  EXPECT_EQ(h.crcs_kept(), 3u);
  EXPECT_EQ(h.Crc(3), 103u);
  EXPECT_EQ(h.Crc(2), std::nullopt);
  h.Clear();
  EXPECT_TRUE(h.empty());
  EXPECT_EQ(h.Crc(5), std::nullopt);
}

TEST(ModelHistory, ChunkedPayloadsLastUntilTheNextModelOrRound) {
  ModelHistory h(2, 2);
  h.Publish(ModelOf(1), 1);
  EXPECT_EQ(h.Chunks(-1), nullptr);
  h.KeepChunks(-1, {.payload_bytes = 7});
  ASSERT_NE(h.Chunks(-1), nullptr);
  EXPECT_EQ(h.Chunks(-1)->payload_bytes, 7u);
  h.ForgetChunks();
  EXPECT_EQ(h.Chunks(-1), nullptr);
  h.KeepChunks(0, {.payload_bytes = 9});
  h.Publish(ModelOf(2), 2);
  EXPECT_EQ(h.Chunks(0), nullptr);
}

internal::AggregatorCheckpoint SnapshotOf(uint64_t generation, uint64_t round) {
  internal::AggregatorCheckpoint c;
  c.set_generation(generation);
  c.set_run_id("r");
  c.set_round(round);
  return c;
}

internal::LoggedUpdate UpdateOf(uint64_t generation, uint32_t client) {
  internal::LoggedUpdate u;
  u.set_generation(generation);
  u.set_client(client);
  u.set_weight(1);
  return u;
}

TEST(StateStore, ReadsBackTheNewestSnapshotAndTheUpdatesLoggedAfterIt) {
  const std::string path = TempPath("ckpt");
  {
    StateStore store(path);
    EXPECT_EQ(store.LastWrite(), absl::InfinitePast());
    absl::StatusOr<std::optional<StateStore::Saved>> none = store.Read();
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_FALSE(none->has_value());  // a new run
    TERN_ASSERT_OK(store.Write(SnapshotOf(1, 0), 1));
    TERN_ASSERT_OK(store.Append(UpdateOf(1, 4)));
    TERN_ASSERT_OK(store.Write(SnapshotOf(2, 1), 2));
    TERN_ASSERT_OK(store.Write(SnapshotOf(1, 0), 1));  // older than the one on disk: dropped
    TERN_ASSERT_OK(store.Append(UpdateOf(2, 5)));
    TERN_ASSERT_OK(store.Append(UpdateOf(2, 6)));
    EXPECT_NE(store.LastWrite(), absl::InfinitePast());
  }
  StateStore again(path);
  absl::StatusOr<std::optional<StateStore::Saved>> saved = again.Read();
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_TRUE(saved->has_value());
  EXPECT_EQ((*saved)->snapshot.round(), 1u);
  ASSERT_EQ((*saved)->log.updates.size(), 2u);
  EXPECT_EQ((*saved)->log.updates[0].client(), 5u);
  EXPECT_EQ((*saved)->log.updates[1].client(), 6u);
}

TEST(StateStore, ASnapshotThatDoesNotParseIsDataLoss) {
  const std::string path = TempPath("ckpt");
  {
    StateStore store(path);
    TERN_ASSERT_OK(store.Write(SnapshotOf(1, 0), 1));
  }
  FILE* f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  fputs("\xff\xff\xff\xff not a snapshot", f);
  fclose(f);
  EXPECT_THAT(StateStore(path).Read().status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("does not parse")));
}

}  // namespace
}  // namespace tern

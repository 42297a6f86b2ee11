#include "worker/stripe_join.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/crc32.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

constexpr uint64_t kStreamId = 0xfeedbeef;

v1::TensorBundle Bundle(size_t numel, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(numel);
  for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  v1::TensorBundle b;
  b.set_run_id("run");
  b.set_sender("1");
  b.set_round(7);
  v1::NamedTensor* t = b.add_tensors();
  t->set_name("x");
  t->mutable_tensor()->set_codec("none.v1");
  t->mutable_tensor()->set_numel(numel);
  t->mutable_tensor()->add_shape(static_cast<int64_t>(numel));
  t->mutable_tensor()->set_payload(x.data(), x.size() * sizeof(float));
  return b;
}

// The bundle's chunks as a receiver reads them, chunk i in stripe i mod `stripes` (as sent).
std::vector<std::vector<RawChunk>> Stripes(const v1::TensorBundle& b, uint32_t stripes,
                                           size_t chunk_bytes) {
  auto chunks =
      std::make_shared<std::vector<v1::BundleChunk>>(*ChunkBundle(b, kStreamId, chunk_bytes));
  std::vector<std::vector<RawChunk>> out(stripes);
  for (size_t i = 0; i < chunks->size(); ++i) {
    const v1::BundleChunk& c = (*chunks)[i];
    RawChunk r;
    r.header = {c.stream_id(), c.offset(),       c.total_size(), c.data_crc32(),
                c.last(),      c.bundle_crc32(), stripes};
    r.owner = chunks;
    r.data = {c.data()};
    r.data_size = c.data().size();
    r.message_size = c.ByteSizeLong();
    out[i % stripes].push_back(std::move(r));
  }
  return out;
}

struct Member final : StripeMember {
  void JoinDone(const absl::Status& s) override {
    ++done_calls;
    outcome = s;
  }
  int done_calls = 0;
  absl::Status outcome = absl::UnknownError("no outcome");
};

// A StripeJoins whose outcome records what it was handed.
struct Fixture {
  Fixture()
      : codecs(NewBuiltinCodecRegistry()),
        joins(codecs.get(), uint64_t{1} << 30,
              [this](const std::string&, absl::StatusOr<ReceivedBundle> got, uint64_t wire,
                     PayloadScans* scans) {
                ++outcomes;
                wire_bytes = wire;
                had_scans = scans != nullptr;
                if (!got.ok()) return got.status();
                bundle = got->bundle;
                for (size_t i = 0; i < got->in_place.size(); ++i) {
                  if (got->in_place[i].empty()) continue;
                  in_place = true;
                  bundle.mutable_tensors(static_cast<int>(i))
                      ->mutable_tensor()
                      ->set_payload(got->in_place[i].Flatten());
                }
                return absl::OkStatus();
              }) {}
  std::unique_ptr<CodecRegistry> codecs;
  StripeJoins joins;
  int outcomes = 0;
  uint64_t wire_bytes = 0;
  bool had_scans = false;
  bool in_place = false;
  v1::TensorBundle bundle;
};

TEST(StripeJoin, StripesArrivingInAnyInterleavingMakeTheBundleThatWasSent) {
  const v1::TensorBundle sent = Bundle(100000, 1);  // 400 KB: its payload stays in the slices
  std::mt19937 rng(2);
  for (uint32_t stripes : {2u, 3u, 5u}) {
    for (int trial = 0; trial < 20; ++trial) {
      Fixture f;
      std::vector<std::vector<RawChunk>> s = Stripes(sent, stripes, 16 << 10);
      std::vector<std::shared_ptr<StripeJoin>> joins(stripes);
      std::vector<size_t> next(stripes, 0);
      std::vector<Member> members(stripes);
      uint64_t wire = 0;
      for (const auto& stripe : s) {
        for (const RawChunk& c : stripe) wire += c.message_size + 5;
      }
      int answered = 0;
      for (size_t left = 0; [&] {
             left = 0;
             for (uint32_t i = 0; i < stripes; ++i) left += s[i].size() - next[i];
             return left > 0;
           }();) {
        uint32_t i = rng() % stripes;
        while (next[i] == s[i].size()) i = (i + 1) % stripes;
        if (joins[i] == nullptr) {
          absl::StatusOr<std::shared_ptr<StripeJoin>> j = f.joins.Attach("peer", s[i][0].header);
          ASSERT_THAT(j, IsOk());
          joins[i] = *j;
        }
        std::optional<absl::Status> out = joins[i]->Add(std::move(s[i][next[i]++]));
        if (next[i] < s[i].size()) {
          ASSERT_FALSE(out.has_value()) << "an outcome before the bundle was whole";
        } else if (out.has_value()) {
          EXPECT_THAT(*out, IsOk());
          ++answered;
        } else if (std::optional<absl::Status> end = joins[i]->EndOfStream(&members[i])) {
          EXPECT_THAT(*end, IsOk());
          ++answered;
        }
      }
      for (Member& m : members) {
        if (m.done_calls == 0) continue;
        EXPECT_EQ(m.done_calls, 1);
        EXPECT_THAT(m.outcome, IsOk());
        ++answered;
      }
      EXPECT_EQ(answered, static_cast<int>(stripes)) << "every stream gets its answer";
      ASSERT_EQ(f.outcomes, 1);
      EXPECT_TRUE(f.had_scans);
      EXPECT_TRUE(f.in_place);
      EXPECT_EQ(f.wire_bytes, wire);
      EXPECT_EQ(f.bundle.SerializeAsString(), sent.SerializeAsString());
    }
  }
}

TEST(StripeJoin, JoinsAreKeptApartByCallerAndStreamIdAndForgottenWhenTheirStreamsEnd) {
  Fixture f;
  const v1::TensorBundle sent = Bundle(1000, 3);
  std::vector<std::vector<RawChunk>> s = Stripes(sent, 2, 1024);
  auto a = f.joins.Attach("host-a", s[0][0].header);
  auto b = f.joins.Attach("host-b", s[0][0].header);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_NE(a->get(), b->get());
  EXPECT_EQ(f.joins.open_joins(), 2);
  a->reset();
  b->reset();
  EXPECT_EQ(f.joins.open_joins(), 0);
}

TEST(StripeJoin, StreamsThatDisagreeOrOneTooManyAreRefusedAlone) {
  Fixture f;
  std::vector<std::vector<RawChunk>> s = Stripes(Bundle(1000, 4), 2, 1024);
  ChunkHeader h = s[0][0].header;
  auto first = f.joins.Attach("peer", h);
  ASSERT_THAT(first, IsOk());
  ChunkHeader other_size = h;
  other_size.total_size += 1;
  EXPECT_THAT(f.joins.Attach("peer", other_size), StatusIs(absl::StatusCode::kInvalidArgument));
  ChunkHeader other_stripes = h;
  other_stripes.stripes = 3;
  EXPECT_THAT(f.joins.Attach("peer", other_stripes), StatusIs(absl::StatusCode::kInvalidArgument));
  auto second = f.joins.Attach("peer", h);
  ASSERT_THAT(second, IsOk());
  EXPECT_THAT(f.joins.Attach("peer", h), StatusIs(absl::StatusCode::kInvalidArgument));
  ChunkHeader too_many = h;
  too_many.stream_id = 1;
  too_many.stripes = kMaxStripes + 1;
  EXPECT_THAT(f.joins.Attach("peer", too_many), StatusIs(absl::StatusCode::kInvalidArgument));
  ChunkHeader too_big = h;
  too_big.stream_id = 2;
  too_big.total_size = uint64_t{1} << 40;
  EXPECT_THAT(f.joins.Attach("peer", too_big), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(f.outcomes, 0) << "a refused stream leaves the join alone";
}

TEST(StripeJoin, AnOverlappingDuplicateOrCorruptChunkFailsThePushOnceForEveryStream) {
  for (int kind = 0; kind < 4; ++kind) {
    Fixture f;
    std::vector<std::vector<RawChunk>> s = Stripes(Bundle(5000, 5), 2, 1024);
    auto a = f.joins.Attach("peer", s[0][0].header);
    auto b = f.joins.Attach("peer", s[1][0].header);
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    Member waiting;
    ASSERT_FALSE((*b)->Add(s[1][0]).has_value());  // ahead of the parse position: waits
    ASSERT_FALSE((*b)->EndOfStream(&waiting).has_value());
    RawChunk bad = s[0][0];
    absl::StatusCode want = absl::StatusCode::kInvalidArgument;
    std::string corrupt;
    switch (kind) {
      case 0:  // the same bytes again, from the other stripe
        bad = s[1][0];
        break;
      case 1:  // runs into the next chunk, which waits
        bad = s[0][0];
        bad.data_size += 1;
        bad.data = {absl::string_view(bad.data[0].data(), bad.data[0].size() + 1)};
        bad.header.data_crc32 = Crc32(bad.data[0].data(), bad.data[0].size());
        break;
      case 2:  // past the end
        bad.header.offset = bad.header.total_size;
        break;
      case 3:  // one flipped bit
        corrupt = std::string(bad.data[0]);
        corrupt[7] ^= 0x10;
        bad.data = {corrupt};
        want = absl::StatusCode::kDataLoss;
        break;
    }
    std::optional<absl::Status> out = (*a)->Add(bad);
    ASSERT_TRUE(out.has_value()) << kind;
    EXPECT_THAT(*out, StatusIs(want)) << kind;
    EXPECT_EQ(f.outcomes, 1) << "the refusal is counted once";
    EXPECT_FALSE(f.had_scans);
    EXPECT_EQ(waiting.done_calls, 1) << "the waiting stripe is answered too";
    EXPECT_THAT(waiting.outcome, StatusIs(want));
    // A chunk that comes after the outcome is answered with it, and changes nothing.
    std::optional<absl::Status> late = (*a)->Add(s[0][1]);
    ASSERT_TRUE(late.has_value());
    EXPECT_THAT(*late, StatusIs(want));
    EXPECT_EQ(f.outcomes, 1);
  }
}

TEST(StripeJoin, AStripeThatGoesAwayFailsThePushAndAnswersTheOnesWaiting) {
  Fixture f;
  std::vector<std::vector<RawChunk>> s = Stripes(Bundle(5000, 6), 3, 1024);
  std::vector<std::shared_ptr<StripeJoin>> j;
  for (int i = 0; i < 3; ++i) j.push_back(*f.joins.Attach("peer", s[i][0].header));
  Member waiting, cancelled_while_waiting;
  for (RawChunk& c : s[2]) ASSERT_FALSE(j[2]->Add(c).has_value());
  ASSERT_FALSE(j[2]->EndOfStream(&waiting).has_value());
  for (RawChunk& c : s[1]) ASSERT_FALSE(j[1]->Add(c).has_value());
  ASSERT_FALSE(j[1]->EndOfStream(&cancelled_while_waiting).has_value());
  // Stripe 1's stream is cancelled while it waits (the idle sweep): it answers itself.
  EXPECT_TRUE(j[1]->Leave(&cancelled_while_waiting, absl::CancelledError("idle")));
  EXPECT_EQ(cancelled_while_waiting.done_calls, 0);
  EXPECT_EQ(waiting.done_calls, 1);
  EXPECT_THAT(waiting.outcome, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(f.outcomes, 1);
  // Stripe 0 comes late: told at once.
  std::optional<absl::Status> out = j[0]->Add(s[0][0]);
  ASSERT_TRUE(out.has_value());
  EXPECT_THAT(*out, StatusIs(absl::StatusCode::kCancelled));
}

TEST(StripeJoin, StripesFedFromManyThreadsAtOnceMakeTheBundleThatWasSent) {
  const v1::TensorBundle sent = Bundle(300000, 7);
  for (int trial = 0; trial < 10; ++trial) {
    Fixture f;
    constexpr uint32_t kStripes = 4;
    std::vector<std::vector<RawChunk>> s = Stripes(sent, kStripes, 8 << 10);
    std::vector<Member> members(kStripes);
    std::vector<absl::Status> answers(kStripes, absl::UnknownError("none"));
    std::vector<std::shared_ptr<StripeJoin>> held(kStripes);
    std::vector<std::thread> threads;
    for (uint32_t i = 0; i < kStripes; ++i) {
      threads.emplace_back([&, i] {
        // A member holds its join until it is answered, as a Push reactor does.
        std::shared_ptr<StripeJoin>& j = held[i];
        j = *f.joins.Attach("peer", s[i][0].header);
        bool answered = false;
        for (RawChunk& c : s[i]) {
          std::optional<absl::Status> out = j->Add(std::move(c));
          if (out.has_value()) {
            answers[i] = out.value();
            answered = true;
          }
        }
        if (!answered) {
          std::optional<absl::Status> end = j->EndOfStream(&members[i]);
          if (end.has_value()) answers[i] = end.value();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (uint32_t i = 0; i < kStripes; ++i) {
      EXPECT_THAT(members[i].done_calls == 1 ? members[i].outcome : answers[i], IsOk());
    }
    ASSERT_EQ(f.outcomes, 1);
    EXPECT_EQ(f.bundle.SerializeAsString(), sent.SerializeAsString());
  }
}

}  // namespace
}  // namespace tern

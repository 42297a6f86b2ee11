// The federated client against a mocked Aggregator stub on a fake clock: what it does when the
// server forgets it, sends a copy that fails its CRC, leaves a gap in the kept updates, or is
// gone for good.
#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "clients/cpp/fed_client.h"
#include "common/chunking.h"
#include "common/crc32.h"
#include "core/model/bundle.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tern/v1/server_mock.grpc.pb.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::FakeClock;
using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::_;
using ::testing::Invoke;
using ::testing::NiceMock;

// A server stream that yields `replies`, then ends with `status`.
class FakeFetch final : public grpc::ClientReaderInterface<v1::FetchReply> {
 public:
  FakeFetch(std::vector<v1::FetchReply> replies, grpc::Status status)
      : replies_(std::move(replies)), status_(std::move(status)) {}
  bool Read(v1::FetchReply* m) override {
    if (next_ == replies_.size()) return false;
    *m = replies_[next_++];
    return true;
  }
  bool NextMessageSize(uint32_t* size) override {
    *size = 1u << 30;
    return next_ < replies_.size();
  }
  grpc::Status Finish() override { return status_; }
  void WaitForInitialMetadata() override {}

 private:
  std::vector<v1::FetchReply> replies_;
  size_t next_ = 0;
  grpc::Status status_;
};

// A client stream that keeps what is written and ends with `status` (running `on_finish` first,
// which may fill the reply).
template <typename T>
class FakeUpload final : public grpc::ClientWriterInterface<T> {
 public:
  FakeUpload(std::vector<T>* sink, grpc::Status status, std::function<void()> on_finish = {})
      : sink_(sink), status_(std::move(status)), on_finish_(std::move(on_finish)) {}
  bool Write(const T& m, grpc::WriteOptions) override {
    sink_->push_back(m);
    return true;
  }
  bool WritesDone() override { return true; }
  grpc::Status Finish() override {
    if (on_finish_) on_finish_();
    return status_;
  }

 private:
  std::vector<T>* sink_;
  grpc::Status status_;
  std::function<void()> on_finish_;
};

class FedClientMockTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { data_ = LoadFedClientData("", "iid", 2, "softmax", 3)->release(); }
  static void TearDownTestSuite() { delete data_; }

  FedClientMockTest() {
    auto stub = std::make_unique<NiceMock<v1::MockAggregatorStub>>();
    stub_ = stub.get();
    options_.seed = 3;
    options_.give_up_after = absl::Minutes(10);
    client_ = std::make_unique<FedClient>(options_, data_, std::move(stub), &clock_);
  }

  // Join answers with these ids in turn, keeping each request.
  void ExpectJoins(std::vector<uint32_t> ids) {
    EXPECT_CALL(*stub_, Join(_, _, _))
        .Times(static_cast<int>(ids.size()))
        .WillRepeatedly(Invoke(
            [this, ids](grpc::ClientContext*, const v1::JoinRequest& req, v1::JoinReply* reply) {
              reply->set_client_id(ids[joins_.size()]);
              joins_.push_back(req);
              return grpc::Status::OK;
            }));
  }
  // Fetch answers with these streams in turn, keeping each request.
  void ExpectFetches(std::vector<std::function<FakeFetch*()>> streams) {
    EXPECT_CALL(*stub_, FetchRaw(_, _))
        .Times(static_cast<int>(streams.size()))
        .WillRepeatedly(Invoke([this, streams](grpc::ClientContext*, const v1::FetchRequest& req) {
          const size_t i = fetches_.size();
          fetches_.push_back(req);
          return streams[i]();
        }));
  }

  static std::function<FakeFetch*()> Task(v1::Task task, v1::TensorBundle payload = {}) {
    return [task, payload] {
      std::vector<v1::FetchReply> replies;
      if (task.kind() != v1::Task::TRAIN) {
        replies.emplace_back();
        *replies.back().mutable_task() = task;
      } else {
        std::vector<v1::BundleChunk> chunks =
            testing::ValueOrFailure(ChunkBundle(payload, task.round(), 4096));
        for (v1::BundleChunk& c : chunks) {
          replies.emplace_back();
          if (replies.size() == 1) *replies.back().mutable_task() = task;
          *replies.back().mutable_chunk() = std::move(c);
        }
      }
      return new FakeFetch(std::move(replies), grpc::Status::OK);
    };
  }
  static std::function<FakeFetch*()> Fails(grpc::StatusCode code) {
    return [code] { return new FakeFetch({}, grpc::Status(code, "mock")); };
  }
  static v1::Task Done() {
    v1::Task t;
    t.set_kind(v1::Task::DONE);
    return t;
  }
  static v1::Task Train(uint64_t round) {
    v1::Task t;
    t.set_kind(v1::Task::TRAIN);
    t.set_round(round);
    t.set_update_codec("none");
    t.set_payload(v1::Task::MODEL);
    v1::LocalTraining* l = t.mutable_local();
    l->set_local_steps(1);
    l->set_batch(8);
    l->set_lr(0.1f);
    return t;
  }
  // The initial model every client makes from the shared seed, and its CRC-32.
  std::vector<float> InitialModel() const {
    std::vector<float> x(data_->model->NumParams());
    data_->model->Init(options_.seed, absl::MakeSpan(x));
    return x;
  }

  static FedClientData* data_;
  FedClientOptions options_;
  FakeClock clock_;
  v1::MockAggregatorStub* stub_;
  std::unique_ptr<FedClient> client_;
  std::vector<v1::JoinRequest> joins_;
  std::vector<v1::FetchRequest> fetches_;
  std::atomic<bool> stop_{false};
};

FedClientData* FedClientMockTest::data_ = nullptr;

TEST_F(FedClientMockTest, AsksForItsIdBackAfterAnOutageAndRejoinsAServerThatForgotIt) {
  ExpectJoins({5, 5, 7});
  ExpectFetches(
      {Fails(grpc::StatusCode::UNAVAILABLE), Fails(grpc::StatusCode::NOT_FOUND), Task(Done())});
  ASSERT_THAT(client_->Run(stop_), IsOk());
  ASSERT_EQ(joins_.size(), 3u);
  EXPECT_EQ(joins_[0].client_id(), -1);  // new
  EXPECT_EQ(joins_[1].client_id(), 5);   // the server was unreachable: the same id back
  EXPECT_EQ(joins_[2].client_id(), -1);  // the server did not know 5: a new id
  EXPECT_EQ(fetches_[0].client_id(), 5u);
  EXPECT_EQ(fetches_[2].client_id(), 7u);
}

TEST_F(FedClientMockTest, TrainsOnAnExactModelPushesItsUpdateAndSaysWhichCopyItHolds) {
  const std::vector<float> x0 = InitialModel();
  v1::Task t = Train(1);
  t.set_model_crc32(Crc32(x0.data(), 4 * x0.size()));
  ExpectJoins({0});
  ExpectFetches({Task(t, *FlatToBundle(data_->model->Layout(), x0)), Task(Done())});
  std::vector<v1::UpdateRequest> pushed;
  v1::UpdateReply* reply = nullptr;
  EXPECT_CALL(*stub_, PushRaw(_, _)).WillOnce(Invoke([&](grpc::ClientContext*, v1::UpdateReply* r) {
    reply = r;
    return new FakeUpload<v1::UpdateRequest>(
        &pushed, grpc::Status::OK, [&] { reply->set_verdict(v1::UpdateReply::ACCEPTED); });
  }));
  const absl::StatusOr<FedClientStats> stats = client_->Run(stop_);
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->updates_accepted, 1);
  ASSERT_FALSE(pushed.empty());
  EXPECT_EQ(pushed[0].info().round(), 1u);
  EXPECT_EQ(pushed[0].info().weight(), static_cast<double>(data_->parts[0].size()));
  EXPECT_EQ(pushed[0].info().batch(), 8u);
  BundleAssembler assembler(1u << 30);
  for (const v1::UpdateRequest& r : pushed) ASSERT_THAT(assembler.Add(r.chunk()), IsOk());
  const absl::StatusOr<v1::TensorBundle> update = assembler.Finish();
  ASSERT_THAT(update, IsOk());
  EXPECT_EQ(update->round(), 1u);
  // One SGD step moved the model: the update is not zero.
  std::vector<float> u(x0.size());
  auto codecs = NewBuiltinCodecRegistry();
  ASSERT_THAT(BundleToFlat(*update, data_->model->Layout(), *codecs, absl::MakeSpan(u)), IsOk());
  double norm = 0;
  for (float v : u) norm += v * v;
  EXPECT_GT(norm, 0);
  // The next fetch says it holds round 0's model exactly.
  ASSERT_EQ(fetches_.size(), 2u);
  EXPECT_EQ(fetches_[1].have_round(), 0);
  EXPECT_EQ(fetches_[1].have_crc32(), t.model_crc32());
}

TEST_F(FedClientMockTest, AModelCopyFailingItsCrcIsNotTrainedOnAndTheModelIsAskedForNext) {
  const std::vector<float> x0 = InitialModel();
  v1::Task t = Train(1);
  t.set_model_crc32(Crc32(x0.data(), 4 * x0.size()) ^ 1);
  ExpectJoins({0});
  ExpectFetches({Task(t, *FlatToBundle(data_->model->Layout(), x0)), Task(Done())});
  EXPECT_CALL(*stub_, PushRaw(_, _)).Times(0);
  const absl::StatusOr<FedClientStats> stats = client_->Run(stop_);
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->rounds_trained, 0);
  ASSERT_EQ(fetches_.size(), 2u);
  EXPECT_EQ(fetches_[0].have_round(), 0);  // the initial model, which every client can make
  EXPECT_EQ(fetches_[1].have_round(), -1);
}

TEST_F(FedClientMockTest, AGapInTheKeptUpdatesIsNotTrainedOnAndTheModelIsAskedForNext) {
  v1::Task t = Train(4);
  t.set_payload(v1::Task::DELTAS);
  t.set_delta_from(2);  // the client holds round 0
  ExpectJoins({0});
  ExpectFetches({Task(t, v1::TensorBundle()), Task(Done())});
  EXPECT_CALL(*stub_, PushRaw(_, _)).Times(0);
  const absl::StatusOr<FedClientStats> stats = client_->Run(stop_);
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->rounds_trained, 0);
  ASSERT_EQ(fetches_.size(), 2u);
  EXPECT_EQ(fetches_[1].have_round(), -1);
}

TEST_F(FedClientMockTest, GivesUpWithUnavailableOnceTheServerHasBeenGoneLongerThanItsLimit) {
  int tries = 0;
  EXPECT_CALL(*stub_, Join(_, _, _))
      .WillRepeatedly(Invoke([&](grpc::ClientContext*, const v1::JoinRequest&, v1::JoinReply*) {
        ++tries;
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused");
      }));
  const absl::Time start = clock_.Now();
  EXPECT_THAT(client_->Run(stop_),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::HasSubstr("refused")));
  // It backed off (200 ms a try) for the whole limit on the fake clock, then stopped.
  EXPECT_GE(clock_.Now() - start, absl::Minutes(10));
  EXPECT_LE(clock_.Now() - start, absl::Minutes(10) + absl::Seconds(1));
  EXPECT_NEAR(tries, 10 * 60 * 5, 5);
}

TEST_F(FedClientMockTest, ARefusalThatRetryingCannotMendEndsTheRun) {
  EXPECT_CALL(*stub_, Join(_, _, _))
      .WillOnce(Invoke([](grpc::ClientContext*, const v1::JoinRequest&, v1::JoinReply*) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this server runs 'other'");
      }));
  EXPECT_THAT(client_->Run(stop_),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("other")));
}

}  // namespace
}  // namespace tern

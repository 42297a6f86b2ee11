// Striped Gossip.Push and the long-lived Gossip.Stream between a live worker (or a stand-in peer)
// and a GrpcTransport, what a worker does with a striped push that is cut, corrupted or left
// waiting, and Gossip.State's slices from a live worker.
#include <atomic>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/chunking.h"
#include "core/model/bundle.h"
#include "core/rpc/channel.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/async_generic_service.h"
#include "gtest/gtest.h"
#include "kernels/builtin.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/watchdog.h"
#include "worker/daemon.h"
#include "worker/grpc_transport.h"
#include "worker/state_share.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::tern::testing::ValueOrFailure;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kNumel = 600000;  // 2.4 MB: 3 chunks of 1 MiB

std::vector<ParamTensor> Layout() { return {{"x", {static_cast<int64_t>(kNumel)}, 0, kNumel}}; }

std::string CurrentTest() {
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  return absl::StrCat(t->test_suite_name(), ".", t->name());
}

// Worker 0 of two (dpsgd on the complete graph), its model all zeros; worker 1 is this test.
// A test that holds one and has not ended (its shutdown included) within 90 s aborts: a push or a
// shutdown that hangs fails fast, naming the test.
struct Receiver {
  explicit Receiver(StreamLimitOptions limits = {.max_buffered_bytes = 0}, bool registered = true)
      : watchdog(CurrentTest(), absl::Seconds(90)) {
    DaemonOptions o;
    o.engine.run_id = "run";
    o.engine.num_workers = 2;
    o.engine.topology = "complete";
    o.engine.algorithm = "dpsgd";
    o.engine.algorithm_options.codec = "none";
    // Its own pushes to the absent worker 1 are retried for the first round, bounded by this.
    o.engine.round_timeout = absl::Seconds(2);
    o.limits = limits;
    daemon = *WorkerDaemon::Start(o, &registries);
    if (registered) Register();
    peers = {absl::StrCat("127.0.0.1:", daemon->port()), "127.0.0.1:1"};
    EXPECT_THAT(daemon->SetPeers(peers), IsOk());
  }
  ~Receiver() { daemon->Shutdown(absl::Seconds(2)); }
  void Register() {
    EXPECT_THAT(daemon->trainer().Register(Layout(), std::vector<float>(kNumel, 0.0f)).status(),
                IsOk());
  }

  tern::testing::Watchdog watchdog;  // first: it outlives the daemon's shutdown
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  std::unique_ptr<WorkerDaemon> daemon;
  std::vector<std::string> peers;
};

// Steps the receiver's round 0 (no gradient): its model is then the mean of its zeros and
// `x`, the message it took.
void ExpectRoundZeroMixes(Receiver& r, const std::vector<float>& x, StepOutcome* out) {
  StepInput step;
  step.step = 0;
  const std::vector<float> zeros(x.size(), 0.0f);
  step.grad = zeros;
  absl::StatusOr<absl::Span<const float>> model = r.daemon->trainer().Step(step, out);
  ASSERT_THAT(model.status(), IsOk());
  for (size_t i = 0; i < x.size(); i += 997) ASSERT_FLOAT_EQ((*model)[i], 0.5f * x[i]) << i;
}

std::vector<float> Values(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(kNumel);
  for (float& v : x) v = std::uniform_real_distribution<float>(-1, 1)(rng);
  return x;
}

std::vector<v1::BundleChunk> Message(const std::vector<float>& x, uint64_t round) {
  v1::TensorBundle b = *FlatToBundle(Layout(), x);
  b.set_run_id("run");
  b.set_sender("1");
  b.set_round(round);
  return *ChunkBundle(b, round);
}

absl::Status Send(GrpcTransport& t, std::vector<v1::BundleChunk> chunks) {
  absl::Notification done;
  absl::Status status;
  t.Send(0, std::make_shared<const std::vector<v1::BundleChunk>>(std::move(chunks)),
         absl::Now() + absl::Seconds(30), PeerTransport::Reach::kOnce, [&](absl::Status s) {
           status = s;
           done.Notify();
         });
  done.WaitForNotification();
  return status;
}

TEST(StripedPush, ALargeMessageOverThreeConnectionsIsMixedAsSent) {
  Receiver r;
  GrpcTransport t(/*self=*/1, nullptr, PushStriping{.stripes = 3, .min_bytes = 1 << 20});
  ASSERT_THAT(t.SetPeers(r.peers), IsOk());
  const std::vector<float> x = Values(1);
  ASSERT_THAT(Send(t, Message(x, 0)), IsOk());
  StepOutcome out;
  ExpectRoundZeroMixes(r, x, &out);
  EXPECT_THAT(out.mixed, ElementsAre(1));
  EXPECT_EQ(out.delta.messages_refused(), 0u);
}

// A peer that came back at another address (its peers follow the scheduler): pushes from then
// on go there; the same address again changes nothing, and bad input is refused.
TEST(GrpcTransportPeers, APeerThatMovedIsReachedAtItsNewAddress) {
  Receiver r;
  GrpcTransport t(/*self=*/1, nullptr, PushStriping{.stripes = 2, .min_bytes = 1 << 20});
  EXPECT_THAT(t.SetPeer(0, r.peers[0]), StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(t.SetPeers({"127.0.0.1:1", "127.0.0.1:2"}), IsOk());  // worker 0 not there yet
  EXPECT_THAT(Send(t, Message(Values(5), 0)), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(ValueOrFailure(t.SetPeer(0, r.peers[0])), true);   // moved
  EXPECT_EQ(ValueOrFailure(t.SetPeer(0, r.peers[0])), false);  // where it was
  EXPECT_THAT(Send(t, Message(Values(5), 0)), IsOk());
  EXPECT_THAT(t.SetPeer(1, "127.0.0.1:3"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(t.SetPeer(2, "127.0.0.1:3"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(t.SetPeer(0, ""), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(StripedPush, ACorruptChunkOnOneStripeFailsThePushOnEveryStreamAndTheNextPushIsTaken) {
  Receiver r;
  GrpcTransport t(/*self=*/1, nullptr, PushStriping{.stripes = 2, .min_bytes = 1 << 20});
  ASSERT_THAT(t.SetPeers(r.peers), IsOk());
  std::vector<v1::BundleChunk> chunks = Message(Values(2), 0);
  (*chunks[1].mutable_data())[12345] ^= 0x08;  // on the second stream
  EXPECT_THAT(Send(t, chunks), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(r.daemon->engine()->Stats().messages_refused(), 1u) << "counted once";
  EXPECT_THAT(Send(t, Message(Values(3), 0)), IsOk());
}

TEST(StripedPush, ANaNOnAnyStripeIsRefusedAsOnOneStream) {
  Receiver r;
  GrpcTransport t(/*self=*/1, nullptr, PushStriping{.stripes = 2, .min_bytes = 1 << 20});
  ASSERT_THAT(t.SetPeers(r.peers), IsOk());
  std::vector<float> x = Values(4);
  x[kNumel - 3] = std::nanf("");  // in the last chunk
  absl::Status s = Send(t, Message(x, 0));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(std::string(s.message()), HasSubstr("Inf or NaN"));
}

// The receiver admits one stream of the push and refuses the other (one stream per peer): the
// sender cancels the admitted one rather than leave it waiting for the round's deadline.
TEST(StripedPush, AStripeRefusedAtAdmissionEndsThePushAtOnce) {
  Receiver r(StreamLimitOptions{.max_streams_per_peer = 1, .max_buffered_bytes = 0});
  GrpcTransport t(/*self=*/1, nullptr, PushStriping{.stripes = 2, .min_bytes = 1 << 20});
  ASSERT_THAT(t.SetPeers(r.peers), IsOk());
  const absl::Time t0 = absl::Now();
  absl::Status s = Send(t, Message(Values(7), 0));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(std::string(s.message()), HasSubstr("--max_streams_per_peer"));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10)) << "not the 30 s deadline";
  // With one stream a push, the same worker takes it.
  GrpcTransport one(/*self=*/1, nullptr, PushStriping{.stripes = 1});
  ASSERT_THAT(one.SetPeers(r.peers), IsOk());
  for (int i = 0; i < 200 && r.daemon->engine()->Stats().messages_refused() < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(10));  // the cancelled stripe's slot comes back
  }
  EXPECT_THAT(Send(one, Message(Values(8), 0)), IsOk());
}

// A stripe cancelled by its sender while its first chunk is on its way in (OnCancel finding no join
// yet, the read then attaching one) is still answered: its stream slot comes back, and a shutdown
// does not wait for it. Once in ~1,400 CI runs the cancel fell in that gap, the stream waited for
// the push's other stripe forever, and the next push was refused for its slot.
TEST(StripedPush, AStripeCancelledAsItsFirstChunkArrivesIsAnsweredAndGivesItsSlotBack) {
  Receiver r(StreamLimitOptions{.max_streams_per_peer = 1, .max_buffered_bytes = 0});
  const std::vector<v1::BundleChunk> chunks = Message(Values(9), 0);
  auto stub = v1::Gossip::NewStub(MakeChannel(r.peers[0]));
  std::mt19937 rng(9);
  constexpr int kTries = 60;
  for (int i = 0; i < kTries; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::PushReply reply;
    auto w = stub->Push(&ctx, &reply);
    v1::BundleChunk c = chunks[0];
    c.set_stream_id(1000 + i);
    c.set_stripes(2);
    w->Write(c);
    // Cancel from 0 to ~300 us after the write: sometimes before the worker reads the chunk,
    // sometimes while it does, sometimes after it has joined.
    const int wait_us = std::uniform_int_distribution<int>(0, 300)(rng);
    if (wait_us > 0) absl::SleepFor(absl::Microseconds(wait_us));
    ctx.TryCancel();
    (void)w->Finish();
    // Each stream is refused once, whichever way it ended; wait for it so the next try gets the
    // one slot (a try that finds it taken is refused at admission, and tests nothing).
    for (int k = 0; k < 200 && r.daemon->engine()->Stats().messages_refused() < uint64_t(i) + 1;
         ++k) {
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  // Every slot is back: a whole push over one stream is taken.
  GrpcTransport one(/*self=*/1, nullptr, PushStriping{.stripes = 1});
  ASSERT_THAT(one.SetPeers(r.peers), IsOk());
  absl::Status s;
  for (int k = 0; k < 100; ++k) {
    s = Send(one, Message(Values(10), 0));
    if (!absl::IsResourceExhausted(s)) break;
    absl::SleepFor(absl::Milliseconds(20));  // a cancelled stream's slot may still be coming back
  }
  EXPECT_THAT(s, IsOk());
}

// A rogue sender opens one stripe of two and never the other: the stripe waits, idle, and the
// sweep cancels it; its bytes go back to the budget.
TEST(StripedPush, AStripeWhoseOthersNeverComeIsCancelledWhenIdle) {
  Receiver r(StreamLimitOptions{.max_buffered_bytes = 0,
                                .idle_timeout = absl::Seconds(1),
                                .sweep_every = absl::Milliseconds(200)});
  std::vector<v1::BundleChunk> chunks = Message(Values(5), 0);
  auto stub = v1::Gossip::NewStub(MakeChannel(r.peers[0]));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::PushReply reply;
  auto w = stub->Push(&ctx, &reply);
  for (size_t i = 0; i < chunks.size(); i += 2) {
    v1::BundleChunk c = chunks[i];
    c.set_stream_id(99);
    c.set_stripes(2);
    ASSERT_TRUE(w->Write(c));
  }
  w->WritesDone();
  const absl::Time t0 = absl::Now();
  const grpc::Status s = w->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
  // The worker counts it as its side of the cancellation runs, which may be after the caller saw
  // it.
  for (int i = 0; i < 200 && r.daemon->engine()->Stats().messages_refused() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(r.daemon->engine()->Stats().messages_refused(), 1u);
  // The worker goes on: a whole push for the same round is taken.
  GrpcTransport t(/*self=*/1, nullptr, PushStriping{.stripes = 2, .min_bytes = 1 << 20});
  ASSERT_THAT(t.SetPeers(r.peers), IsOk());
  EXPECT_THAT(Send(t, Message(Values(6), 0)), IsOk());
}

// A message's verdict, filled in when it comes.
struct Sent {
  absl::Notification done;
  absl::Status status;
};

std::shared_ptr<Sent> SendAsync(GrpcTransport& t, std::vector<v1::BundleChunk> chunks,
                                absl::Duration deadline = absl::Seconds(30)) {
  auto sent = std::make_shared<Sent>();
  t.Send(0, std::make_shared<const std::vector<v1::BundleChunk>>(std::move(chunks)),
         absl::Now() + deadline, PeerTransport::Reach::kOnce, [sent](absl::Status s) {
           sent->status = std::move(s);
           sent->done.Notify();
         });
  return sent;
}

absl::Status Wait(const std::shared_ptr<Sent>& sent) {
  sent->done.WaitForNotification();
  return sent->status;
}

// Messages sent one after another without waiting go on one stream; each gets its own verdict,
// a refusal among them included, and the stream goes on after it.
TEST(PushStream, MessagesSentTogetherShareOneStreamAndEachGetsItsOwnVerdict) {
  Receiver r;
  GrpcTransport t(/*self=*/1, nullptr, PushStriping{.stripes = 1});
  ASSERT_THAT(t.SetPeers(r.peers), IsOk());
  std::shared_ptr<Sent> first = SendAsync(t, Message(Values(1), 0));
  std::shared_ptr<Sent> again = SendAsync(t, Message(Values(2), 0));  // round 0 twice
  std::shared_ptr<Sent> next = SendAsync(t, Message(Values(3), 1));
  EXPECT_THAT(Wait(first), IsOk());
  EXPECT_THAT(Wait(again), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(Wait(next), IsOk());
  EXPECT_EQ(t.streams_opened(), 1);
  EXPECT_EQ(r.daemon->engine()->Stats().messages_refused(), 1u);
  // Round 0 mixes the first message, not the refused one.
  StepOutcome out;
  ExpectRoundZeroMixes(r, Values(1), &out);
}

// A run with a long --round_timeout gives its messages deadlines far past a stream's life: they
// go on the stream all the same (the stream keeps each message's deadline itself).
TEST(PushStream, AMessageWithADeadlineFarPastTheStreamsLifeGoesOnTheStream) {
  Receiver r;
  GrpcTransport t(/*self=*/1, nullptr, PushStriping{.stripes = 1});
  ASSERT_THAT(t.SetPeers(r.peers), IsOk());
  EXPECT_THAT(Wait(SendAsync(t, Message(Values(1), 0), absl::Minutes(60))), IsOk());
  EXPECT_THAT(Wait(SendAsync(t, Message(Values(2), 1), absl::Minutes(60))), IsOk());
  EXPECT_EQ(t.streams_opened(), 1);
}

// A chunk the worker cannot take ends the stream: the message it was in gets that verdict,
// counted once, and the message behind it still arrives.
TEST(PushStream, ACorruptMessageEndsItsStreamAndTheOneBehindItStillArrives) {
  Receiver r;
  GrpcTransport t(/*self=*/1, nullptr, PushStriping{.stripes = 1});
  ASSERT_THAT(t.SetPeers(r.peers), IsOk());
  std::vector<v1::BundleChunk> bad = Message(Values(2), 0);
  (*bad[1].mutable_data())[12345] ^= 0x08;
  std::shared_ptr<Sent> corrupt = SendAsync(t, bad);
  std::shared_ptr<Sent> good = SendAsync(t, Message(Values(3), 0));
  EXPECT_THAT(Wait(corrupt), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(Wait(good), IsOk());
  EXPECT_EQ(r.daemon->engine()->Stats().messages_refused(), 1u) << "counted once";
  EXPECT_THAT(Send(t, Message(Values(4), 1)), IsOk());
  EXPECT_EQ(t.streams_opened(), 2) << "the next message opened another";
}

// A stream past its life closes once idle, and the next message opens another; with streams off,
// each message is a call of its own.
TEST(PushStream, AStreamPastItsLifeClosesAndTheNextMessageOpensAnother) {
  Receiver r;
  GrpcTransport t(/*self=*/1, nullptr,
                  PushStriping{.stripes = 1, .stream_life = absl::Milliseconds(300)});
  ASSERT_THAT(t.SetPeers(r.peers), IsOk());
  EXPECT_THAT(Send(t, Message(Values(1), 0)), IsOk());
  absl::SleepFor(absl::Milliseconds(600));
  EXPECT_THAT(Send(t, Message(Values(2), 1)), IsOk());
  EXPECT_EQ(t.streams_opened(), 2);
  GrpcTransport calls(/*self=*/1, nullptr, PushStriping{.stripes = 1, .streams = false});
  ASSERT_THAT(calls.SetPeers(r.peers), IsOk());
  EXPECT_THAT(Send(calls, Message(Values(3), 2)), IsOk());
  EXPECT_EQ(calls.streams_opened(), 0);
}

// Peers' streams wait for their next message and never end by themselves: a worker shutting down
// ends them rather than wait out its grace.
TEST(PushStream, AWorkerWithPeersStreamsOpenShutsDownWithoutWaitingItsGrace) {
  Receiver r;
  GrpcTransport t(/*self=*/1, nullptr, PushStriping{.stripes = 1});
  ASSERT_THAT(t.SetPeers(r.peers), IsOk());
  EXPECT_THAT(Send(t, Message(Values(1), 0)), IsOk());
  const absl::Time t0 = absl::Now();
  r.daemon->Shutdown(absl::Seconds(20));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
}

// A worker that has no model yet answers UNAVAILABLE: a message that may wait for it is tried
// again, as a Push is, until the worker takes it.
TEST(PushStream, AMessageToAWorkerStillStartingIsTriedAgainUntilItIsTaken) {
  Receiver r({.max_buffered_bytes = 0}, /*registered=*/false);
  GrpcTransport t(/*self=*/1, nullptr, PushStriping{.stripes = 1});
  ASSERT_THAT(t.SetPeers(r.peers), IsOk());
  EXPECT_THAT(Send(t, Message(Values(1), 0)), StatusIs(absl::StatusCode::kUnavailable))
      << "sent once";
  auto sent = std::make_shared<Sent>();
  t.Send(0, std::make_shared<const std::vector<v1::BundleChunk>>(Message(Values(2), 0)),
         absl::Now() + absl::Seconds(30), PeerTransport::Reach::kRetryUnavailable,
         [sent](absl::Status s) {
           sent->status = std::move(s);
           sent->done.Notify();
         });
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(sent->done.HasBeenNotified());
  r.Register();
  EXPECT_THAT(Wait(sent), IsOk());
}

// A stand-in peer (a generic gRPC service on 127.0.0.1): one that reads messages and never
// answers, or an older worker that serves Gossip.Push alone.
class FakePeer final : public grpc::CallbackGenericService {
 public:
  enum class Kind { kSilent, kPushOnly };
  explicit FakePeer(Kind kind) : kind_(kind) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterCallbackGenericService(this);
    server_ = b.BuildAndStart();
  }
  ~FakePeer() override {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)));
  }
  std::vector<std::string> peers() const {
    return {absl::StrCat("127.0.0.1:", port_), "127.0.0.1:1"};
  }
  int pushes() const { return pushes_.load(); }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    const bool stream = absl::EndsWith(ctx->method(), "/Stream");
    if (stream && kind_ == Kind::kPushOnly) return CallbackGenericService::CreateReactor(ctx);
    return new Reader(kind_ == Kind::kPushOnly ? &pushes_ : nullptr);
  }

 private:
  // Reads to the end; then, counting into `answered` when given, answers as Push does.
  class Reader final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Reader(std::atomic<int>* answered) : answered_(answered) { StartRead(&in_); }
    void OnReadDone(bool ok) override {
      if (ok) {
        StartRead(&in_);
      } else if (answered_ == nullptr) {
        Finish(grpc::Status::OK);
      } else {
        answered_->fetch_add(1);
        grpc::Slice bytes(v1::PushReply().SerializeAsString());
        out_ = grpc::ByteBuffer(&bytes, 1);
        StartWriteAndFinish(&out_, grpc::WriteOptions(), grpc::Status::OK);
      }
    }
    void OnDone() override { delete this; }

   private:
    std::atomic<int>* const answered_;
    grpc::ByteBuffer in_, out_;
  };

  const Kind kind_;
  int port_ = 0;
  std::atomic<int> pushes_{0};
  std::unique_ptr<grpc::Server> server_;
};

// A peer that takes a message and never answers: the message fails at its deadline, as a Push
// call's would, not at the stream's.
TEST(PushStream, AMessageUnansweredFailsAtItsOwnDeadline) {
  tern::testing::Watchdog watchdog(CurrentTest(), absl::Seconds(60));
  FakePeer peer(FakePeer::Kind::kSilent);
  GrpcTransport t(/*self=*/1, nullptr, PushStriping{.stripes = 1});
  ASSERT_THAT(t.SetPeers(peer.peers()), IsOk());
  const absl::Time t0 = absl::Now();
  std::shared_ptr<Sent> sent = SendAsync(t, Message(Values(1), 0), absl::Milliseconds(500));
  EXPECT_THAT(Wait(sent), StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
}

// An older worker without Gossip.Stream: each message goes as a Push, and after the first
// refusal no stream to it is tried again.
TEST(PushStream, APeerWithoutStreamsGetsPushCalls) {
  tern::testing::Watchdog watchdog(CurrentTest(), absl::Seconds(60));
  FakePeer peer(FakePeer::Kind::kPushOnly);
  GrpcTransport t(/*self=*/1, nullptr, PushStriping{.stripes = 1});
  ASSERT_THAT(t.SetPeers(peer.peers()), IsOk());
  EXPECT_THAT(Send(t, Message(Values(1), 0)), IsOk());
  EXPECT_THAT(Send(t, Message(Values(2), 1)), IsOk());
  EXPECT_THAT(Send(t, Message(Values(3), 2)), IsOk());
  EXPECT_EQ(peer.pushes(), 3);
  EXPECT_EQ(t.streams_opened(), 1);
}

// gRPC runs callbacks on a process-wide completion queue's threads and frees that queue when its
// last channel goes; a channel last dropped on one of those threads (by a push's call freed after
// the push counted as done) freed the queue under the thread itself, and the process aborted. Here
// the transport is the process's only gRPC user and goes the moment its push has ended, again and
// again, as a worker stopping at the end of a run does.
TEST(GrpcTransportShutdown, ATransportFreedAsItsLastPushEndsLeavesGrpcsThreadsSound) {
  for (int i = 0; i < 300; ++i) {
    auto t = std::make_unique<GrpcTransport>(/*self=*/1);
    ASSERT_THAT(t->SetPeers({"127.0.0.1:1", "127.0.0.1:2"}), IsOk());  // nobody listens
    std::vector<v1::BundleChunk> chunks(1);
    chunks[0].set_data("x");
    std::atomic<bool> done{false};
    t->Send(0, std::make_shared<const std::vector<v1::BundleChunk>>(std::move(chunks)),
            absl::Now() + absl::Seconds(10), PeerTransport::Reach::kOnce, [&](absl::Status s) {
              EXPECT_FALSE(s.ok());
              done = true;
            });
    while (!done) std::this_thread::yield();
    t.reset();  // waits for the push, then drops the channels
  }
}

// Gossip.State from a live diloco worker: the slices a joiner asks for, over the connections they
// name, make the state its whole answer is; asks that are not slices, of another run or far
// ahead are refused with a clear error while the worker goes on serving.
TEST(GossipState, SlicesMakeTheWholeStateAndBadAsksAreRefused) {
  tern::testing::Watchdog watchdog(CurrentTest(), absl::Seconds(90));
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  DaemonOptions o;
  o.engine.run_id = "run";
  o.engine.num_workers = 2;
  o.engine.topology = "complete";
  o.engine.algorithm = "diloco";
  o.engine.algorithm_options.local_steps = 4;
  o.engine.round_timeout = absl::Seconds(2);
  std::unique_ptr<WorkerDaemon> daemon = *WorkerDaemon::Start(o, &registries);
  const std::vector<std::string> peers = {absl::StrCat("127.0.0.1:", daemon->port()),
                                          "127.0.0.1:1"};
  ASSERT_THAT(daemon->SetPeers(peers), IsOk());
  const std::vector<float> x0 = Values(3);
  ASSERT_THAT(daemon->trainer().Register(Layout(), x0).status(), IsOk());
  GrpcTransport t(/*self=*/1, nullptr, PushStriping{.stripes = 2, .min_bytes = 1 << 20});
  ASSERT_THAT(t.SetPeers(peers), IsOk());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  // No step yet: asked for, it comes at the end of the next one (an inner step: no exchange).
  EXPECT_THAT(t.FetchState(0, "run", 0, 0, 1, deadline).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("ask again")));
  StepInput step;
  step.step = 0;
  const std::vector<float> zeros(kNumel, 0.0f);
  step.grad = zeros;
  StepOutcome out;
  ASSERT_THAT(daemon->trainer().Step(step, &out).status(), IsOk());
  absl::StatusOr<v1::TensorBundle> whole = t.FetchState(0, "run", 0, 0, 1, deadline);
  ASSERT_THAT(whole, IsOk());
  auto codecs = NewBuiltinCodecRegistry();
  absl::StatusOr<StateSlice> all = StateSliceFromBundle(*whole, "run", kNumel, 0, 1, *codecs);
  ASSERT_THAT(all, IsOk());
  EXPECT_EQ(all->step, 0);
  EXPECT_EQ(all->theta, x0);  // θ moves at the first exchange, not before
  std::vector<StateSlice> slices;
  for (uint32_t k = 0; k < 3; ++k) {
    absl::StatusOr<v1::TensorBundle> b = t.FetchState(0, "run", 0, k, 3, deadline);
    ASSERT_THAT(b, IsOk());
    absl::StatusOr<StateSlice> s = StateSliceFromBundle(*b, "run", kNumel, k, 3, *codecs);
    ASSERT_THAT(s, IsOk());
    EXPECT_EQ(s->crc, all->crc);
    slices.push_back(*std::move(s));
  }
  absl::StatusOr<GroupState> joined = JoinStateSlices(slices, kNumel, /*one_state=*/true);
  ASSERT_THAT(joined, IsOk());
  EXPECT_EQ(joined->theta, all->theta);
  EXPECT_EQ(joined->momentum, all->momentum);
  EXPECT_THAT(t.FetchState(0, "run", 0, 3, 3, deadline).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slice 3 of 3")));
  EXPECT_THAT(t.FetchState(0, "run", 0, 0, 65, deadline).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(t.FetchState(0, "other", 0, 0, 1, deadline).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("this worker is in 'run'")));
  EXPECT_THAT(t.FetchState(0, "run", int64_t{1} << 40, 0, 1, deadline).status(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("steps ahead")));
  EXPECT_THAT(t.FetchState(0, "run", 0, 1, 2, deadline), IsOk());  // still serving
  daemon->Shutdown(absl::Seconds(2));
}

}  // namespace
}  // namespace tern

#include "worker/trainer_port.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;
using ::testing::HasSubstr;

// A lone worker (no neighbours, so a step is a plain SGD step) behind its port.
struct Lone {
  Lone() {
    EngineOptions o;
    o.algorithm = "dpsgd";
    o.algorithm_options.codec = "none";
    engine = *RoundEngine::Create(o, &registries, nullptr);
    port = std::make_unique<TrainerPort>(
        TrainerPortOptions{.algorithm = "dpsgd",
                           .peers_known = [] { return false; },
                           .registered = [this](uint64_t n) { registered = n; }},
        engine.get());
  }
  static std::vector<ParamTensor> Layout() { return {{"w", {4}, 0, 4}}; }

  WorkerRegistries registries = NewBuiltinWorkerRegistries();
  std::unique_ptr<RoundEngine> engine;
  std::unique_ptr<TrainerPort> port;
  uint64_t registered = 0;
};

TEST(TrainerPort, ARegisteredModelStepsInPlaceAndTheStepSaysWhatItDid) {
  Lone l;
  const std::vector<float> x0 = {1, 2, 3, 4}, grad = {1, 1, 1, 1};
  StepInput in;
  in.lr = 0.5f;
  in.grad = grad;
  EXPECT_THAT(l.port->Step(in, nullptr).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("register")));
  absl::StatusOr<v1::RegisterReply> reply = l.port->Register(Lone::Layout(), x0);
  ASSERT_THAT(reply, IsOk());
  EXPECT_EQ(reply->algorithm(), "dpsgd");
  EXPECT_EQ(reply->step(), 0u);
  EXPECT_EQ(l.registered, 4u) << "the daemon hears of the model (stream budget, health)";
  std::vector<float> storage(4);
  ASSERT_THAT(l.port->BindParams(absl::MakeSpan(storage)), IsOk());
  StepOutcome out;
  absl::StatusOr<absl::Span<const float>> x = l.port->Step(in, &out);
  ASSERT_THAT(x, IsOk());
  EXPECT_EQ(x->data(), storage.data()) << "the parameters are written where they were bound";
  EXPECT_THAT(storage, ::testing::ElementsAre(0.5f, 1.5f, 2.5f, 3.5f));
  EXPECT_EQ(out.step, 0);
}

TEST(TrainerPort, ItRefusesWhatDoesNotFitAndEverythingOnceClosed) {
  Lone l;
  EXPECT_THAT(l.port->Register(Lone::Layout(), std::vector<float>(3)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layout says 4")));
  ASSERT_THAT(l.port->Register(Lone::Layout(), std::vector<float>(4)).status(), IsOk());
  const std::vector<float> short_grad(3);
  StepInput in;
  in.grad = short_grad;
  EXPECT_THAT(l.port->Step(in, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("3 values")));
  EXPECT_THAT(l.port->GradReady(0), StatusIs(absl::StatusCode::kFailedPrecondition));
  std::vector<float> small(2);
  EXPECT_THAT(l.port->BindParams(absl::MakeSpan(small)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  l.port->Close();
  const std::vector<float> grad(4);
  in.grad = grad;
  EXPECT_THAT(l.port->Step(in, nullptr).status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(l.port->BeginStep(in), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(l.port->Register(Lone::Layout(), std::vector<float>(4)).status(),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST(TrainerPort, ParametersASegmentHoldsAreNotBoundElsewhere) {
  Lone l;
  ASSERT_THAT(l.port->Register(Lone::Layout(), std::vector<float>(4, 1.0f)).status(), IsOk());
  std::vector<float> segment(4), other(4);
  l.port->RunExclusive([&] {
    l.port->AssertHeld();
    EXPECT_THAT(l.port->BindParamsLocked(absl::MakeSpan(segment), /*by_segment=*/true), IsOk());
  });
  EXPECT_THAT(l.port->BindParams(absl::MakeSpan(other)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("shared-memory")));
  l.port->RunExclusive([&] {
    l.port->AssertHeld();
    EXPECT_THAT(l.port->BindParamsLocked({}, /*by_segment=*/false), IsOk());
  });
  EXPECT_THAT(l.port->BindParams(absl::MakeSpan(other)), IsOk());
  EXPECT_THAT(other, ::testing::ElementsAre(1.0f, 1.0f, 1.0f, 1.0f));
}

// A transport to peers that are all starting: nobody has mixed an exchange yet.
class StartingPeers final : public PeerTransport {
 public:
  void Send(int, Chunks, absl::Time, Reach, std::function<void(absl::Status)> done) override {
    done(absl::UnavailableError("starting"));
  }
  absl::StatusOr<Position> AskPosition(int, const std::string&, int64_t, absl::Time) override {
    ++asked;
    return Position{};
  }
  std::atomic<int> asked{0};
};

TEST(TrainerPort, AWorkerThatMayBeRejoiningRegistersOnlyOnceItKnowsItsPeers) {
  WorkerRegistries registries = NewBuiltinWorkerRegistries();
  StartingPeers transport;
  EngineOptions o;
  o.algorithm = "diloco";
  o.topology = "complete";
  o.num_workers = 2;
  o.algorithm_options.codec = "none";
  auto engine = RoundEngine::Create(o, &registries, &transport);
  ASSERT_THAT(engine, IsOk());
  ASSERT_TRUE((*engine)->rejoins());
  std::atomic<bool> known{false};
  TrainerPort port(TrainerPortOptions{.num_workers = 2,
                                      .algorithm = "diloco",
                                      .peers_known = [&] { return known.load(); },
                                      .registered = nullptr},
                   engine->get());
  const absl::Time t0 = absl::Now();
  std::thread rendezvous([&] {
    absl::SleepFor(absl::Milliseconds(200));
    known = true;
  });
  ASSERT_THAT(port.Register({{"w", {4}, 0, 4}}, std::vector<float>(4, 1.f)).status(), IsOk());
  rendezvous.join();
  // It asked the peers where the group is, and only once it knew them.
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(200));
  EXPECT_EQ(transport.asked.load(), 1);
}

}  // namespace
}  // namespace tern

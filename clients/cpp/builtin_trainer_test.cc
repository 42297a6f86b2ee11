// The built-in trainer over both links: straight into the daemon, and through the Trainer
// service as an external trainer would. They must train exactly the same parameters.
#include "clients/cpp/builtin_trainer.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "clients/cpp/in_process_trainer_link.h"
#include "clients/cpp/trainer_link.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "worker/daemon.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;
using ::tern::testing::StatusIs;

constexpr int64_t kSteps = 6;

DaemonOptions OneWorker() {
  DaemonOptions o;
  o.engine.worker_id = 0;
  o.engine.num_workers = 1;
  o.engine.algorithm = "dmsgd";
  o.engine.lr.base = 0.05f;
  o.engine.final_step = kSteps;
  return o;
}

BuiltinTrainerOptions SmallRun() {
  BuiltinTrainerOptions t;
  t.model = "mlp:hidden=16";
  t.batch = 16;
  t.max_steps = kSteps;
  return t;
}

// Trains kSteps on a fresh one-worker daemon; returns its parameters after the last step.
std::vector<float> Train(bool in_process) {
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  auto d = WorkerDaemon::Start(OneWorker(), &registries);
  EXPECT_THAT(d.status(), IsOk());
  if (!d.ok()) return {};
  std::unique_ptr<TrainerLink> link =
      in_process ? NewInProcessTrainerLink(d->get())
                 : NewGrpcTrainerLink((*d)->InProcessChannel(), absl::Seconds(30));
  std::atomic<bool> stop{false};
  EXPECT_THAT(RunBuiltinTrainer(*link, SmallRun(), stop), IsOk());
  absl::StatusOr<std::vector<float>> x = (*d)->engine()->GetSnapshot(kSteps);
  EXPECT_THAT(x.status(), IsOk());
  (*d)->Shutdown(absl::Seconds(1));
  return x.ok() ? *x : std::vector<float>{};
}

TEST(BuiltinTrainer, InProcessAndGrpcLinksTrainExactlyTheSameParameters) {
  const std::vector<float> direct = Train(/*in_process=*/true);
  const std::vector<float> grpc = Train(/*in_process=*/false);
  ASSERT_FALSE(direct.empty());
  EXPECT_EQ(direct, grpc);
  EXPECT_EQ(direct.size(), 784u * 16 + 16 + 16 * 10 + 10);
}

TEST(InProcessTrainerLink, RefusesAStepBeforeRegisterAndAGradientOfTheWrongSize) {
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  auto d = WorkerDaemon::Start(OneWorker(), &registries);
  ASSERT_THAT(d.status(), IsOk());
  std::unique_ptr<TrainerLink> link = NewInProcessTrainerLink(d->get());
  std::vector<float> grad(3, 0.1f);
  TrainerStep s;
  s.grad = grad;
  EXPECT_THAT(link->Step(s).status(), StatusIs(absl::StatusCode::kFailedPrecondition));

  const std::vector<ParamTensor> layout = {{"w", {4}, 0, 4}};
  const std::vector<float> x0 = {1, 2, 3, 4};
  EXPECT_THAT(link->Register(layout, {1, 2}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT(link->Register(layout, x0).status(), IsOk());
  EXPECT_THAT(link->Step(s).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  grad.assign(4, 0.0f);
  s.grad = grad;
  absl::StatusOr<absl::Span<const float>> x = link->Step(s);
  ASSERT_THAT(x.status(), IsOk());
  EXPECT_THAT(*x, ::testing::ElementsAre(1, 2, 3, 4));  // a zero gradient moves nothing

  (*d)->Shutdown(absl::Seconds(1));
  EXPECT_THAT(link->Step(s).status(), StatusIs(absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace tern

// A trainer on the worker's host: the shared segment, its doorbell and Trainer.StepShared.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tern/v1/worker.grpc.pb.h"
#include "tests/testing/status_matchers.h"
#include "worker/daemon.h"

namespace tern {
namespace {

using ::tern::testing::IsOk;

// One D-PSGD worker alone: a step is x <- x - 0.5 g.
DaemonOptions Alone() {
  DaemonOptions o;
  o.engine.num_workers = 1;
  o.engine.algorithm = "dpsgd";
  o.engine.lr.base = 0.5f;
  return o;
}

class Doorbell {
 public:
  explicit Doorbell(const std::string& path) : fd_(socket(AF_UNIX, SOCK_SEQPACKET, 0)) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    connected_ = connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Doorbell() { close(fd_); }
  bool connected() const { return connected_; }
  // The reply's status byte and body.
  std::pair<int, std::string> Ring(const std::string& message) {
    if (send(fd_, message.data(), message.size(), MSG_NOSIGNAL) < 0) return {-1, ""};
    char buf[8192];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) return {-1, ""};
    return {static_cast<unsigned char>(buf[0]), std::string(buf + 1, static_cast<size_t>(n - 1))};
  }
  std::pair<int, std::string> Step(uint64_t step) {
    v1::StepInfo info;
    info.set_step(step);
    std::string message(1, 'S');
    message.append(info.SerializeAsString());
    return Ring(message);
  }

 private:
  const int fd_;
  bool connected_ = false;
};

TEST(WorkerDaemonSharedMemory, DoorbellAndStepSharedStepTheModelInPlaceAndRefuseBadRequests) {
  const WorkerRegistries registries = NewBuiltinWorkerRegistries();
  auto d = WorkerDaemon::Start(Alone(), &registries);
  ASSERT_THAT(d.status(), IsOk());
  const std::vector<ParamTensor> layout = {{"w", {4}, 0, 4}};
  ASSERT_THAT((*d)->trainer().Register(layout, {1, 2, 3, 4}).status(), IsOk());
  auto stub = v1::Trainer::NewStub((*d)->InProcessChannel());
  v1::SharedMemoryInfo info;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->OpenSharedMemory(&ctx, v1::OpenSharedMemoryRequest(), &info).ok());
  }
  ASSERT_FALSE(info.doorbell_path().empty());
  const int fd = open(info.path().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  void* map = mmap(nullptr, info.size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(map, MAP_FAILED);
  float* grad = reinterpret_cast<float*>(static_cast<char*>(map) + info.grad_offset());
  const float* params =
      reinterpret_cast<const float*>(static_cast<char*>(map) + info.params_offset());
  EXPECT_EQ(std::vector<float>(params, params + 4), (std::vector<float>{1, 2, 3, 4}));
  for (int i = 0; i < 4; ++i) grad[i] = 1.0f;

  Doorbell bell(info.doorbell_path());
  ASSERT_TRUE(bell.connected());
  auto [code, body] = bell.Step(0);
  ASSERT_EQ(code, 0) << body;
  v1::StepResult result;
  ASSERT_TRUE(result.ParseFromString(body));
  EXPECT_EQ(result.step(), 0u);
  EXPECT_GE(result.worker_seconds(), 0.0);
  // The model is the segment's parameter region: updated there, no copy to wait for.
  EXPECT_EQ(std::vector<float>(params, params + 4), (std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f}));

  // Trainer.StepShared does the same beside it.
  {
    grpc::ClientContext ctx;
    v1::StepInfo s;
    s.set_step(1);
    v1::StepResult r;
    ASSERT_TRUE(stub->StepShared(&ctx, s, &r).ok());
  }
  EXPECT_EQ(std::vector<float>(params, params + 4), (std::vector<float>{0, 1, 2, 3}));

  // Refused with a status and a message, the model untouched, the doorbell still serving.
  EXPECT_EQ(bell.Ring("X").first, static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(bell.Ring("S\xff\xff\xff").first, static_cast<int>(absl::StatusCode::kInvalidArgument));
  auto [late, why] = bell.Step(7);
  EXPECT_EQ(late, static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(why.find("next step is 2"), std::string::npos) << why;
  EXPECT_EQ(std::vector<float>(params, params + 4), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(bell.Step(2).first, 0);
  EXPECT_EQ(std::vector<float>(params, params + 4), (std::vector<float>{-0.5f, 0.5f, 1.5f, 2.5f}));

  // Shutting down moves the model back into the worker before the segment goes.
  (*d)->Shutdown(absl::Seconds(1));
  const absl::Span<const float> after = (*d)->engine()->params();
  EXPECT_EQ(std::vector<float>(after.begin(), after.end()),
            (std::vector<float>{-0.5f, 0.5f, 1.5f, 2.5f}));
  EXPECT_NE(after.data(), params);
  munmap(map, info.size());
}

}  // namespace
}  // namespace tern

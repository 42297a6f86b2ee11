// libtern_embedded.so (tern_embedded.h): `tern worker` inside a trainer's process, stepped on the
// trainer's thread through WorkerDaemon's in-process calls.
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "clients/embedded/tern_embedded.h"
#include "clients/flags/recipe_flags.h"
#include "clients/flags/worker_flags.h"
#include "common/c_error.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"
#include "tern/v1/tensor.pb.h"
#include "tern/v1/worker.pb.h"
#include "worker/daemon.h"
#include "worker/engine.h"

struct TernWorker {
  tern::WorkerRegistries registries;
  std::unique_ptr<tern::WorkerDaemon> daemon;
  absl::Span<float> params;  // the caller's, once registered
};

namespace tern {
namespace {

// The most values a model may have (as the Trainer service allows).
constexpr uint64_t kMaxParams = uint64_t{1} << 31;

int Fail(const absl::Status& s, char* error, size_t error_size) {
  return CErrorCode(s, error, error_size);
}

// Flags about the worker's own trainer or a scheduler client: the embedding process is the
// trainer, and membership comes from --peers.
constexpr const char* kNotEmbedded[] = {
    "trainer", "final_model", "snapshot_dir", "exit_after_training", "scheduler", "advertise"};

// One "--name=value" / "--name" / "--noname" into the process's flags; its name into `given`.
absl::Status SetFlag(absl::string_view arg, std::vector<std::string>* given) {
  if (!absl::ConsumePrefix(&arg, "--")) {
    return absl::InvalidArgumentError(absl::StrCat("'", arg, "' is not a --flag"));
  }
  std::string name(arg), value = "true";
  if (const size_t eq = arg.find('='); eq != absl::string_view::npos) {
    name = std::string(arg.substr(0, eq));
    value = std::string(arg.substr(eq + 1));
  } else if (absl::FindCommandLineFlag(name) == nullptr && absl::StartsWith(name, "no")) {
    name = name.substr(2);
    value = "false";
  }
  for (const char* n : kNotEmbedded) {
    if (name == n) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " does not apply to an embedded worker"));
    }
  }
  given->push_back(name);
  if (name == "log_level") return InitLogging(value);  // the tern binary's own flag
  absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
  std::string why;
  if (!flag->ParseFrom(value, &why)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, "=", value, ": ", why));
  }
  return absl::OkStatus();
}

absl::Status Start(const char* const* flags, int num_flags, TernWorker* w) {
  if (num_flags < 0 || (num_flags > 0 && flags == nullptr)) {
    return absl::InvalidArgumentError("flags is null");
  }
  std::vector<std::string> given;
  for (int i = 0; i < num_flags; ++i) {
    if (flags[i] == nullptr) return absl::InvalidArgumentError("a flag is null");
    TERN_RETURN_IF_ERROR(SetFlag(flags[i], &given));
  }
  TERN_RETURN_IF_ERROR(ApplyRecipe(RecipeSide::kPeers, given));
  TERN_ASSIGN_OR_RETURN(DaemonOptions options, WorkerDaemonOptionsFromFlags());
  w->registries = NewBuiltinWorkerRegistries();
  TERN_ASSIGN_OR_RETURN(w->daemon, WorkerDaemon::Start(std::move(options), &w->registries));
  // Before waiting for the peers file: whoever writes it may be waiting for this port.
  if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
    TERN_RETURN_IF_ERROR(WriteFileAtomically(path, absl::StrCat(w->daemon->port(), "\n")));
  }
  const int workers = absl::GetFlag(FLAGS_workers).value;
  TERN_ASSIGN_OR_RETURN(
      std::vector<std::string> peers,
      ReadPeers(absl::GetFlag(FLAGS_peers), absl::GetFlag(FLAGS_peers_file),
                absl::Seconds(absl::GetFlag(FLAGS_peers_timeout).value), [] { return false; }));
  if (workers > 1) {
    if (static_cast<int>(peers.size()) != workers) {
      return absl::InvalidArgumentError(
          absl::StrCat(peers.size(), " peer addresses for ", workers, " workers"));
    }
    TERN_RETURN_IF_ERROR(w->daemon->SetPeers(peers));
  }
  return absl::OkStatus();
}

absl::Status Register(TernWorker* w, const void* bundle, size_t bundle_size, float* params,
                      size_t num_params, uint64_t* step) {
  if (bundle == nullptr || params == nullptr || step == nullptr) {
    return absl::InvalidArgumentError("bundle, params or step is null");
  }
  v1::TensorBundle b;
  if (bundle_size > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !b.ParseFromArray(bundle, static_cast<int>(bundle_size))) {
    return absl::InvalidArgumentError("bundle: not a serialized tern.v1.TensorBundle");
  }
  TERN_ASSIGN_OR_RETURN(std::vector<ParamTensor> layout, LayoutFromBundle(b, kMaxParams));
  if (LayoutNumel(layout) != num_params) {
    return absl::InvalidArgumentError(
        absl::StrCat("the bundle holds ", LayoutNumel(layout), " values; params has ", num_params));
  }
  std::vector<float> x0(num_params);
  TERN_RETURN_IF_ERROR(BundleToFlat(b, layout, *w->registries.codecs, absl::MakeSpan(x0)));
  TERN_ASSIGN_OR_RETURN(v1::RegisterReply reply, w->daemon->trainer().Register(layout, x0));
  const absl::Span<float> storage(params, num_params);
  TERN_RETURN_IF_ERROR(w->daemon->trainer().BindParams(storage));
  w->params = storage;
  *step = reply.step();
  return absl::OkStatus();
}

absl::StatusOr<std::string> Step(TernWorker* w, const void* info, size_t info_size,
                                 const float* grad, size_t num_params) {
  if (w->params.data() == nullptr) return absl::FailedPreconditionError("register first");
  if (grad == nullptr || num_params != w->params.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the gradient has ", num_params, " values; the model has ", w->params.size()));
  }
  v1::StepInfo si;
  if ((info == nullptr && info_size > 0) ||
      info_size > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !si.ParseFromArray(info, static_cast<int>(info_size))) {
    return absl::InvalidArgumentError("info: not a serialized tern.v1.StepInfo");
  }
  StepInput in = StepInputOf(si);
  in.grad = absl::MakeConstSpan(grad, num_params);
  StepOutcome out;
  TERN_RETURN_IF_ERROR(w->daemon->trainer().Step(in, &out).status());
  return StepResultOf(out).SerializeAsString();
}

}  // namespace
}  // namespace tern

extern "C" {

int tern_worker_api_version(void) { return TERN_WORKER_API_VERSION; }

int tern_worker_start(const char* const* flags, int num_flags, TernWorker** out, char* error,
                      size_t error_size) {
  if (out == nullptr)
    return tern::Fail(absl::InvalidArgumentError("out is null"), error, error_size);
  auto w = std::make_unique<TernWorker>();
  if (absl::Status s = tern::Start(flags, num_flags, w.get()); !s.ok()) {
    if (w->daemon != nullptr) w->daemon->Shutdown(absl::ZeroDuration());
    return tern::Fail(s, error, error_size);
  }
  *out = w.release();
  return 0;
}

int tern_worker_port(const TernWorker* worker) {
  return worker == nullptr ? 0 : worker->daemon->port();
}

int tern_worker_register(TernWorker* worker, const void* bundle, size_t bundle_size, float* params,
                         size_t num_params, uint64_t* step, char* error, size_t error_size) {
  if (worker == nullptr) {
    return tern::Fail(absl::InvalidArgumentError("worker is null"), error, error_size);
  }
  absl::Status s = tern::Register(worker, bundle, bundle_size, params, num_params, step);
  return s.ok() ? 0 : tern::Fail(s, error, error_size);
}

int tern_worker_step(TernWorker* worker, const void* info, size_t info_size, const float* grad,
                     size_t num_params, void* result, size_t result_capacity, size_t* result_size,
                     char* error, size_t error_size) {
  if (worker == nullptr || result == nullptr || result_size == nullptr) {
    return tern::Fail(absl::InvalidArgumentError("worker, result or result_size is null"), error,
                      error_size);
  }
  absl::StatusOr<std::string> r = tern::Step(worker, info, info_size, grad, num_params);
  if (!r.ok()) return tern::Fail(r.status(), error, error_size);
  if (r->size() > result_capacity) {
    return tern::Fail(absl::ResourceExhaustedError(absl::StrCat(
                          "the result needs ", r->size(), " bytes; ", result_capacity, " given")),
                      error, error_size);
  }
  std::memcpy(result, r->data(), r->size());
  *result_size = r->size();
  return 0;
}

int tern_worker_buckets(const TernWorker* worker) {
  if (worker == nullptr || worker->params.data() == nullptr) return 1;
  return static_cast<int>(worker->daemon->engine()->BucketOffsets().size());
}

int tern_worker_begin_step(TernWorker* worker, uint64_t step, float lr, const float* grad,
                           size_t num_params, char* error, size_t error_size) {
  if (worker == nullptr || worker->params.data() == nullptr) {
    return tern::Fail(absl::FailedPreconditionError("register first"), error, error_size);
  }
  if (grad == nullptr || num_params != worker->params.size()) {
    return tern::Fail(
        absl::InvalidArgumentError(absl::StrCat("the gradient has ", num_params,
                                                " values; the model has ", worker->params.size())),
        error, error_size);
  }
  tern::StepInput in;
  in.step = static_cast<int64_t>(step);
  in.lr = lr;
  in.grad = absl::MakeConstSpan(grad, num_params);
  absl::Status s = worker->daemon->trainer().BeginStep(in);
  return s.ok() ? 0 : tern::Fail(s, error, error_size);
}

int tern_worker_grad_ready(TernWorker* worker, uint64_t from, char* error, size_t error_size) {
  if (worker == nullptr) {
    return tern::Fail(absl::InvalidArgumentError("worker is null"), error, error_size);
  }
  absl::Status s = worker->daemon->trainer().GradReady(from);
  return s.ok() ? 0 : tern::Fail(s, error, error_size);
}

void tern_worker_stop(TernWorker* worker) {
  if (worker == nullptr) return;
  // The engine first: a step waiting for neighbours returns at once.
  worker->daemon->engine()->Shutdown();
  worker->daemon->Shutdown(absl::Seconds(5));
  // Shutdown took the parameters back from a shared segment; from the caller's memory too.
  if (worker->params.data() != nullptr) {
    (void)worker->daemon->engine()->BindParams({});
  }
  delete worker;
}

}  // extern "C"

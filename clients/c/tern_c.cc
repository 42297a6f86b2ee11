#include "clients/c/tern_c.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/c_error.h"
#include "core/federated/client_model.h"
#include "core/federated/secagg.h"
#include "core/model/bundle.h"
#include "kernels/builtin.h"
#include "tern/v1/server.pb.h"
#include "tern/v1/tensor.pb.h"

struct TernClientModel {
  std::unique_ptr<tern::ClientModel> model;
};

struct TernSecAgg {
  tern::v1::Task task;
  std::optional<tern::SecAggClient> client;
};

namespace {

// The most values a model may have (as the C++ client's assembler allows).
constexpr uint64_t kMaxParams = uint64_t{1} << 31;

int Fail(const absl::Status& s, char* error, size_t error_size) {
  return tern::CErrorCode(s, error, error_size);
}

template <typename Message>
absl::Status Parse(const void* data, size_t size, const char* what, Message* m) {
  if (data == nullptr && size > 0) return absl::InvalidArgumentError(absl::StrCat(what, ": null"));
  if (size > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !m->ParseFromArray(data, static_cast<int>(size))) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": not a serialized ", m->GetTypeName(), " of ", size, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<tern::ClientModel>> NewModel(const void* data, size_t size) {
  tern::v1::TensorBundle b;
  if (absl::Status s = Parse(data, size, "the initial model", &b); !s.ok()) return s;
  absl::StatusOr<std::vector<tern::ParamTensor>> layout = tern::LayoutFromBundle(b, kMaxParams);
  if (!layout.ok()) return layout.status();
  std::vector<float> x(tern::LayoutNumel(*layout));
  const std::unique_ptr<tern::CodecRegistry> codecs = tern::NewBuiltinCodecRegistry();
  if (absl::Status s = tern::BundleToFlat(b, *layout, *codecs, absl::MakeSpan(x)); !s.ok()) {
    return s;
  }
  return tern::ClientModel::Create(*std::move(layout), std::move(x));
}

// `bytes` copied into malloc'd memory for the caller (tern_free).
int Give(std::string_view bytes, void** out, size_t* out_size, char* error, size_t error_size) {
  if (out == nullptr || out_size == nullptr) {
    return Fail(absl::InvalidArgumentError("out or out_size is null"), error, error_size);
  }
  void* p = std::malloc(std::max<size_t>(bytes.size(), 1));
  if (p == nullptr) return Fail(absl::ResourceExhaustedError("out of memory"), error, error_size);
  if (!bytes.empty()) std::memcpy(p, bytes.data(), bytes.size());
  *out = p;
  *out_size = bytes.size();
  return 0;
}

int GiveMessage(const google::protobuf::MessageLite& m, void** out, size_t* out_size, char* error,
                size_t error_size) {
  return Give(m.SerializeAsString(), out, out_size, error, error_size);
}

}  // namespace

extern "C" {

int tern_c_api_version(void) { return TERN_C_API_VERSION; }

int tern_client_model_new(const void* bundle, size_t bundle_size, TernClientModel** out,
                          char* error, size_t error_size) {
  if (out == nullptr) return Fail(absl::InvalidArgumentError("out is null"), error, error_size);
  *out = nullptr;
  absl::StatusOr<std::unique_ptr<tern::ClientModel>> m = NewModel(bundle, bundle_size);
  if (!m.ok()) return Fail(m.status(), error, error_size);
  *out = new TernClientModel{*std::move(m)};
  return 0;
}

void tern_client_model_free(TernClientModel* model) { delete model; }

int64_t tern_client_model_have_round(const TernClientModel* model) {
  return model->model->have_round();
}

uint32_t tern_client_model_have_crc32(const TernClientModel* model) {
  return model->model->have_crc32();
}

int tern_client_model_have_optimizer_state(const TernClientModel* model) {
  return model->model->have_optimizer_state() ? 1 : 0;
}

size_t tern_client_model_size(const TernClientModel* model) {
  return model->model->values().size();
}

const float* tern_client_model_values(const TernClientModel* model) {
  return model->model->values().data();
}

int tern_client_model_update(TernClientModel* model, const void* task, size_t task_size,
                             const void* payload, size_t payload_size, int* usable, char* error,
                             size_t error_size) {
  tern::v1::Task t;
  tern::v1::TensorBundle b;
  absl::Status s = Parse(task, task_size, "the task", &t);
  if (s.ok()) s = Parse(payload, payload_size, "the payload", &b);
  if (s.ok() && t.kind() != tern::v1::Task::TRAIN) {
    s = absl::InvalidArgumentError("the task is not a TRAIN task: it carries no model");
  }
  if (!s.ok()) return Fail(s, error, error_size);
  absl::StatusOr<bool> ok = model->model->Update(t, std::move(b));
  if (!ok.ok()) return Fail(ok.status(), error, error_size);
  if (usable != nullptr) *usable = *ok ? 1 : 0;
  return 0;
}

const char* tern_client_model_why_not(const TernClientModel* model) {
  return model->model->why_not().c_str();
}

int tern_client_model_encode(TernClientModel* model, const void* task, size_t task_size,
                             int64_t client_id, uint64_t num_examples, const float* update,
                             size_t n, void** out, size_t* out_size, char* error,
                             size_t error_size) {
  if (out == nullptr || out_size == nullptr || (update == nullptr && n > 0)) {
    return Fail(absl::InvalidArgumentError("out, out_size or update is null"), error, error_size);
  }
  *out = nullptr;
  *out_size = 0;
  tern::v1::Task t;
  if (absl::Status s = Parse(task, task_size, "the task", &t); !s.ok()) {
    return Fail(s, error, error_size);
  }
  absl::StatusOr<tern::v1::TensorBundle> b =
      model->model->EncodeUpdate(t, client_id, num_examples, absl::MakeConstSpan(update, n));
  if (!b.ok()) return Fail(b.status(), error, error_size);
  const size_t size = b->ByteSizeLong();
  if (size > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return Fail(absl::ResourceExhaustedError(
                    absl::StrCat("the update encodes to ", size, " bytes, over protobuf's 2 GiB")),
                error, error_size);
  }
  void* bytes = std::malloc(std::max<size_t>(size, 1));
  if (bytes == nullptr) {
    return Fail(absl::ResourceExhaustedError("out of memory"), error, error_size);
  }
  if (!b->SerializeToArray(bytes, static_cast<int>(size))) {
    std::free(bytes);
    return Fail(absl::InternalError("the update does not serialize"), error, error_size);
  }
  *out = bytes;
  *out_size = size;
  return 0;
}

int tern_client_model_set_exact(TernClientModel* model, const uint8_t* flags, size_t n, char* error,
                                size_t error_size) {
  if (flags == nullptr && n > 0) {
    return Fail(absl::InvalidArgumentError("flags is null"), error, error_size);
  }
  std::vector<bool> exact(n);
  for (size_t i = 0; i < n; ++i) exact[i] = flags[i] != 0;
  absl::Status s = model->model->SetExactTensors(std::move(exact));
  return s.ok() ? 0 : Fail(s, error, error_size);
}

int tern_secagg_new(const void* task, size_t task_size, int64_t client_id, TernSecAgg** out,
                    char* error, size_t error_size) {
  if (out == nullptr) return Fail(absl::InvalidArgumentError("out is null"), error, error_size);
  *out = nullptr;
  auto s = std::make_unique<TernSecAgg>();
  if (absl::Status p = Parse(task, task_size, "the task", &s->task); !p.ok()) {
    return Fail(p, error, error_size);
  }
  if (!s->task.has_secagg()) {
    return Fail(absl::InvalidArgumentError("the task has no secure aggregation (Task.secagg)"),
                error, error_size);
  }
  if (client_id < 0 || client_id > std::numeric_limits<uint32_t>::max()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("client id ", client_id)), error,
                error_size);
  }
  absl::StatusOr<tern::SecAggClient> c = tern::SecAggClient::Start(
      s->task.secagg(), static_cast<uint32_t>(client_id), s->task.round());
  if (!c.ok()) return Fail(c.status(), error, error_size);
  s->client.emplace(*std::move(c));
  *out = s.release();
  return 0;
}

void tern_secagg_free(TernSecAgg* secagg) { delete secagg; }

int tern_secagg_keys(TernSecAgg* secagg, void** out, size_t* out_size, char* error,
                     size_t error_size) {
  if (secagg == nullptr) return Fail(absl::InvalidArgumentError("null"), error, error_size);
  return GiveMessage(secagg->client->Keys(), out, out_size, error, error_size);
}

int tern_secagg_share(TernSecAgg* secagg, const void* neighbours, size_t neighbours_size,
                      void** out, size_t* out_size, char* error, size_t error_size) {
  if (secagg == nullptr) return Fail(absl::InvalidArgumentError("null"), error, error_size);
  tern::v1::SecAggKeysReply reply;
  if (absl::Status s = Parse(neighbours, neighbours_size, "the neighbours", &reply); !s.ok()) {
    return Fail(s, error, error_size);
  }
  absl::StatusOr<tern::v1::SecAggShares> shares = secagg->client->Share(reply);
  if (!shares.ok()) return Fail(shares.status(), error, error_size);
  return GiveMessage(*shares, out, out_size, error, error_size);
}

int tern_secagg_mask(TernSecAgg* secagg, const void* shares, size_t shares_size,
                     const float* update, size_t n, void** out, size_t* out_size, char* error,
                     size_t error_size) {
  if (secagg == nullptr || (update == nullptr && n > 0)) {
    return Fail(absl::InvalidArgumentError("secagg or update is null"), error, error_size);
  }
  tern::v1::SecAggSharesReply reply;
  if (absl::Status s = Parse(shares, shares_size, "the shares", &reply); !s.ok()) {
    return Fail(s, error, error_size);
  }
  // DP-FedAvg under secure aggregation: the clip is the client's alone to make.
  absl::Span<const float> clear(update, n);
  std::vector<float> clipped;
  tern::DpClip(secagg->task, &clear, &clipped);
  absl::StatusOr<std::string> masked = secagg->client->Mask(reply, clear);
  if (!masked.ok()) return Fail(masked.status(), error, error_size);
  return Give(*masked, out, out_size, error, error_size);
}

int tern_secagg_reveal(TernSecAgg* secagg, const void* unmask, size_t unmask_size, void** out,
                       size_t* out_size, char* error, size_t error_size) {
  if (secagg == nullptr) return Fail(absl::InvalidArgumentError("null"), error, error_size);
  tern::v1::SecAggUnmaskRequest request;
  if (absl::Status s = Parse(unmask, unmask_size, "the unmask request", &request); !s.ok()) {
    return Fail(s, error, error_size);
  }
  absl::StatusOr<tern::v1::SecAggReveal> reveal = secagg->client->Reveal(request);
  if (!reveal.ok()) return Fail(reveal.status(), error, error_size);
  return GiveMessage(*reveal, out, out_size, error, error_size);
}

void tern_free(void* p) { std::free(p); }

}  // extern "C"

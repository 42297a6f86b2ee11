#include "core/federated/client_model.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/crc32.h"
#include "common/status_macros.h"
#include "core/federated/protocol.h"
#include "kernels/builtin.h"
#include "kernels/wire.h"

namespace tern {

ClientModel::ClientModel(std::vector<ParamTensor> layout, std::vector<float> initial)
    : layout_(std::move(layout)),
      codecs_(NewBuiltinCodecRegistry()),
      values_(std::move(initial)),
      tensor_codecs_(codecs_.get()) {
  have_crc_ = Crc32(values_.data(), 4 * values_.size());
}

absl::StatusOr<std::unique_ptr<ClientModel>> ClientModel::Create(std::vector<ParamTensor> layout,
                                                                 std::vector<float> initial) {
  if (layout.empty()) return absl::InvalidArgumentError("the model has no tensors");
  if (initial.size() != LayoutNumel(layout)) {
    return absl::InvalidArgumentError(absl::StrCat("the initial model has ", initial.size(),
                                                   " values; its layout ", LayoutNumel(layout)));
  }
  return absl::WrapUnique(new ClientModel(std::move(layout), std::move(initial)));
}

absl::StatusOr<bool> ClientModel::Update(const v1::Task& task, v1::TensorBundle payload) {
  absl::StatusOr<bool> usable = Apply(task, std::move(payload));
  if (!usable.ok()) have_round_ = -1;  // the copy may be half-written: ask for the model
  return usable;
}

absl::StatusOr<bool> ClientModel::Apply(const v1::Task& task, v1::TensorBundle payload) {
  const bool onebit = InOnebitPhase(task);
  const absl::Span<float> x = absl::MakeSpan(values_);
  if (task.payload() == v1::Task::DELTAS) {
    if (task.delta_from() != have_round_ || have_round_ < 0) {
      why_not_ = absl::StrCat("updates from round ", task.delta_from(), " for a copy of round ",
                              have_round_);
      have_round_ = -1;  // ask for the model
      return false;
    }
    if (onebit) {
      if (!have_adam_) return absl::DataLossError("1-bit updates without the optimizer state");
      TERN_RETURN_IF_ERROR(ApplyOnebitDeltas(payload, layout_, *codecs_, task, &adam_, x));
    } else {
      TERN_RETURN_IF_ERROR(ApplyDeltas(payload, layout_, *codecs_, x));
    }
  } else {
    TERN_ASSIGN_OR_RETURN(have_adam_, TakeOptimizerState(layout_, *codecs_, &payload, &adam_));
    TERN_RETURN_IF_ERROR(BundleToFlat(payload, layout_, *codecs_, x));
  }
  if (onebit && !have_adam_) {
    return absl::DataLossError("the server sent no optimizer state for 1-bit Adam");
  }
  have_round_ = -1;                          // unless the copy is known to be exact
  if (task.model_crc32() == 0) return true;  // a lossy model: nothing to check
  have_crc_ = Crc32(values_.data(), 4 * values_.size());
  if (have_crc_ != task.model_crc32()) {
    why_not_ = "the copy fails its CRC";
    return false;
  }
  have_round_ = static_cast<int64_t>(task.round()) - 1;
  return true;
}

std::optional<bool> DpClip(const v1::Task& task, absl::Span<const float>* update,
                           std::vector<float>* storage) {
  const float clip = task.dp_clip();
  if (!(clip > 0)) return std::nullopt;
  double sq = 0;
  for (float v : *update) sq += static_cast<double>(v) * v;
  const double norm = std::sqrt(sq);
  if (norm <= clip) return true;
  const float scale = static_cast<float>(clip / norm);
  storage->resize(update->size());
  for (size_t i = 0; i < update->size(); ++i) (*storage)[i] = (*update)[i] * scale;
  *update = *storage;
  return false;
}

uint64_t ClientModel::EncodeSeed(const v1::Task& task, int64_t client_id) {
  return task.seed() ^ (task.round() << 24) ^ (static_cast<uint64_t>(client_id) << 48) ^
         (static_cast<uint64_t>(task.attempt()) << 40);
}

absl::StatusOr<v1::TensorBundle> ClientModel::EncodeUpdate(const v1::Task& task, int64_t client_id,
                                                           uint64_t num_examples,
                                                           absl::Span<const float> update) {
  if (update.size() != values_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the update has ", update.size(), " values; the model has ", values_.size()));
  }
  // DP-FedAvg: what leaves the client is within the clip norm (the server refuses more).
  std::vector<float> clipped;
  const std::optional<bool> within = DpClip(task, &update, &clipped);
  absl::StatusOr<v1::TensorBundle> b = EncodeWithin(task, client_id, num_examples, update);
  if (b.ok() && within.has_value()) b->set_dp_within_clip(*within);
  return b;
}

absl::StatusOr<v1::TensorBundle> ClientModel::EncodeWithin(const v1::Task& task, int64_t client_id,
                                                           uint64_t num_examples,
                                                           absl::Span<const float> update) {
  EncodeOptions eo;
  eo.seed = EncodeSeed(task, client_id);
  const std::string& mem = task.memory();
  if (mem.rfind("dgc", 0) == 0) {
    // Epochs of this client's data seen before this round (DGC's warm-up schedule).
    const double epoch = num_examples == 0 ? 0.0
                                           : static_cast<double>(task.round() - 1) *
                                                 std::max<uint32_t>(1, TaskBatch(task)) /
                                                 static_cast<double>(num_examples);
    return EncodeDgc(task, update, epoch, eo);
  }
  const absl::Span<const float> raw = update;
  std::vector<float> sent;
  if (mem.rfind("momentum", 0) == 0) {
    TERN_ASSIGN_OR_RETURN(const float beta, ParseMomentumMemory(mem));
    if (momentum_.size() != update.size()) momentum_.assign(update.size(), 0.0f);
    for (size_t i = 0; i < update.size(); ++i) {
      momentum_[i] = beta * momentum_[i] + (1 - beta) * raw[i];
    }
    update = momentum_;
    if (!exact_.empty()) {
      // State training sets goes as it is (SetExactTensors), not averaged over rounds.
      sent.assign(momentum_.begin(), momentum_.end());
      for (size_t i = 0; i < layout_.size(); ++i) {
        if (!exact_[i]) continue;
        const ParamTensor& p = layout_[i];
        std::copy_n(raw.begin() + static_cast<ptrdiff_t>(p.offset), p.numel,
                    sent.begin() + static_cast<ptrdiff_t>(p.offset));
      }
      update = sent;
    }
  }
  const bool ef = task.error_feedback() || mem == "ef";
  if (ef && residual_.size() != update.size()) residual_.assign(update.size(), 0.0f);
  if (const float decay = task.residual_decay(); !(decay >= 0 && decay <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the task's residual decay is ", decay, "; it must be in [0, 1]"));
  } else if (ef && decay != 0 && decay != 1) {
    // SparseLoCo's e = beta e + update: the residual is its outer momentum.
    for (float& e : residual_) e *= decay;
  }
  TERN_RETURN_IF_ERROR(tensor_codecs_.Use(task.update_codec(), layout_.size()));
  return EncodeFlatToBundle(layout_, update, tensor_codecs_, eo, ef ? &residual_ : nullptr, exact_);
}

absl::Status ClientModel::SetExactTensors(std::vector<bool> exact) {
  if (!exact.empty() && exact.size() != layout_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(exact.size(), " flags for a model of ", layout_.size(), " tensors"));
  }
  exact_ = std::move(exact);
  return absl::OkStatus();
}

absl::StatusOr<v1::TensorBundle> ClientModel::EncodeDgc(const v1::Task& task,
                                                        absl::Span<const float> update,
                                                        double epoch, const EncodeOptions& eo) {
  if (dgc_.size() != layout_.size()) {
    TERN_ASSIGN_OR_RETURN(DgcOptions opts,
                          ParseDgcMemory(task.memory(), static_cast<int>(std::max<uint32_t>(
                                                            1, task.round_clients()))));
    dgc_.clear();
    for (size_t i = 0; i < layout_.size(); ++i) {
      TERN_ASSIGN_OR_RETURN(std::unique_ptr<DgcMemory> m, DgcMemory::Create(opts));
      dgc_.push_back(std::move(m));
    }
  }
  v1::TensorBundle b;
  for (size_t i = 0; i < layout_.size(); ++i) {
    const ParamTensor& p = layout_[i];
    if (i < exact_.size() && exact_[i]) {
      TERN_RETURN_IF_ERROR(ExactTensor(p, update, b.add_tensors()));
      continue;
    }
    dgc_[i]->SetEpoch(epoch);
    EncodedTensor t;
    EncodeOptions o = eo;
    o.seed = eo.seed + i;
    TERN_RETURN_IF_ERROR(dgc_[i]->Encode(update.subspan(p.offset, p.numel), o, &t));
    v1::NamedTensor* nt = b.add_tensors();
    nt->set_name(p.name);
    nt->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
    ToProto(std::move(t), nt->mutable_tensor());
    for (int64_t d : p.shape) nt->mutable_tensor()->add_shape(d);
  }
  return b;
}

}  // namespace tern

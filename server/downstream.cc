#include "server/downstream.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"

namespace tern {
namespace {

// Whether x + y is finite everywhere.
bool SumIsFinite(absl::Span<const float> x, absl::Span<const float> y) {
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i] + y[i])) return false;
  }
  return true;
}

}  // namespace

ModelDownstream::ModelDownstream(const CodecRegistry* codecs, std::string codec)
    : codecs_(codecs), codec_(std::move(codec)) {}

absl::StatusOr<bool> ModelDownstream::Apply(absl::Span<const float> step, int64_t,
                                            std::vector<float>* model) {
  if (step.size() != model->size()) return absl::InvalidArgumentError("step size mismatch");
  // Updates are finite, but enough huge ones could still overflow the model.
  if (!SumIsFinite(*model, step)) return false;
  for (size_t i = 0; i < step.size(); ++i) (*model)[i] += step[i];
  return true;
}

absl::StatusOr<v1::TensorBundle> ModelDownstream::Payload(int64_t, const std::vector<float>& model,
                                                          const v1::TensorBundle& exact,
                                                          uint64_t seed) const {
  if (this->exact()) return exact;
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, codecs_->Create(codec_));
  EncodeOptions eo;
  eo.seed = seed;
  return EncodeFlatToBundle(layout_, model, *codec, eo, nullptr);
}

absl::Status ModelDownstream::Restore(const internal::DownstreamState& state) {
  if (state.residual_size() != 0 || state.codec_state_size() != 0) {
    return absl::DataLossError("a model downstream has no residual or codec state");
  }
  return absl::OkStatus();
}

DeltaDownstream::DeltaDownstream(const CodecRegistry* codecs, std::string codec, uint64_t seed,
                                 int keep)
    : codecs_(codecs),
      codec_(std::move(codec)),
      tensor_codecs_(codecs),
      seed_(seed),
      keep_(std::max(1, keep)) {}

void DeltaDownstream::Reset(const std::vector<ParamTensor>& layout) {
  layout_ = layout;
  residual_.assign(LayoutNumel(layout), 0.0f);
  exact_.assign(layout.size(), false);
  deltas_.clear();
  deltas_bytes_ = 0;
  tensor_codecs_.Clear();
}

absl::StatusOr<bool> DeltaDownstream::Apply(absl::Span<const float> step, int64_t round,
                                            std::vector<float>* model) {
  if (step.size() != model->size() || step.size() != size()) {
    return absl::InvalidArgumentError("step size mismatch");
  }
  if (!SumIsFinite(*model, step) || !SumIsFinite(step, residual_)) return false;
  // The model moves by exactly what clients will decode.
  TERN_ASSIGN_OR_RETURN(Encoded e, Encode(step, round));
  if (!SumIsFinite(*model, e.decoded)) return false;
  for (size_t i = 0; i < size(); ++i) (*model)[i] += e.decoded[i];
  Keep(std::move(e), round);
  return true;
}

absl::StatusOr<DeltaDownstream::Encoded> DeltaDownstream::Encode(absl::Span<const float> values,
                                                                 int64_t round) const {
  std::vector<float> target(size());
  for (size_t i = 0; i < size(); ++i) target[i] = values[i] + residual_[i];
  TERN_RETURN_IF_ERROR(tensor_codecs_.Use(codec_, layout_.size()));
  EncodeOptions eo;
  eo.seed = seed_ ^ (static_cast<uint64_t>(round) << 20) ^ 0x5eed;
  Encoded e;
  e.residual.assign(size(), 0.0f);
  TERN_ASSIGN_OR_RETURN(
      e.bundle, EncodeFlatToBundle(layout_, target, tensor_codecs_, eo, &e.residual, exact_));
  // Decode again rather than target - residual: clients decode, then use in float, tensor by
  // tensor, and the server must land on their values bit for bit.
  e.decoded.assign(size(), 0.0f);
  TERN_RETURN_IF_ERROR(BundleToFlat(e.bundle, layout_, *codecs_, absl::MakeSpan(e.decoded)));
  return e;
}

void DeltaDownstream::MarkExact(size_t tensor) {
  if (tensor < exact_.size()) exact_[tensor] = true;
}

void DeltaDownstream::Keep(Encoded e, int64_t round) {
  residual_ = std::move(e.residual);
  Delta dl;
  dl.round = round;
  dl.payload_bytes = PayloadBytes(e.bundle);
  for (v1::NamedTensor& t : *e.bundle.mutable_tensors()) {
    t.set_name(absl::StrCat(round, ":", t.name()));
    dl.tensors.push_back(std::move(t));
  }
  deltas_bytes_ += dl.payload_bytes;
  deltas_.push_back(std::move(dl));
  // The oldest update is useful only to a client just before it, who would need every later one
  // too: once those alone cost as much as the model, it never will be sent.
  while (!deltas_.empty() && (deltas_.size() > static_cast<size_t>(keep_) ||
                              deltas_bytes_ - deltas_.front().payload_bytes >= 4 * size())) {
    deltas_bytes_ -= deltas_.front().payload_bytes;
    deltas_.pop_front();
  }
}

int64_t DeltaDownstream::CatchUpFrom(int64_t have_round, int64_t latest) const {
  if (have_round < 0 || have_round > latest) return -1;
  if (have_round == latest) return have_round;  // nothing to send but the task
  if (deltas_.empty() || deltas_.front().round > have_round + 1) return -1;
  uint64_t bytes = 0;
  for (const Delta& dl : deltas_) {
    if (dl.round > have_round) bytes += dl.payload_bytes;
  }
  return bytes < 4 * size() ? have_round : -1;
}

absl::StatusOr<v1::TensorBundle> DeltaDownstream::Payload(int64_t from, const std::vector<float>&,
                                                          const v1::TensorBundle& exact,
                                                          uint64_t) const {
  if (from < 0) return exact;
  v1::TensorBundle b;
  for (const Delta& dl : deltas_) {
    if (dl.round <= from) continue;
    for (const v1::NamedTensor& t : dl.tensors) *b.add_tensors() = t;
  }
  return b;
}

void DeltaDownstream::Save(internal::DownstreamState* state) const {
  state->mutable_residual()->Add(residual_.begin(), residual_.end());
  bool any = false;
  std::vector<std::string> codec_state(tensor_codecs_.size());
  for (size_t i = 0; i < tensor_codecs_.size(); ++i) {
    codec_state[i] = tensor_codecs_.at(i).SaveEncoderState();
    any = any || !codec_state[i].empty();
  }
  if (any) {
    for (std::string& c : codec_state) state->add_codec_state(std::move(c));
  }
}

absl::Status DeltaDownstream::Restore(const internal::DownstreamState& state) {
  if (state.residual_size() == 0) return absl::OkStatus();
  if (static_cast<size_t>(state.residual_size()) != size()) {
    return absl::DataLossError("the server residual does not match the model");
  }
  residual_.assign(state.residual().begin(), state.residual().end());
  if (state.codec_state_size() == 0) return absl::OkStatus();
  if (static_cast<size_t>(state.codec_state_size()) != layout_.size()) {
    return absl::DataLossError(absl::StrCat("the downstream codec's state has ",
                                            state.codec_state_size(), " tensors; the model has ",
                                            layout_.size()));
  }
  TERN_RETURN_IF_ERROR(tensor_codecs_.Use(codec_, layout_.size()));
  for (size_t i = 0; i < layout_.size(); ++i) {
    if (absl::Status s = tensor_codecs_.at(i).RestoreEncoderState(state.codec_state(i)); !s.ok()) {
      return absl::DataLossError(
          absl::StrCat("the downstream codec's state of tensor ", i, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tern

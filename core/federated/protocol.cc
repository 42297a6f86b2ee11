#include "core/federated/protocol.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"
#include "kernels/wire.h"

namespace tern {
namespace {

// The model tensor a DELTAS payload's tensor "<round>:<name>" is for.
absl::StatusOr<const ParamTensor*> DeltaTensor(const v1::NamedTensor& nt,
                                               const std::vector<ParamTensor>& layout) {
  const size_t colon = nt.name().find(':');
  const std::string name = colon == std::string::npos ? "" : nt.name().substr(colon + 1);
  auto p = std::find_if(layout.begin(), layout.end(),
                        [&](const ParamTensor& t) { return t.name == name; });
  if (p == layout.end() || nt.tensor().numel() != p->numel) {
    return absl::InvalidArgumentError(
        absl::StrCat("update tensor '", nt.name(), "' does not match the model"));
  }
  return &*p;
}

constexpr char kStateM[] = "adam.m/";
constexpr char kStateV[] = "adam.v/";
constexpr char kStateRatio[] = "adam.ratio";

std::vector<ParamTensor> RatioLayout(size_t tensors) {
  ParamTensor p;
  p.name = kStateRatio;
  p.shape = {static_cast<int64_t>(tensors)};
  p.numel = tensors;
  return {p};
}

}  // namespace

bool InOnebitPhase(const v1::Task& task) {
  return task.has_gradient() && IsOnebitOptimizer(task.gradient().optimizer()) &&
         task.round() > task.gradient().warmup_rounds();
}

uint32_t TaskBatch(const v1::Task& task) {
  return task.has_gradient() ? task.gradient().batch() : task.local().batch();
}

absl::Status ApplyDeltas(const v1::TensorBundle& b, const std::vector<ParamTensor>& layout,
                         const CodecRegistry& codecs, absl::Span<float> x) {
  std::vector<float> scratch;
  for (const v1::NamedTensor& nt : b.tensors()) {
    TERN_ASSIGN_OR_RETURN(const ParamTensor* p, DeltaTensor(nt, layout));
    scratch.resize(p->numel);
    TERN_RETURN_IF_ERROR(DecodeMessage(codecs, nt.tensor(), absl::MakeSpan(scratch)));
    for (size_t i = 0; i < p->numel; ++i) x[p->offset + i] += scratch[i];
  }
  return absl::OkStatus();
}

absl::Status ApplyOnebitDeltas(const v1::TensorBundle& b, const std::vector<ParamTensor>& layout,
                               const CodecRegistry& codecs, const v1::Task& task, AdamState* state,
                               absl::Span<float> x) {
  if (state->m.size() != x.size() || state->v.size() != x.size() ||
      state->ratio.size() != layout.size()) {
    return absl::FailedPreconditionError("the optimizer state does not match the model");
  }
  for (const v1::NamedTensor& nt : b.tensors()) {
    TERN_ASSIGN_OR_RETURN(const ParamTensor* p, DeltaTensor(nt, layout));
    absl::Span<float> m = absl::MakeSpan(state->m).subspan(p->offset, p->numel);
    TERN_RETURN_IF_ERROR(DecodeMessage(codecs, nt.tensor(), m));
    FrozenAdamStep(task.gradient().lr(), state->ratio[static_cast<size_t>(p - layout.data())],
                   task.gradient().eps(), m,
                   absl::MakeConstSpan(state->v).subspan(p->offset, p->numel),
                   x.subspan(p->offset, p->numel));
  }
  return absl::OkStatus();
}

absl::Status AppendOptimizerState(const std::vector<ParamTensor>& layout, const AdamState& state,
                                  v1::TensorBundle* b) {
  for (const auto& [prefix, values] :
       {std::pair{kStateM, &state.m}, std::pair{kStateV, &state.v}}) {
    TERN_ASSIGN_OR_RETURN(v1::TensorBundle part, FlatToBundle(layout, *values));
    for (v1::NamedTensor& t : *part.mutable_tensors()) {
      t.set_name(absl::StrCat(prefix, t.name()));
      *b->add_tensors() = std::move(t);
    }
  }
  TERN_ASSIGN_OR_RETURN(v1::TensorBundle r, FlatToBundle(RatioLayout(layout.size()), state.ratio));
  *b->add_tensors() = std::move(*r.mutable_tensors(0));
  return absl::OkStatus();
}

absl::StatusOr<bool> TakeOptimizerState(const std::vector<ParamTensor>& layout,
                                        const CodecRegistry& codecs, v1::TensorBundle* b,
                                        AdamState* state) {
  v1::TensorBundle model, m, v, ratio;
  for (v1::NamedTensor& t : *b->mutable_tensors()) {
    const std::string& n = t.name();
    v1::TensorBundle* dst = &model;
    if (n.rfind(kStateM, 0) == 0) {
      t.set_name(n.substr(sizeof(kStateM) - 1));
      dst = &m;
    } else if (n.rfind(kStateV, 0) == 0) {
      t.set_name(n.substr(sizeof(kStateV) - 1));
      dst = &v;
    } else if (n == kStateRatio) {
      dst = &ratio;
    }
    *dst->add_tensors() = std::move(t);
  }
  b->mutable_tensors()->Swap(model.mutable_tensors());
  if (m.tensors_size() == 0 && v.tensors_size() == 0 && ratio.tensors_size() == 0) return false;
  const size_t d = LayoutNumel(layout);
  AdamState st;
  st.Reset(d, layout.size());
  TERN_RETURN_IF_ERROR(BundleToFlat(m, layout, codecs, absl::MakeSpan(st.m)));
  TERN_RETURN_IF_ERROR(BundleToFlat(v, layout, codecs, absl::MakeSpan(st.v)));
  TERN_RETURN_IF_ERROR(
      BundleToFlat(ratio, RatioLayout(layout.size()), codecs, absl::MakeSpan(st.ratio)));
  for (float x : st.v) {
    if (!(x >= 0) || !std::isfinite(x)) return absl::InvalidArgumentError("bad frozen variance");
  }
  *state = std::move(st);
  return true;
}

absl::Status CheckEvaluation(const v1::Evaluation& e) {
  if (e.examples() > 0 && e.examples() <= 1e12 && std::isfinite(e.loss()) && e.accuracy() >= 0 &&
      e.accuracy() <= 1) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "evaluation (", e.examples(), " examples, loss ", e.loss(), ", accuracy ", e.accuracy(),
      ") needs examples in (0, 1e12], a finite loss and accuracy in [0, 1]"));
}

absl::StatusOr<DgcOptions> ParseDgcMemory(const std::string& spec, int num_workers) {
  TERN_ASSIGN_OR_RETURN(auto parsed, SpecParams::ParseSpec(spec));
  auto& [name, params] = parsed;
  if (name != "dgc") {
    return absl::InvalidArgumentError(absl::StrCat("unknown client memory '", spec,
                                                   "' (ef, dgc[:ratio=...], momentum[:beta=B])"));
  }
  DgcOptions o;
  TERN_ASSIGN_OR_RETURN(o.ratio, params.Double("ratio", 0.001, 1e-6, 1.0));
  TERN_ASSIGN_OR_RETURN(o.momentum, params.Double("momentum", 0.9, 0.0, 0.999));
  TERN_ASSIGN_OR_RETURN(o.clip_norm, params.Double("clip", 0.0, 0.0, 1e9));
  TERN_ASSIGN_OR_RETURN(o.warmup_epochs, params.Double("warmup", 4.0, 0.0, 1e6));
  TERN_ASSIGN_OR_RETURN(o.exact_topk, params.Bool("exact", false));
  TERN_RETURN_IF_ERROR(params.CheckAllUsed("dgc memory"));
  o.num_workers = std::max(1, num_workers);
  return o;
}

absl::StatusOr<float> ParseMomentumMemory(const std::string& spec) {
  TERN_ASSIGN_OR_RETURN(auto parsed, SpecParams::ParseSpec(spec));
  auto& [name, params] = parsed;
  if (name != "momentum") return absl::NotFoundError(absl::StrCat("'", spec, "' is not momentum"));
  TERN_ASSIGN_OR_RETURN(double beta, params.Double("beta", 0.9, 0.0, 0.999999));
  TERN_RETURN_IF_ERROR(params.CheckAllUsed("momentum memory"));
  return static_cast<float>(beta);
}

absl::Status CheckClientMemory(const std::string& spec) {
  if (spec.empty() || spec == "ef") return absl::OkStatus();
  absl::StatusOr<float> momentum = ParseMomentumMemory(spec);
  if (!absl::IsNotFound(momentum.status())) return momentum.status();
  return ParseDgcMemory(spec, 1).status();
}

}  // namespace tern

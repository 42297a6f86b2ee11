#include "core/model/bundle.h"

#include <cstring>
#include <set>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/error_feedback.h"
#include "kernels/wire.h"

namespace tern {

namespace {

absl::Status CheckInside(const ParamTensor& p, absl::Span<const float> values) {
  if (p.offset > values.size() || p.numel > values.size() - p.offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", p.name, "' lies outside the ", values.size(), " values"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ExactTensor(const ParamTensor& p, absl::Span<const float> values,
                         v1::NamedTensor* nt) {
  TERN_RETURN_IF_ERROR(CheckInside(p, values));
  nt->Clear();
  nt->set_name(p.name);
  v1::EncodedTensor* t = nt->mutable_tensor();
  t->set_codec("none.v1");
  t->set_numel(p.numel);
  t->set_dtype(v1::DTYPE_FLOAT32);
  for (int64_t d : p.shape) t->add_shape(d);
  t->set_payload(reinterpret_cast<const char*>(values.data() + p.offset), p.numel * 4);
  return absl::OkStatus();
}

absl::StatusOr<v1::TensorBundle> FlatToBundle(const std::vector<ParamTensor>& layout,
                                              absl::Span<const float> values) {
  v1::TensorBundle b;
  for (const ParamTensor& p : layout) TERN_RETURN_IF_ERROR(ExactTensor(p, values, b.add_tensors()));
  return b;
}

namespace {

bool IsExact(const std::vector<bool>& exact, size_t i) { return i < exact.size() && exact[i]; }

// Tensor i of an error-feedback vector sent whole: values + residual exactly, nothing left over.
absl::Status ExactWithResidual(const ParamTensor& p, absl::Span<const float> values,
                               std::vector<float>* residual, v1::NamedTensor* nt) {
  TERN_RETURN_IF_ERROR(CheckInside(p, values));
  if (residual == nullptr) return ExactTensor(p, values, nt);
  absl::Span<float> r = absl::MakeSpan(*residual).subspan(p.offset, p.numel);
  std::vector<float> x(values.begin() + static_cast<ptrdiff_t>(p.offset),
                       values.begin() + static_cast<ptrdiff_t>(p.offset + p.numel));
  for (size_t j = 0; j < x.size(); ++j) x[j] += r[j];
  std::fill(r.begin(), r.end(), 0.0f);
  ParamTensor whole = p;
  whole.offset = 0;
  return ExactTensor(whole, x, nt);
}

absl::StatusOr<v1::TensorBundle> EncodeTensors(const std::vector<ParamTensor>& layout,
                                               absl::Span<const float> values,
                                               absl::FunctionRef<Codec&(size_t)> codec_of,
                                               const EncodeOptions& options,
                                               std::vector<float>* residual,
                                               const std::vector<bool>& exact) {
  if (residual != nullptr && residual->size() != values.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("residual of ", residual->size(), " values for a vector of ", values.size()));
  }
  v1::TensorBundle b;
  EncodedTensor t;
  for (size_t i = 0; i < layout.size(); ++i) {
    const ParamTensor& p = layout[i];
    if (IsExact(exact, i)) {
      // Not encoded at all: a stateful codec (PowerSGD's Q) must not advance on it.
      TERN_RETURN_IF_ERROR(ExactWithResidual(p, values, residual, b.add_tensors()));
      continue;
    }
    TERN_RETURN_IF_ERROR(CheckInside(p, values));
    const absl::Span<const float> x = values.subspan(p.offset, p.numel);
    EncodeOptions o = options;
    o.seed = options.seed + i;
    o.shape = p.shape;  // PowerSGD's matrix view
    Codec& codec = codec_of(i);
    if (residual != nullptr) {
      TERN_RETURN_IF_ERROR(EncodeWithErrorFeedback(
          codec, x, absl::MakeSpan(*residual).subspan(p.offset, p.numel), o, &t));
    } else {
      TERN_RETURN_IF_ERROR(codec.Encode(x, o, &t));
    }
    v1::NamedTensor* nt = b.add_tensors();
    nt->set_name(p.name);
    v1::EncodedTensor* m = nt->mutable_tensor();
    m->set_dtype(v1::DTYPE_FLOAT32);
    ToProto(std::move(t), m);
    m->clear_shape();
    for (int64_t d : p.shape) m->add_shape(d);
    t = EncodedTensor();
  }
  return b;
}

}  // namespace

absl::StatusOr<v1::TensorBundle> EncodeFlatToBundle(const std::vector<ParamTensor>& layout,
                                                    absl::Span<const float> values, Codec& codec,
                                                    const EncodeOptions& options,
                                                    std::vector<float>* residual) {
  return EncodeTensors(layout, values, [&codec](size_t) -> Codec& { return codec; }, options,
                       residual, {});
}

absl::Status TensorCodecs::Use(const std::string& spec, size_t tensors) {
  if (spec == spec_ && codecs_.size() == tensors) return absl::OkStatus();
  std::vector<std::unique_ptr<Codec>> made;
  for (size_t i = 0; i < tensors; ++i) {
    TERN_ASSIGN_OR_RETURN(std::unique_ptr<Codec> c, registry_->Create(spec));
    made.push_back(std::move(c));
  }
  codecs_ = std::move(made);
  spec_ = spec;
  return absl::OkStatus();
}

absl::StatusOr<v1::TensorBundle> EncodeFlatToBundle(
    const std::vector<ParamTensor>& layout, absl::Span<const float> values, TensorCodecs& codecs,
    const EncodeOptions& options, std::vector<float>* residual, const std::vector<bool>& exact) {
  if (codecs.size() != layout.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(codecs.size(), " codecs for ", layout.size(), " tensors"));
  }
  return EncodeTensors(
      layout, values, [&codecs](size_t i) -> Codec& { return codecs.at(i); }, options, residual,
      exact);
}

uint64_t PayloadBytes(const v1::TensorBundle& bundle) {
  uint64_t n = 0;
  for (const v1::NamedTensor& nt : bundle.tensors()) {
    n += nt.tensor().payload().size() + 4 * static_cast<uint64_t>(nt.tensor().scales_size());
  }
  return n;
}

absl::Status BundleToFlat(const v1::TensorBundle& bundle, const std::vector<ParamTensor>& layout,
                          const CodecRegistry& codecs, absl::Span<float> out) {
  if (static_cast<size_t>(bundle.tensors_size()) != layout.size()) {
    return absl::InvalidArgumentError(absl::StrCat("bundle has ", bundle.tensors_size(),
                                                   " tensors, the model has ", layout.size()));
  }
  for (size_t i = 0; i < layout.size(); ++i) {
    const v1::NamedTensor& nt = bundle.tensors(static_cast<int>(i));
    const ParamTensor& p = layout[i];
    if (nt.name() != p.name) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, " is '", nt.name(), "', expected '", p.name, "'"));
    }
    if (nt.tensor().numel() != p.numel || p.offset + p.numel > out.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", p.name, "' has ", nt.tensor().numel(), " elements, expected ", p.numel));
    }
    absl::Status s = DecodeMessage(codecs, nt.tensor(), out.subspan(p.offset, p.numel));
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", p.name, "': ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ParamTensor>> LayoutFromBundle(const v1::TensorBundle& bundle,
                                                          uint64_t max_params) {
  std::vector<ParamTensor> layout;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const v1::NamedTensor& nt : bundle.tensors()) {
    if (nt.name().empty() || !seen.insert(nt.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name '", nt.name(), "' is empty or repeated"));
    }
    TERN_RETURN_IF_ERROR(ViewOf(nt.tensor()).status());  // shape agrees with numel
    const uint64_t numel = nt.tensor().numel();
    if (numel == 0 || numel > max_params - offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", nt.name(), "' is empty or takes the model past ", max_params, " values"));
    }
    ParamTensor p;
    p.name = nt.name();
    p.shape.assign(nt.tensor().shape().begin(), nt.tensor().shape().end());
    if (p.shape.empty()) p.shape.push_back(static_cast<int64_t>(numel));
    p.offset = offset;
    p.numel = numel;
    offset += numel;
    layout.push_back(std::move(p));
  }
  if (layout.empty()) return absl::InvalidArgumentError("the model has no tensors");
  return layout;
}

bool SameLayout(const std::vector<ParamTensor>& a, const std::vector<ParamTensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].shape != b[i].shape || a[i].numel != b[i].numel) {
      return false;
    }
  }
  return true;
}

}  // namespace tern

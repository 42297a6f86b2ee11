// How the global model travels to clients, chosen once per run (AggregatorOptions.downstream):
//   - ModelDownstream ("model"): every TRAIN task carries the model, exact ("none") or encoded
//     with a lossy codec (a client then trains from its decoded copy);
//   - DeltaDownstream ("delta", STC federated and 1-bit Adam / LAMB): the server encodes each
//     round's step with the codec and its error-feedback residual, moves the model by exactly
//     what clients decode, and keeps the encoded steps so a client that holds an earlier model
//     catches up from them (core/federated ApplyDeltas) when they cost less than the model.
//
// Thread-safety: thread-compatible; the aggregator guards it with its own mutex.
#ifndef TERN_SERVER_DOWNSTREAM_H_
#define TERN_SERVER_DOWNSTREAM_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/model/bundle.h"
#include "core/model/layout.h"
#include "kernels/registry.h"
#include "tern/internal/checkpoint.pb.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

class Downstream {
 public:
  virtual ~Downstream() = default;

  // A new model of this layout: any state of the previous one is dropped.
  virtual void Reset(const std::vector<ParamTensor>& layout) = 0;
  // Moves `model` by `step` as closing round `round`, the way clients will see it. False (the
  // model unchanged) when the step would overflow it.
  virtual absl::StatusOr<bool> Apply(absl::Span<const float> step, int64_t round,
                                     std::vector<float>* model) = 0;
  // The round from which a client holding the published model of `have_round` can catch up
  // with kept updates, given the latest closed round; -1: send the model.
  virtual int64_t CatchUpFrom(int64_t have_round, int64_t latest) const = 0;
  // A TRAIN task's payload: the kept updates after round `from` (>= 0), or the model: `exact`
  // (the published bundle of `model`) or `model` encoded, seeded with `seed`.
  virtual absl::StatusOr<v1::TensorBundle> Payload(int64_t from, const std::vector<float>& model,
                                                   const v1::TensorBundle& exact,
                                                   uint64_t seed) const = 0;
  // Whether a client's copy equals the server's model bit for bit (so its CRC means something).
  virtual bool exact() const = 0;
  // Layout tensor `tensor` is state that training sets rather than descends (BatchNorm's running
  // statistics): its change goes exactly (codec none, no residual) until the next Reset, since
  // a residual would re-send a pull towards a target that the next round repeats.
  virtual void MarkExact(size_t tensor) {}

  virtual void Save(internal::DownstreamState* state) const = 0;
  virtual absl::Status Restore(const internal::DownstreamState& state) = 0;
};

class ModelDownstream final : public Downstream {
 public:
  // `codecs` must outlive this; `codec` is a spec it knows.
  ModelDownstream(const CodecRegistry* codecs, std::string codec);

  void Reset(const std::vector<ParamTensor>& layout) override { layout_ = layout; }
  absl::StatusOr<bool> Apply(absl::Span<const float> step, int64_t round,
                             std::vector<float>* model) override;
  int64_t CatchUpFrom(int64_t, int64_t) const override { return -1; }
  absl::StatusOr<v1::TensorBundle> Payload(int64_t from, const std::vector<float>& model,
                                           const v1::TensorBundle& exact,
                                           uint64_t seed) const override;
  bool exact() const override { return codec_ == "none"; }
  void Save(internal::DownstreamState*) const override {}
  absl::Status Restore(const internal::DownstreamState& state) override;

 private:
  const CodecRegistry* const codecs_;
  const std::string codec_;
  std::vector<ParamTensor> layout_;
};

class DeltaDownstream final : public Downstream {
 public:
  // `codecs` must outlive this. `seed` seeds the codec (with the round); at most `keep` encoded
  // steps are kept, and fewer once the older ones alone would cost as much as the model.
  DeltaDownstream(const CodecRegistry* codecs, std::string codec, uint64_t seed, int keep);

  void Reset(const std::vector<ParamTensor>& layout) override;
  absl::StatusOr<bool> Apply(absl::Span<const float> step, int64_t round,
                             std::vector<float>* model) override;
  int64_t CatchUpFrom(int64_t have_round, int64_t latest) const override;
  absl::StatusOr<v1::TensorBundle> Payload(int64_t from, const std::vector<float>& model,
                                           const v1::TensorBundle& exact,
                                           uint64_t seed) const override;
  bool exact() const override { return true; }
  void MarkExact(size_t tensor) override;
  void Save(internal::DownstreamState* state) const override;
  absl::Status Restore(const internal::DownstreamState& state) override;

  // `values` + the residual, encoded as round `round`'s step; `decoded` is what clients will
  // decode. Nothing changes until Keep commits it (1-bit Adam encodes its mean momentum so).
  struct Encoded {
    v1::TensorBundle bundle;
    std::vector<float> residual;
    std::vector<float> decoded;
  };
  absl::StatusOr<Encoded> Encode(absl::Span<const float> values, int64_t round) const;
  // Commits `e`: its residual becomes the server's, its bundle the kept update of `round`.
  void Keep(Encoded e, int64_t round);

 private:
  struct Delta {
    int64_t round;
    std::vector<v1::NamedTensor> tensors;  // named "<round>:<name>"
    uint64_t payload_bytes;
  };

  size_t size() const { return residual_.size(); }

  const CodecRegistry* const codecs_;
  const std::string codec_;
  // One codec per tensor kept across rounds (PowerSGD's warm start); only the encoder's state,
  // which Encode may advance even when its result is not kept.
  mutable TensorCodecs tensor_codecs_;
  const uint64_t seed_;
  const int keep_;
  std::vector<ParamTensor> layout_;
  std::vector<float> residual_;
  std::vector<bool> exact_;  // per tensor (MarkExact)
  std::deque<Delta> deltas_;
  uint64_t deltas_bytes_ = 0;
};

}  // namespace tern

#endif  // TERN_SERVER_DOWNSTREAM_H_

// An aggregator client's side of the protocol apart from the calls: its copy of the global model
// kept in step with the server's (a MODEL payload, or DELTAS from the round it has, checked by
// the model's CRC-32), 1-bit Adam / LAMB's optimizer state, and the memory around its update
// codec between rounds (error feedback's residual, DGC's per-tensor memories, PowerSGD's
// per-tensor warm start, Signum's momentum). The C++ AggregatorClient and the C API that the Python
// client loads (clients/c) both keep one, so every client language encodes and catches up
// identically.
//
// Thread-safety: thread-compatible (one owner at a time).
#ifndef TERN_CORE_FEDERATED_CLIENT_MODEL_H_
#define TERN_CORE_FEDERATED_CLIENT_MODEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/model/adam.h"
#include "core/model/bundle.h"
#include "core/model/layout.h"
#include "kernels/dgc_memory.h"
#include "kernels/registry.h"
#include "tern/v1/server.pb.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

// DP-FedAvg's clip (Task.dp_clip > 0): when `*update`'s L2 norm is over the clip, it is scaled
// onto the clip into `storage` and `*update` points there. Whether it was within the clip
// (TensorBundle.dp_within_clip); nullopt when the task clips nothing.
std::optional<bool> DpClip(const v1::Task& task, absl::Span<const float>* update,
                           std::vector<float>* storage);

class ClientModel {
 public:
  // Starts from `initial` (the participant's initial model, `layout`'s size): the server's
  // round 0 when one of the run's participants gave it the same model, which the CRC confirms
  // (else the server sends the model).
  static absl::StatusOr<std::unique_ptr<ClientModel>> Create(std::vector<ParamTensor> layout,
                                                             std::vector<float> initial);

  // What a FetchRequest says the client has: the round its copy is exact for (-1: none, the
  // server sends the model), the copy's CRC-32, and whether it holds 1-bit Adam's state.
  int64_t have_round() const { return have_round_; }
  uint32_t have_crc32() const { return have_crc_; }
  bool have_optimizer_state() const { return have_adam_; }

  // Brings the copy to `task`'s round from its payload (a TRAIN task's MODEL or DELTAS); false
  // when the copy cannot be trusted (a CRC mismatch, deltas from a round it does not have): the
  // model is asked for next time, and the round is skipped. Errors: a payload that does not
  // decode onto the layout (the model is asked for next time too).
  absl::StatusOr<bool> Update(const v1::Task& task, v1::TensorBundle payload);
  // Why the last Update returned false.
  const std::string& why_not() const { return why_not_; }

  // The seed a client's update for `task` is encoded with (stochastic codecs): deterministic per
  // round and client.
  static uint64_t EncodeSeed(const v1::Task& task, int64_t client_id);

  // `update` (the layout's size: a change or a gradient) encoded as `task` says (update_codec,
  // error_feedback, memory) with the memory kept from earlier rounds. `num_examples` (the
  // client's data) sets DGC's warm-up epoch. The bundle's run_id, round and sender are left
  // for the caller.
  absl::StatusOr<v1::TensorBundle> EncodeUpdate(const v1::Task& task, int64_t client_id,
                                                uint64_t num_examples,
                                                absl::Span<const float> update);

  // Tensors sent exactly (codec none, outside error feedback and DGC memory) whatever the task's
  // codec, one flag per layout tensor: state that training sets rather than descends, such as
  // BatchNorm's running statistics, whose change is a pull towards a target that error feedback
  // would overshoot (the residual re-sends a pull the next round repeats).
  absl::Status SetExactTensors(std::vector<bool> exact);

  const std::vector<ParamTensor>& layout() const { return layout_; }
  // The global model as of the last Update, in layout order.
  const std::vector<float>& values() const { return values_; }
  // 1-bit Adam / LAMB's state when have_optimizer_state(), else null.
  const AdamState* optimizer_state() const { return have_adam_ ? &adam_ : nullptr; }

 private:
  ClientModel(std::vector<ParamTensor> layout, std::vector<float> initial);

  // Update's work; Update forgets the round when it fails.
  absl::StatusOr<bool> Apply(const v1::Task& task, v1::TensorBundle payload);

  // EncodeUpdate past the DP clip.
  absl::StatusOr<v1::TensorBundle> EncodeWithin(const v1::Task& task, int64_t client_id,
                                                uint64_t num_examples,
                                                absl::Span<const float> update);
  absl::StatusOr<v1::TensorBundle> EncodeDgc(const v1::Task& task, absl::Span<const float> update,
                                             double epoch, const EncodeOptions& eo);

  const std::vector<ParamTensor> layout_;
  const std::unique_ptr<CodecRegistry> codecs_;
  std::vector<float> values_;
  int64_t have_round_ = 0;
  uint32_t have_crc_ = 0;
  AdamState adam_;  // 1-bit Adam / LAMB: momentum, frozen variance
  bool have_adam_ = false;
  std::string why_not_;
  std::vector<bool> exact_;      // empty: none
  std::vector<float> residual_;  // error feedback
  std::vector<float> momentum_;  // a momentum memory (Signum)
  // Kept across rounds: PowerSGD's warm start is per tensor.
  TensorCodecs tensor_codecs_;
  std::vector<std::unique_ptr<DgcMemory>> dgc_;
};

}  // namespace tern

#endif  // TERN_CORE_FEDERATED_CLIENT_MODEL_H_

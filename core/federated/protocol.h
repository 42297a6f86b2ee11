// What an aggregator and its clients must agree on beyond the protobuf messages: how a DELTAS
// payload's kept updates are applied (bit-exactly as the server applied them), how 1-bit Adam /
// LAMB's optimizer state rides in a MODEL payload, and the client memory specs a Task names.
// Both sides call these same functions, so their copies of the model stay identical.
//
// Thread-safety: plain functions over the caller's values.
#ifndef TERN_CORE_FEDERATED_PROTOCOL_H_
#define TERN_CORE_FEDERATED_PROTOCOL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/model/adam.h"
#include "core/model/layout.h"
#include "kernels/dgc_memory.h"
#include "kernels/registry.h"
#include "tern/v1/server.pb.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

// Whether `task` is in 1-bit Adam / LAMB's compressed phase (after its warm-up rounds), where
// updates and DELTAS are momenta.
bool InOnebitPhase(const v1::Task& task);

// The minibatch size the task's work starts from.
uint32_t TaskBatch(const v1::Task& task);

// Adds the downstream updates of a DELTAS payload to `x`, in bundle order: tensors named
// "<round>:<name>", each decoded into scratch and added element by element (the server applies
// its updates the same way, so the copies stay bit-identical).
absl::Status ApplyDeltas(const v1::TensorBundle& b, const std::vector<ParamTensor>& layout,
                         const CodecRegistry& codecs, absl::Span<float> x);

// 1-bit Adam / LAMB's compressed phase, a DELTAS payload: each tensor "<round>:<name>" is the
// server's encoded mean momentum; `state->m` becomes it and `x` steps with the frozen variance,
// exactly as the server did (Aggregator::AdamClose), so the copies stay bit-identical.
absl::Status ApplyOnebitDeltas(const v1::TensorBundle& b, const std::vector<ParamTensor>& layout,
                               const CodecRegistry& codecs, const v1::Task& task, AdamState* state,
                               absl::Span<float> x);

// 1-bit Adam / LAMB's state in a MODEL payload (Task.optimizer): tensors "adam.m/<name>",
// "adam.v/<name>" and "adam.ratio". Append adds them to the model's bundle; Take removes them
// from `b` into `state` and says whether they were there (all of them, or an error).
absl::Status AppendOptimizerState(const std::vector<ParamTensor>& layout, const AdamState& state,
                                  v1::TensorBundle* b);
absl::StatusOr<bool> TakeOptimizerState(const std::vector<ParamTensor>& layout,
                                        const CodecRegistry& codecs, v1::TensorBundle* b,
                                        AdamState* state);

// A federated evaluation report (UpdateInfo.eval) the server can use: examples in (0, 1e12], a
// finite loss and accuracy in [0, 1]; InvalidArgument saying so otherwise. The server refuses an
// update carrying any other report; clients leave such a report out and send the update.
absl::Status CheckEvaluation(const v1::Evaluation& e);

// Parses a Task.memory spec "dgc[:ratio=R,momentum=M,clip=C,warmup=E,exact=B]" for a client of
// a run with `num_workers` (clipping is per worker: C / sqrt(n)).
absl::StatusOr<DgcOptions> ParseDgcMemory(const std::string& spec, int num_workers);

// Parses a Task.memory spec "momentum[:beta=B]" (B in [0, 1), 0.9 when left out): the client
// sends its momentum m = B m + (1 - B) u of its updates u instead of u (Signum's, with the
// majority-vote rule). NotFound for a spec of another memory, so a caller can try the next.
absl::StatusOr<float> ParseMomentumMemory(const std::string& spec);
// Checks any Task.memory spec: "", "ef", dgc[...] or momentum[...].
absl::Status CheckClientMemory(const std::string& spec);

}  // namespace tern

#endif  // TERN_CORE_FEDERATED_PROTOCOL_H_

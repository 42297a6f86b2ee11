// Decentralized training algorithms (ALGORITHMS.md §2) as per-worker state machines, independent
// of transport: each round a worker Prepare()s what it sends from its gradient, the gossip layer
// delivers neighbours' messages, and Combine() mixes them with this round's weights. The peer
// daemon runs them over gRPC; tests run many in one process.
//
// Thread-safety: an Algorithm is thread-compatible (one worker's round loop owns it).
#ifndef TERN_WORKER_ALGORITHM_H_
#define TERN_WORKER_ALGORITHM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/registry.h"
#include "core/model/clip_radius.h"
#include "core/model/outer.h"
#include "core/topology/topology.h"
#include "kernels/codec.h"
#include "kernels/registry.h"
#include "worker/step_schedule.h"

namespace tern {

// What one worker sends all its neighbours in a round: named parts ("x", "m", "q"), each the
// whole parameter vector encoded with some codec.
struct GossipMessage {
  std::vector<std::pair<std::string, EncodedTensor>> parts;
  // Every part already passed its codec's check (the engine's, as the message arrived), so
  // mixing need not parse it again to check it.
  bool checked = false;
  // diloco: the CRC-32 of the sender's group model θ as it sent the message (TensorBundle).
  std::optional<uint32_t> group_crc;
  // CHOCO: the neighbours whose whole public copy the sender asks for (TensorBundle.resync).
  std::vector<int> resync;
  // diloco with a range of H: the steps between exchanges its sender proposes
  // (TensorBundle.propose_local_steps).
  std::optional<uint32_t> propose_local_steps;
  // ... and, with a range of fragment counts, the turns its lanes take a period
  // (TensorBundle.propose_fragments).
  std::optional<uint32_t> propose_fragments;
  size_t PayloadBytes() const;
  const EncodedTensor* Find(absl::string_view name) const;
};

// When diloco takes an exchange's outer step (ALGORITHMS.md §5, docs/worker.md "Delayed and eager
// outer steps").
enum class OuterDelay {
  kNone,     // before the next inner step (with --overlap, overlap_steps later)
  kDelayed,  // round r's exchange runs during round r + 1's inner steps; its outer step is taken
             // at round r + 1's end, and every round starts from the group's outer model
  kEager,    // as kDelayed, but a round starts from the group's outer model stepped with this
             // worker's fresh update weighed as its share of the mean: a stand-in for the
             // group's until that arrives (Kale, Douillard & Donchev 2025, "eager updates")
};
// "none", "delayed", "eager".
absl::StatusOr<OuterDelay> ParseOuterDelay(absl::string_view name);
absl::string_view OuterDelayName(OuterDelay delay);

struct AlgorithmOptions {
  double momentum = 0.9;        // beta of DmSGD, DecentLaM, heavy-ball, and CHOCO's local step
  double consensus_step = 0.5;  // CHOCO's gamma_c in (0, 1]
  // CHOCO's compressor (any registry spec); what the others send x (and m) with, where only
  // near-exact codecs (none, fp16, bf16, int8) are accepted.
  std::string codec = "none";
  int local_steps = 4;  // local-sgd, swarm and diloco: H
  // diloco: when local_steps_max > 0, H moves within [local_steps_min, local_steps_max] as the
  // group agrees (the largest H proposed among the updates of an exchange, ProposeLocalSteps),
  // starting from local_steps.
  int local_steps_min = 1;
  int local_steps_max = 0;
  // diloco with local_steps_max and its model cut into fragments_max fragments (the engine's
  // lanes): when fragments_min > 0, the lanes take q turns a period (lane k in turn k mod q, the
  // lanes of a turn exchanging at one step), q moved within [fragments_min, fragments_max] with H
  // as the group agrees (the largest (H, q) proposed), starting from fragments_max.
  int fragments_min = 0;
  int fragments_max = 0;
  // diloco's outer optimizer (core/model/outer.h's registry spec).
  std::string outer = "nesterov";
  // diloco: after an exchange the model becomes merge_alpha × the local model + (1 −
  // merge_alpha) × the group's outer model (Streaming DiLoCo's α; 0: the outer model alone). In
  // [0, 1).
  double merge_alpha = 0;
  // diloco: after an exchange the model becomes the group's outer model plus the steps this
  // worker took since it sent its update (x ← θ + (x − x as sent)), in place of merge_alpha:
  // with --overlap no step is lost, and a whole-model average becomes PostLocalSGD's.
  bool keep_overlap = false;
  // diloco: when an exchange's outer step is taken (above). Delayed and eager need the engine's
  // overlap, which then mixes each round at the lane's next exchange.
  OuterDelay outer_delay = OuterDelay::kNone;
  // diloco: the run's first sync_steps steps exchange every step, and each ends on the group's
  // plain mean, the outer optimizer untouched: synchronous data parallelism while the model moves
  // fastest, as PostLocalSGD runs DDP for its warm-up; then the outer loop. Not with outer_delay.
  int64_t sync_steps = 0;
  // The group's size (the engine sets it): eager weighs its own update by 1/workers until a
  // round's mixing row gives the weight.
  int workers = 1;
  // This algorithm's lane among the engine's (buckets, or diloco's fragments) and how many there
  // are: diloco exchanges lane k's fragment H·k/lanes steps before lane 0's.
  int lane = 0;
  int lanes = 1;
  // The run's number of steps when known (0: not): diloco also exchanges at its last step, so a
  // run ends on the group's outer model whatever H divides.
  int64_t final_step = 0;
  uint64_t seed = 1;  // stochastic codecs draw from (seed, worker, round)
  // Self-centred clipping of each neighbour's contribution (core/model/clip_radius.h), per part:
  // a model-like part's distance from this worker's own, CHOCO's compressed difference itself.
  // factor 0 turns it off.
  ClipRadiusOptions clip;
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual std::string Name() const = 0;
  // The momentum (beta) this algorithm applies to the gradients it is given; 0 for none. A
  // trainer that runs its own optimizer needs 0 (RegisterReply.momentum).
  virtual double Momentum() const { return 0; }
  // Starts from x0 (every worker must use the same x0). `worker` is this worker's id; `blocks`
  // are the model's tensors in x0 (empty: one flat tensor), which codecs with per-tensor
  // structure (PowerSGD) encode one by one.
  virtual absl::Status Init(absl::Span<const float> x0, int worker,
                            std::vector<TensorBlock> blocks) = 0;
  // Whether step `step` ends with a gossip round (local SGD talks every H steps only).
  virtual bool Communicates(int64_t step) const { return true; }
  // Steps from one round to the next (local SGD's and diloco's H): rounds are numbered by step,
  // so how far ahead a neighbour may be, and how far past a round one that went on without this
  // worker is, count in these. diloco's may change during a run (local_steps_max).
  virtual int64_t StepsPerRound() const { return 1; }
  // The H (and, with fragments_min, the fragment count) this worker proposes to its group from
  // its link as measured (diloco with local_steps_max; each message it sends from now on carries
  // it; fragments 0: none). Ignored by the others.
  virtual void ProposeSchedule(int64_t h, int64_t fragments) {}
  // diloco with fragments_min: the turns its lanes take a period now (0: not moving).
  virtual int64_t FragmentCount() const { return 0; }
  // Applies the local part of step `step` with gradient `grad` and learning rate `lr`, and
  // returns what to send (empty parts when Communicates(step) is false).
  virtual absl::StatusOr<GossipMessage> Prepare(absl::Span<const float> grad, float lr,
                                                int64_t step) = 0;
  // Mixes the received messages with `row`, whose neighbours must be exactly the keys of
  // `received` (the caller drops silent neighbours with DropNeighbours first). Messages are
  // untrusted: a malformed one fails the call and leaves the state untouched.
  virtual absl::Status Combine(const MixingRow& row,
                               const std::map<int, const GossipMessage*>& received) = 0;
  // Finishes what Combine left for the next Prepare to fold into its own pass over the model
  // (CHOCO's mixing), for when the model is read before then. The engine calls it at the end of
  // every step; params() is the model only after it.
  virtual void Settle() {}
  // The current model.
  virtual absl::Span<const float> params() const = 0;
  // Seconds spent so far decoding messages (inside Prepare, Combine and Settle), which the engine
  // reports apart from the rest of those calls.
  virtual double decode_seconds() const { return 0; }
  // Neighbours' contributions scaled down to the clipping radius so far (AlgorithmOptions::clip).
  virtual uint64_t contributions_clipped() const { return 0; }
  // Neighbours' copies taken whole so far, after one was out of step (CHOCO's "hat").
  virtual uint64_t copies_resynced() const { return 0; }
  // From now on the model lives in `storage` (as many values; it gets the current ones), where
  // another party reads it in place: params() is then a view of it. An empty span moves it back
  // into the algorithm's own memory. REQUIRES: Init().
  virtual absl::Status BindParams(absl::Span<float> storage) = 0;
  // True for algorithms without rounds (SwarmSGD): the engine averages pairwise with one random
  // neighbour on communicating steps, and answers neighbours' exchanges with Publish().
  virtual bool Asynchronous() const { return false; }
  // The current model as a message (asynchronous algorithms).
  virtual absl::StatusOr<GossipMessage> Publish(int64_t step) {
    return absl::UnimplementedError("not an asynchronous algorithm");
  }
  // Names of the parts every message of this algorithm carries (what a receiver checks for).
  virtual std::vector<std::string> MessageParts() const = 0;
  // Names of the parts a message may carry besides those (CHOCO's "hat": the sender's whole
  // public copy, sent when a neighbour asks for it).
  virtual std::vector<std::string> OptionalParts() const { return {}; }
  // True for algorithms that keep a copy of each neighbour's state, moved by every message it
  // sends (CHOCO's public copies): the graph must be the same every round, or the copies miss
  // the messages of rounds their owner spent with others.
  virtual bool KeepsNeighbourCopies() const { return false; }
  // Encodes its messages with codec `spec` from the next one on (diloco: receivers decode each
  // message by the codec it names, so workers may differ). Unimplemented for the others.
  virtual absl::Status SetCodec(const std::string& spec) {
    return absl::UnimplementedError(absl::StrCat(Name(), " keeps one codec for the run"));
  }
  // True for algorithms whose state is shared by the whole group (diloco's outer step): every
  // worker must hear every other each round, so the engine refuses any graph but the complete one.
  virtual bool AllToAll() const { return false; }
  // That shared state, for a worker that rejoins a running group (AllToAll algorithms): the
  // group's model and the outer optimizer's momentum (empty when it keeps none), as they stand
  // between exchanges. FailedPrecondition while an exchange is sent and not yet mixed.
  struct SharedState {
    std::vector<float> model, momentum;
    // diloco with a range of H: when it exchanges next, and in how many turns the lanes do with
    // a range of fragment counts (absent: H is fixed).
    std::optional<StepSchedule> schedule = std::nullopt;
  };
  virtual absl::StatusOr<SharedState> ExportShared() const {
    return absl::UnimplementedError(absl::StrCat(Name(), " keeps no state shared by the group"));
  }
  // Takes the group's state over: the model becomes `model` (and the local model with it), the
  // momentum `momentum`, and what was this worker's own (error feedback's residual) starts again
  // from zero. A state that does not fit leaves everything as it was.
  virtual absl::Status AdoptShared(absl::Span<const float> model, absl::Span<const float> momentum,
                                   const std::optional<StepSchedule>& schedule) {
    return absl::UnimplementedError(absl::StrCat(Name(), " keeps no state shared by the group"));
  }
  // The group's model as it stands (diloco's θ: the same bytes on every worker, the model the run
  // ends on), for snapshots; empty for algorithms without one. Round loop only.
  virtual absl::Span<const float> GroupModel() const { return {}; }
  // The message the last Prepare made was not sent (a rejoined worker sitting a round out): the
  // next Combine leaves it out of the mean, as every other worker does, and keeps it to send
  // later (error feedback). AllToAll algorithms.
  virtual void WithdrawOwn() {}
  // This worker's own momentum buffer (dmsgd, decentlam, heavy-ball, CHOCO), which a joiner
  // takes from a peer with its model; empty for algorithms without one, or before the first
  // step. Round loop only.
  virtual std::vector<float> LocalMomentum() const { return {}; }
  // Takes `m` (as long as the model) as its momentum buffer.
  virtual absl::Status AdoptLocalMomentum(absl::Span<const float> m) {
    return absl::UnimplementedError(absl::StrCat(Name(), " keeps no momentum of its own"));
  }
  // Init's x0 was a running run's model (an elastic run's joiner), not the run's start: state
  // kept in step with each neighbour (CHOCO's public copies) is taken again from them. Call
  // right after Init.
  virtual void JoinedLate() {}
};

// Algorithms by name (dpsgd, dmsgd, decentlam, heavy-ball, choco, local-sgd, swarm, diloco),
// built for the given options and codecs (which must outlive the algorithm). diloco's outer
// optimizers come from `outers` (the built-in ones when not given), which the registry keeps.
using AlgorithmRegistry = Registry<Algorithm, const AlgorithmOptions&, const CodecRegistry*>;
std::unique_ptr<AlgorithmRegistry> NewBuiltinAlgorithmRegistry(
    std::shared_ptr<const OuterOptimizerRegistry> outers);
std::unique_ptr<AlgorithmRegistry> NewBuiltinAlgorithmRegistry();

}  // namespace tern

#endif  // TERN_WORKER_ALGORITHM_H_

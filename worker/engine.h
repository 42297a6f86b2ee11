// The round engine of one peer: runs an Algorithm's rounds over a PeerTransport.
//
// Each trainer step: Prepare (local update + encoding), push the message to this round's
// neighbours, wait for theirs up to the round deadline, drop the silent ones from the mixing
// weights (renormalised onto self), Combine. A neighbour whose push fails is marked down at once:
// not waited for, but still sent to each round, and back as soon as a push to it succeeds or one
// of its messages arrives. One that took our message but missed the deadline is only dropped from
// that round (it is behind, not gone). So a dead peer costs at most one round deadline.
//
// Buckets (EngineOptions::bucket_values): the model's tensors are cut into contiguous buckets,
// each run as a model of its own (its own Algorithm instance over its range, inbox and round),
// so a bucket's message can go out as soon as its gradient is final, while the trainer's backward
// pass is still computing the rest: BeginStep, GradReadyFrom as the backward pass goes, FinishStep.
// Every algorithm with rounds is separable over coordinate ranges (local steps, mixing and CHOCO's
// public copies are element-wise), so only sparsifiers differ: they select per bucket.
//
// Incoming messages (Deliver) are checked completely before they are accepted: run id, sender is
// a neighbour in that round's graph, round window, duplicates, and every part decodes to the
// model's size. A refused message changes nothing.
//
// Its parts are rooms of their own: a bucket's round (lane.h), whom a round mixes with
// (round_graph.h), the checks on arrival (arrival_check.h), the counters (engine_counters.h), the
// kept snapshots (snapshot_store.h), the state handed to a rejoining peer (state_share.h; the
// engine's side in engine_rejoin.cc); SwarmSGD's swaps are in engine_swarm.cc (swarm_mailbox.h).
//
// Thread-safety: thread-safe. Init(), Step() and the bucketed step's calls are made by one thread
// at a time (the daemon's round loop); Deliver(), GetSnapshot() and Stats() from any thread.
#ifndef TERN_WORKER_ENGINE_H_
#define TERN_WORKER_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/model/layout.h"
#include "core/model/norm_guard.h"
#include "core/topology/topology.h"
#include "kernels/payload_scans.h"
#include "kernels/registry.h"
#include "tern/v1/tensor.pb.h"
#include "tern/v1/worker.pb.h"
#include "worker/algorithm.h"
#include "worker/arrival_check.h"
#include "worker/engine_counters.h"
#include "worker/fragments.h"
#include "worker/gossip_inbox.h"
#include "worker/lane.h"
#include "worker/link_tuner.h"
#include "core/model/lr_schedule.h"
#include "worker/peer_transport.h"
#include "worker/round_graph.h"
#include "worker/snapshot_store.h"
#include "worker/state_fetch.h"
#include "worker/state_share.h"
#include "worker/steps_tuner.h"
#include "worker/swarm_mailbox.h"

namespace tern {

struct EngineOptions {
  std::string run_id = "tern";
  int worker_id = 0;
  int num_workers = 1;
  std::string algorithm = "dpsgd";
  AlgorithmOptions algorithm_options;
  std::string topology = "ring";
  WeightRule weights = WeightRule::kAuto;
  LrSchedule lr;
  absl::Duration round_timeout = absl::Seconds(10);
  int64_t max_rounds_ahead = 32;
  // Overlap (docs/worker.md): a round's messages are pushed at the end of step t and mixed at the
  // start of step t+1, so their transfer overlaps the trainer's next compute. The algorithm sees
  // the same calls in the same order; only the gradient of step t+1 is taken before round t's
  // mixing. Not for asynchronous algorithms (SwarmSGD has no rounds).
  bool overlap = false;
  // With overlap, a round pushed at the end of step t is mixed at the start of step t +
  // overlap_steps (Streaming DiLoCo's τ), so its transfer has that many steps' compute; the steps
  // between take their local updates only. More than 1 only for algorithms whose rounds are
  // further apart (diloco, local-sgd: below their H). A step that starts the lane's next round
  // mixes the previous one first whatever this says.
  int overlap_steps = 1;
  // Buckets of about this many values, cut at tensor boundaries from the last tensor back (the
  // backward pass's order); 0: one message a round with the whole model. Every worker of a run
  // must use the same value. Not for asynchronous algorithms.
  uint64_t bucket_values = 0;
  // Streaming DiLoCo's fragments (diloco only): the model is cut as buckets are, into about this
  // many runs of whole tensors of about equal size, and fragment k is exchanged H·k/fragments
  // steps before fragment 0 each period, so an exchange carries a fragment, not the model. 0 or
  // 1: one. Every worker of a run must use the same value; not with bucket_values.
  int fragments = 0;
  // How fragments cut the model (worker/fragments.h): runs of tensors, or the layers dealt out in
  // turn (layer l in fragment l mod fragments). The same on every worker.
  FragmentCut fragment_cut = FragmentCut::kContiguous;
  // Refuses a neighbour's part whose norm is over factor × the median of this worker's own
  // recent messages of that part (trusted: we made them); factor 0 turns it off.
  NormGuardOptions norm_guard{.factor = 10, .window = 16, .min_samples = 1, .flag = "--norm_guard"};
  // Keep the parameters after every `snapshot_every` steps (0: only after step 0), the newest
  // `max_snapshots` of them: after the steps s with s mod snapshot_every = snapshot_offset (a
  // diloco worker's τ, the steps its exchange overlaps: each exchange's θ as soon as it is mixed).
  int64_t snapshot_every = 0;
  int64_t snapshot_offset = 0;  // in [0, snapshot_every)
  // Snapshots keep the group's model (diloco's θ, the same on every worker: what its outer
  // steps made, the one to evaluate) instead of this worker's parameters.
  bool snapshot_group = false;
  int64_t final_step = 0;  // also keep the parameters after this many steps (0: no)
  int max_snapshots = 16;
  uint64_t max_params = uint64_t{1} << 28;
  // diloco: codecs for the updates, widest first; each worker moves along them as its link
  // measures, to keep its compute utilization at cu_target (worker/link_tuner.h), starting
  // from the algorithm's codec, which must be one of them. Empty: that codec always.
  std::vector<std::string> codec_ladder;
  double cu_target = 0.9;
  // diloco: a worker with a peer that has mixed an exchange when its trainer registers joins
  // the group where it is (a restarted worker): it takes the group's state (θ, outer momentum) from
  // its peers, the furthest first, instead of starting from x0. rejoin_timeout bounds the wait.
  bool rejoin = true;
  absl::Duration rejoin_timeout = absl::Minutes(5);
  // The most peers a rejoining worker takes the state from at once, one slice each
  // (worker/state_fetch.h); 1: all of it from one.
  int state_sources = 3;
  // With a scheduler: the workers that are members in a round (worker/scheduler_client.h), the
  // topology then being built over them (MemberTopology). Unset: every worker, always.
  MemberTopology::MembersFn members;
  // An elastic run (scheduler_client.h, MemberFrom): the step from which this worker is a member
  // (0: one the run started with), nullopt while not known yet. A rejoining worker then takes a
  // state that covers every round before it. Unset: a member from the start.
  std::function<std::optional<int64_t>()> member_from;
};

struct StepInput {
  int64_t step = 0;
  float lr = 0;  // 0: the schedule's
  float loss = 0;
  double compute_seconds = 0;
  double io_seconds = 0;  // the trainer's I/O for its previous call (StepInfo.io_seconds)
  // The step's round is mixed before Step returns, even with overlap (StepInfo.mix_now).
  bool mix_now = false;
  absl::Span<const float> grad;
};
// What a trainer's StepInfo says of its step (the gradient is the caller's to set).
StepInput StepInputOf(const v1::StepInfo& info);

struct StepOutcome {
  int64_t step = 0;
  float lr = 0;
  std::vector<int> mixed, dropped;
  v1::WorkerStats delta;  // what this step added to every counter
  double seconds = 0;     // the engine's own time on this step
};

// The registries a worker builds its codecs, topology and algorithm from, created once by the
// caller (tern worker, tern run, tests) and passed in.
struct WorkerRegistries {
  std::unique_ptr<CodecRegistry> codecs;
  std::unique_ptr<TopologyRegistry> topologies;
  std::unique_ptr<AlgorithmRegistry> algorithms;
};
WorkerRegistries NewBuiltinWorkerRegistries();

class RoundEngine {
 public:
  // `registries` and `transport` must outlive the engine.
  static absl::StatusOr<std::unique_ptr<RoundEngine>> Create(EngineOptions options,
                                                             const WorkerRegistries* registries,
                                                             PeerTransport* transport);

  // Starts the algorithm from `x0` laid out as `layout`. A second call with the same layout is
  // a no-op (a trainer reconnecting); with another layout, FailedPrecondition.
  absl::Status Init(const std::vector<ParamTensor>& layout, absl::Span<const float> x0);
  bool initialized() const;
  // Whether Init asks the peers where the group is (a diloco worker that may be rejoining a
  // running run, or a worker of an elastic run, which may be joining one: it takes a peer's
  // model): they must be known by then, or it starts from its own x0.
  bool rejoins() const {
    return options_.rejoin && (shares_state_ || (options_.member_from && !asynchronous_)) &&
           options_.num_workers > 1 && transport_ != nullptr;
  }
  std::vector<ParamTensor> layout() const;
  int64_t next_step() const;
  // Exchanges mixed so far, every lane's. Any thread.
  int64_t rounds_mixed() const { return rounds_mixed_.load(std::memory_order_relaxed); }
  // The momentum the algorithm applies to a trainer's gradients (Algorithm::Momentum). REQUIRES:
  // Init(); from the thread that calls Step().
  double momentum() const;
  // diloco's warm-up steps (AlgorithmOptions::sync_steps; 0 for other algorithms).
  int64_t sync_steps() const { return options_.algorithm_options.sync_steps; }
  // The codec's choice from the link (EngineOptions::codec_ladder); null without a ladder. Any
  // thread.
  const LinkTuner* link_tuner() const { return tuner_.get(); }
  // H's proposals from the link (AlgorithmOptions::local_steps_max); null without a range. Any
  // thread.
  const StepsTuner* steps_tuner() const { return steps_tuner_.get(); }

  // One training step; see the file comment. REQUIRES: Init().
  absl::StatusOr<StepOutcome> Step(const StepInput& in);
  // The same step in parts, for a trainer whose backward pass hands gradients over as they become
  // final. BeginStep takes the step, lr and the gradient's buffer (`in.grad`, still being
  // written). GradReadyFrom(from) says grad[from, end) is final and the parameters there are no
  // longer read by this step: every bucket inside starts its round (local step, encode, push).
  // FinishStep starts the rest and completes the step (in.loss, in.compute_seconds and
  // in.io_seconds are taken from its argument). A bucket whose gradient is not finite fails the
  // call, and the step with it. REQUIRES: Init().
  absl::Status BeginStep(const StepInput& in);
  absl::Status GradReadyFrom(uint64_t from);
  absl::StatusOr<StepOutcome> FinishStep(const StepInput& in);
  // The buckets' first values, ascending (one bucket: {0}). REQUIRES: Init().
  std::vector<uint64_t> BucketOffsets() const;
  // The current parameters. Only from the thread that calls Step().
  absl::Span<const float> params() const;
  // Moves the parameters into `storage` (a trainer's shared segment), or back into the
  // engine's memory with an empty span (Algorithm::BindParams). Only from the thread that calls
  // Step(), after Init().
  absl::Status BindParams(absl::Span<float> storage);

  // A neighbour's message (`wire_bytes` as received). OK or an error saying why it was refused.
  // `scans` (may be null): its payloads' checks made as they arrived, taken instead of a pass
  // over them now where they cover a part.
  // Large payloads received in place (ReceivedBundle::in_place) stay there until mixed.
  absl::Status Deliver(ReceivedBundle bundle, uint64_t wire_bytes, PayloadScans* scans = nullptr);
  absl::Status Deliver(v1::TensorBundle bundle, uint64_t wire_bytes,
                       PayloadScans* scans = nullptr) {
    return Deliver(ReceivedBundle{std::move(bundle), {}}, wire_bytes, scans);
  }

  // Parameters (or the group's model: EngineOptions::snapshot_group) after `step` steps: NotFound
  // when never kept or evicted, Unavailable when the worker has not got there yet.
  absl::StatusOr<std::vector<float>> GetSnapshot(int64_t step) const;
  // The steps whose parameters are kept now, oldest first.
  std::vector<int64_t> SnapshotSteps() const { return snapshots_.Steps(); }
  // Steps, bytes and seconds; each peer's traffic; refusals by reason; the neighbours up.
  const EngineCounters& counters() const { return counters_; }
  v1::WorkerStats Stats() const { return counters_.Stats(); }

  // Publishes the state after the last step if one is asked for (SharedState) and no step is
  // open: for a group that has stopped stepping (its training done). Round loop only (between
  // the trainer's steps: WorkerDaemon::Post).
  void PublishWanted();
  // The state the group shares (diloco's θ and outer momentum; in an elastic run, a gossip
  // worker's model) after a step at or past `min_step` that ended with no exchange in flight,
  // for a rejoining peer: Unavailable until this worker has come to such a step (the round loop
  // then publishes one), FailedPrecondition for an algorithm without one. Any thread.
  absl::StatusOr<std::shared_ptr<const PublishedState>> SharedState(int64_t min_step);

  // Worker `j` holds the group's state again and sends its updates from round `from` on (a
  // rejoined worker's Gossip.Position): from that round on it is waited for, as a neighbour that
  // is up. FailedPrecondition when this worker may have started that round. Any thread.
  absl::Status PeerBack(int j, int64_t from) ABSL_LOCKS_EXCLUDED(mu_);
  // Worker `j` asked where the group is (Gossip.Position): it listens. If it was heard from
  // before (a restarted worker), our pushes to it may have failed while it was down and left the
  // connection backing off: that is reset now, and from the next round on pushes to it wait for
  // a connection until its next message comes. Ignores a `j` that is not a peer. Any thread.
  void PeerListening(int j) ABSL_LOCKS_EXCLUDED(mu_);
  // Worker `j` is another process now (it asked where the group is, or came back at another
  // address): the one before, if any, is gone, and the messages it had not sent for the rounds
  // under way here will not come. Those rounds stop waiting for them: a dead peer that took our
  // message before it died would otherwise hold this worker to the round's deadline, while a
  // peer whose push to it failed went on, and the two would drop each other's next round (a
  // split of diloco's θ). The new process sends from a later round (PeerBack), never these. A
  // `j` never heard from is starting for the first time (a run's start asks where the group is
  // too): nothing changes. Ignores a `j` that is not a peer. Any thread.
  void PeerReplaced(int j) ABSL_LOCKS_EXCLUDED(mu_);

  // Whether `j` is another worker of this run.
  bool IsPeer(int j) const { return j >= 0 && j < options_.num_workers && j != options_.worker_id; }

  // SwarmSGD: a neighbour's model; answers with ours and averages theirs in at our next step.
  absl::StatusOr<v1::TensorBundle> HandleSwap(v1::TensorBundle bundle, uint64_t wire_bytes);

  // Counts a refused incoming push (the RPC layer refuses some before Deliver) by `why`'s code.
  void CountRefused(const absl::Status& why) { counters_.CountRefused(why); }
  // Wakes a Step() waiting for neighbours and refuses further messages.
  void Shutdown();

 private:
  RoundEngine(EngineOptions options, const WorkerRegistries* registries, PeerTransport* transport,
              std::unique_ptr<Topology> topology, std::unique_ptr<Algorithm> algorithm,
              std::vector<std::string> parts, std::vector<std::string> optional_parts);
  // A message ready to send: its chunks and what it counts as.
  struct Outgoing {
    PeerTransport::Chunks chunks;
    uint64_t payload = 0, dense = 0, wire = 0;
  };
  absl::StatusOr<Outgoing> Pack(int64_t step, int bucket, GossipMessage msg) const;
  // The step between BeginStep and FinishStep.
  struct OpenStep {
    StepInput in;
    StepOutcome out;
    double engine_seconds = 0;  // in this step's calls before FinishStep
    bool grad_checked = false;  // the whole gradient was found finite (Step)
    bool communicates = false;
  };
  absl::Status MakeLanes(const std::vector<ParamTensor>& layout, absl::Span<const float> x0);
  // Lane k's part of the open step: mixes its previous round (overlap), local update, push.
  absl::Status StartLane(size_t k);
  // A worker that becomes a member in round `step` (an elastic run's joiner, a replacement)
  // is not waited for until it says from which round it sends (PeerBack): until then it takes
  // the group's state and sits rounds out. Round loop only.
  void NoteNewMembers(int64_t step);
  // Packs lane `bucket`'s message for round `step` and pushes it to the round's neighbours.
  absl::StatusOr<InFlight> StartRound(Lane& lane, int bucket, int64_t step, GossipMessage msg);
  // Waits for the round's messages (to its deadline) and pushes, mixes, and counts.
  absl::Status FinishRound(Lane& lane, InFlight r, StepOutcome* out) ABSL_LOCKS_EXCLUDED(mu_);
  // Logs, counts and follows (the norm guard's reference) a move of lane `lane`'s schedule from
  // H = `h` in `turns` fragment turns to the lane's current one; nothing when it did not move.
  // `how` says what moved it, built only on a move.
  void NoteScheduleMove(size_t lane, int64_t h, int64_t turns,
                        absl::FunctionRef<std::string()> how);
  // Counts and logs the neighbours of lane `lane`'s round `r` whose group model was not ours.
  void NoteGroupModels(size_t lane, const InFlight& r, const RoundReport& report);
  // SwarmSGD (engine_swarm.cc): swaps with a neighbour, averages in what neighbours left, and
  // publishes our model for their swaps.
  absl::Status RunSwap(int64_t step, GossipMessage msg, StepOutcome* out);
  absl::Status ApplyMerges();
  absl::Status Publish(int64_t step);
  // Decoding time of every lane's algorithm so far.
  double DecodeSeconds() const;
  // Adds the time since `since` to the counter `get`/`set`, less the decoding the algorithm did
  // meanwhile, which goes to decode_seconds, and takes the algorithms' count of clipped
  // contributions. Round loop only.
  void CountTime(EngineCounters::Seconds get, EngineCounters::SetSeconds set, absl::Time since);
  // Feeds the link's tuners step `step`'s counters (`delta`) after the warm-up: moves every lane
  // to the codec the link tuner chooses, and hands every lane the H (and fragment count) the
  // steps tuner proposes. Round loop only.
  absl::Status TuneLink(int64_t step, const v1::WorkerStats& delta);
  // Whether the parameters after `step` steps are kept (EngineOptions::snapshot_every).
  bool SnapshotDue(int64_t step) const;
  // Keeps the snapshot after `step` steps: the parameters, or the group's model
  // (EngineOptions::snapshot_group). Round loop only.
  void KeepSnapshot(int64_t step);
  // EngineOptions::rejoin, from Init: when a peer has mixed an exchange, takes the group's state
  // from its peers (a slice from each of up to state_sources, the furthest first) and moves this
  // worker's next step to just after it. Round loop only.
  absl::Status Rejoin();
  // Rejoin without a state shared by the group: the lanes start again from `got`'s model, taken
  // since `t0`, at the round AnnounceBack settles on by `deadline`.
  absl::Status TakeModel(const FetchedState& got, absl::Time t0, absl::Time deadline);
  // Tells every peer that this worker sends its updates again from a round none of them has
  // started (at least two periods past the furthest, and past `next`; further when a peer got
  // past it while asked), and returns that round.
  absl::StatusOr<int64_t> AnnounceBack(int64_t next, absl::Time deadline);
  // The group's state after `step` into share_, when a peer asked for it and no exchange is in
  // flight. Round loop only.
  void PublishState(int64_t step);
  // Whether Shutdown was called: a rejoin's waits end. Any thread.
  bool stopping() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether this worker has run its last step (EngineOptions::final_step): it mixes and
  // publishes nothing more.
  bool FinishedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return options_.final_step > 0 && next_step_ >= options_.final_step;
  }
  // How this worker fetches a state from its peers (Rejoin, RepairGroupModels): this run's, of
  // this model, ended when the worker shuts down; `one_state` as StateFetchOptions says.
  StateFetchOptions FetchOptions(bool one_state) const;
  // Takes lane `lane`'s part of the group's `state` as its θ and outer momentum (back onto the
  // model's buffer when the lane gathers). Round loop only.
  absl::Status AdoptLaneState(Lane& lane, const GroupState& state);
  // diloco: takes each lane NoteGroupModels found split from the group (repairs_) again from
  // the peers holding the majority's θ, after step `step` (the exchange's), lane by lane.
  // Failures are logged and left to the next exchange that shows the split. Round loop only.
  void RepairGroupModels(int64_t step);

  const EngineOptions options_;
  const WorkerRegistries* const registries_;
  PeerTransport* const transport_;
  RoundGraph graph_;
  const bool asynchronous_;
  ArrivalCheck arrival_;  // what a neighbour's message must pass
  EngineCounters counters_;
  SnapshotStore snapshots_;
  SwarmMailbox swarm_;
  const bool shares_state_;  // the algorithm keeps a state shared by the group (AllToAll)
  StateShare share_;         // that state, published when a rejoining peer asks

  // Round-loop state.
  std::unique_ptr<LinkTuner> tuner_;         // set by Create (codec_ladder), fed by the round loop
  std::unique_ptr<StepsTuner> steps_tuner_;  // set by Create (local_steps_max), the same
  std::vector<Lane> lanes_;                  // made by Init
  uint64_t cut_ = 0;                         // CutFingerprint of the lanes, made by Init
  std::unique_ptr<Algorithm> first_algorithm_;  // lane 0's, until Init succeeds
  std::vector<float> own_params_;               // with buckets: the model, unless bound elsewhere
  absl::Span<float> params_;      // with buckets: the model, where the lanes are bound
  std::optional<OpenStep> open_;  // a step begun and not finished
  absl::Status broken_;           // why no step can run any more (a bucketed step failed part-way)
  PeerHealth health_;             // neighbours worth waiting for, and ever heard from
  double decode_counted_ = 0;     // DecodeSeconds() already counted

  // What Init registered, for Deliver: the model and where each bucket's messages go.
  struct Registered {
    std::vector<ParamTensor> layout;
    uint64_t num_params = 0;  // 0: nothing registered yet
    struct Route {
      std::shared_ptr<GossipInbox> inbox;
      uint64_t size = 0;  // the bucket's values
    };
    std::vector<Route> lanes;
    uint64_t cut = 0;  // CutFingerprint of the lanes
  };
  mutable absl::Mutex mu_;
  Registered registered_ ABSL_GUARDED_BY(mu_);
  int64_t next_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, int64_t> peers_back_ ABSL_GUARDED_BY(mu_);  // PeerBack's: worker -> from round
  std::set<int> peers_listening_ ABSL_GUARDED_BY(mu_);      // PeerListening's, until a round
  // A rejoined worker sends nothing in rounds before this, and answers the messages of those
  // rounds as one that is not there (kept all the same), so no peer waits for it (Rejoin).
  int64_t sit_out_below_ ABSL_GUARDED_BY(mu_) = 0;
  // The furthest round a message was refused for while rejoining, before the inbox moved to
  // where the group is: the state taken must cover it.
  int64_t rejoin_refused_ ABSL_GUARDED_BY(mu_) = -1;
  // (lane, neighbour): whether its last message said another group model than this worker's.
  // Round loop only.
  std::map<std::pair<size_t, int>, bool> group_differs_;
  // Lanes whose θ a round found held by fewer of its workers than another θ (or as many, that
  // one held by a lower id): taken again from `sources`, which hold it, once the step ends.
  // Round loop only.
  struct Repair {
    size_t lane = 0;
    int64_t round = 0;
    std::vector<int> sources;
    int holders = 0, ours = 0;  // workers heard holding the majority's θ, and ours
  };
  std::vector<Repair> repairs_;
  // The members of the last round NoteNewMembers saw, and that round. Round loop only.
  std::optional<std::vector<int>> members_seen_;
  int64_t members_seen_step_ = -1;
  // The members Rejoin found there (MembersAlreadyThere): NoteNewMembers' first view of the run.
  std::optional<std::vector<int>> members_at_rejoin_ ABSL_GUARDED_BY(mu_);
  // From the model's registration until Rejoin knows where the group is (or that a run starts).
  bool rejoin_asking_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> rounds_mixed_{0};  // exchanges mixed: Position's answer
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tern

#endif  // TERN_WORKER_ENGINE_H_

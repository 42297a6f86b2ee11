#include "worker/engine.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/chunking.h"
#include "common/crc32.h"
#include "common/finite.h"
#include "common/rng.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"
#include "kernels/builtin.h"
#include "spdlog/spdlog.h"
#include "worker/gossip_bundle.h"

namespace tern {
namespace {

double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

// The model's tensors as codecs view them: [shape[0], numel / shape[0]], 1-D ones as a column.
// A layout that does not tile the vector in order gives none (one flat tensor).
std::vector<TensorBlock> BlocksOf(const std::vector<ParamTensor>& layout, size_t size) {
  std::vector<TensorBlock> blocks;
  size_t next = 0;
  for (const ParamTensor& p : layout) {
    if (p.offset != next) return {};
    next += p.numel;
    if (p.numel == 0) continue;
    const bool matrix =
        p.shape.size() >= 2 && p.shape[0] > 0 && p.numel % static_cast<uint64_t>(p.shape[0]) == 0;
    blocks.push_back({p.numel, matrix ? static_cast<uint64_t>(p.shape[0]) : p.numel});
  }
  return next == size ? blocks : std::vector<TensorBlock>();
}

// Where the buckets of about `target` values start (ascending, the first 0), cut between blocks
// from the last one back, as a backward pass finishes them. No blocks or no target: one bucket.
std::vector<size_t> BucketStarts(const std::vector<TensorBlock>& blocks, uint64_t target) {
  std::vector<size_t> starts;  // block indices, descending
  uint64_t filled = 0;
  for (size_t b = blocks.size(); target > 0 && b-- > 1;) {
    filled += blocks[b].numel;
    if (filled >= target) {
      starts.push_back(b);
      filled = 0;
    }
  }
  starts.push_back(0);
  std::reverse(starts.begin(), starts.end());
  return starts;
}

}  // namespace

WorkerRegistries NewBuiltinWorkerRegistries() {
  WorkerRegistries r;
  r.codecs = NewBuiltinCodecRegistry();
  r.topologies = NewBuiltinTopologyRegistry();
  r.algorithms = NewBuiltinAlgorithmRegistry();
  return r;
}

absl::StatusOr<std::unique_ptr<RoundEngine>> RoundEngine::Create(EngineOptions options,
                                                                 const WorkerRegistries* registries,
                                                                 PeerTransport* transport) {
  if (options.num_workers < 1 || options.worker_id < 0 ||
      options.worker_id >= options.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker id ", options.worker_id, " is not in [0, ", options.num_workers, ")"));
  }
  if (options.round_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("round timeout must be positive");
  }
  if (options.max_rounds_ahead < 1 || options.snapshot_every < 0 || options.max_snapshots < 1) {
    return absl::InvalidArgumentError("max_rounds_ahead, max_snapshots must be >= 1");
  }
  if (options.snapshot_offset < 0 ||
      (options.snapshot_offset > 0 && options.snapshot_offset >= options.snapshot_every)) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot offset ", options.snapshot_offset, " is not in [0, ",
                     options.snapshot_every, "): it is the step's remainder mod snapshot_every"));
  }
  const CodecRegistry* codecs = registries->codecs.get();
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<Topology> topology,
                        registries->topologies->Create(options.topology));
  // Fail now on a graph or weight rule that cannot work for this many workers.
  TERN_ASSIGN_OR_RETURN(Graph g, topology->GraphFor(options.num_workers, 0));
  TERN_RETURN_IF_ERROR(MixingWeights(g, options.weights).status());
  // Between membership epochs, that is (a scheduler's members only repair the graph).
  const bool static_graph = topology->IsStatic();
  if (options.members) {
    topology = std::make_unique<MemberTopology>(std::move(topology), options.members);
  }
  options.algorithm_options.final_step = options.final_step;
  options.algorithm_options.workers = options.num_workers;
  options.algorithm_options.fragments_max = options.fragments;
  TERN_ASSIGN_OR_RETURN(
      std::unique_ptr<Algorithm> algorithm,
      registries->algorithms->Create(options.algorithm, options.algorithm_options, codecs));
  if (algorithm->AllToAll()) {
    for (const std::vector<int>& nbrs : g.neighbours) {
      if (nbrs.size() + 1 != g.neighbours.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            options.algorithm,
            " keeps one outer state for the whole group, so every worker must hear every other "
            "each round: --topology=complete (not ",
            options.topology, ")"));
      }
    }
  }
  if (algorithm->KeepsNeighbourCopies() && !static_graph) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.algorithm,
        " keeps a copy of each neighbour's model, moved by each message it sends: the graph must "
        "be the same every round (ring, torus, exponential, complete; not ",
        options.topology, ")"));
  }
  if (options.snapshot_group && !algorithm->AllToAll()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--snapshot_model=group keeps diloco's outer model; ", options.algorithm,
                     " has no model shared by the group: --snapshot_model=own"));
  }
  if (const int64_t sync = options.algorithm_options.sync_steps; sync > 0) {
    if (!algorithm->AllToAll()) {
      return absl::InvalidArgumentError(absl::StrCat("--sync_steps is diloco's warm-up; ",
                                                     options.algorithm, " has no outer loop"));
    }
    if (options.algorithm_options.outer_delay != OuterDelay::kNone) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--sync_steps=", sync,
          " ends each warm-up step on the group's mean, which --outer_delay=",
          OuterDelayName(options.algorithm_options.outer_delay), " would take a round late"));
    }
  }
  if (const OuterDelay delay = options.algorithm_options.outer_delay; delay != OuterDelay::kNone) {
    if (!options.overlap || options.overlap_steps != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--outer_delay=", OuterDelayName(delay),
          " runs each exchange during the next round's inner steps: it needs --overlap, and "
          "mixes each round at the next exchange (no --overlap_steps)"));
    }
    // Mixed at the lane's next exchange, which comes first.
    options.overlap_steps = static_cast<int>(algorithm->StepsPerRound());
  } else if (options.overlap_steps < 1 ||
             (options.overlap_steps > 1 &&
              (!options.overlap || options.overlap_steps >= algorithm->StepsPerRound()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--overlap_steps=", options.overlap_steps,
        ": a round mixed that many steps after its push needs --overlap and fewer steps than "
        "from one of ",
        options.algorithm, "'s rounds to the next (", algorithm->StepsPerRound(), ")"));
  }
  if (options.overlap && algorithm->Asynchronous()) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.algorithm, " has no rounds to overlap; --overlap is for the round algorithms"));
  }
  if (options.fragments > 1 && !algorithm->AllToAll()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fragments staggers diloco's exchanges; ", options.algorithm,
                     " exchanges every bucket each round (--bucket_mb)"));
  }
  if (options.fragment_cut != FragmentCut::kContiguous && options.fragments <= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fragment_cut=", FragmentCutName(options.fragment_cut),
                     " cuts fragments: give --fragments"));
  }
  if (options.fragments > 1 && options.bucket_values > 0) {
    return absl::InvalidArgumentError(
        "--fragments and --bucket_mb both cut the model: one of them");
  }
  if (options.bucket_values > 0 && algorithm->Asynchronous()) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.algorithm, " exchanges whole models; --bucket_mb is for the round algorithms"));
  }
  std::unique_ptr<LinkTuner> tuner;
  if (!options.codec_ladder.empty()) {
    if (!algorithm->AllToAll()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--codec_ladder moves diloco's updates between codecs; ", options.algorithm,
                       " keeps one codec for the run"));
    }
    // A decision every three periods: each fragment exchanged three times.
    TERN_ASSIGN_OR_RETURN(
        tuner, LinkTuner::Create({.codecs = options.codec_ladder,
                                  .start = options.algorithm_options.codec,
                                  .cu_target = options.cu_target,
                                  .exchanges_per_window = 3 * std::max(1, options.fragments),
                                  .overlap_steps = options.overlap ? options.overlap_steps : 0},
                                 *registries->codecs));
  }
  std::unique_ptr<StepsTuner> steps_tuner;
  if (const AlgorithmOptions& a = options.algorithm_options; a.local_steps_max > 0) {
    // The algorithm checked the range; a change of H must not land inside an overlap, where the
    // round in flight would be mixed after the new period's first exchange.
    const int hidden = options.overlap ? options.overlap_steps : 0;
    if (options.overlap && a.local_steps_min <= options.overlap_steps) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--local_steps_min=", a.local_steps_min, ": with --overlap_steps=", options.overlap_steps,
          " every H must leave room for the overlap (H > ", options.overlap_steps, ")"));
    }
    TERN_ASSIGN_OR_RETURN(steps_tuner, StepsTuner::Create({.min_steps = a.local_steps_min,
                                                           .max_steps = a.local_steps_max,
                                                           .cu_target = options.cu_target,
                                                           .exchanges_per_window = 3,
                                                           .overlap_steps = hidden,
                                                           .lanes = std::max(1, options.fragments),
                                                           .min_fragments = a.fragments_min}));
  }
  std::vector<std::string> parts = algorithm->MessageParts();
  std::vector<std::string> optional_parts = algorithm->OptionalParts();
  auto engine = absl::WrapUnique(new RoundEngine(std::move(options), registries, transport,
                                                 std::move(topology), std::move(algorithm),
                                                 std::move(parts), std::move(optional_parts)));
  engine->tuner_ = std::move(tuner);
  if (steps_tuner != nullptr) {
    const AlgorithmOptions& a = engine->options_.algorithm_options;
    engine->counters_.SetSchedule(a.local_steps, a.fragments_min > 0 ? a.fragments_max : 0);
  }
  engine->steps_tuner_ = std::move(steps_tuner);
  return engine;
}

RoundEngine::RoundEngine(EngineOptions options, const WorkerRegistries* registries,
                         PeerTransport* transport, std::unique_ptr<Topology> topology,
                         std::unique_ptr<Algorithm> algorithm, std::vector<std::string> parts,
                         std::vector<std::string> optional_parts)
    : options_(std::move(options)),
      registries_(registries),
      transport_(transport),
      graph_(std::move(topology), options_.weights, options_.worker_id, options_.num_workers),
      asynchronous_(algorithm->Asynchronous()),
      arrival_(ArrivalCheckOptions{.run_id = options_.run_id,
                                   .worker_id = options_.worker_id,
                                   .num_workers = options_.num_workers,
                                   .norm_guard = options_.norm_guard,
                                   .sync_steps = options_.algorithm_options.sync_steps},
               graph_.topology(), registries->codecs.get(), std::move(parts),
               std::move(optional_parts)),
      counters_(options_.worker_id),
      snapshots_(options_.max_snapshots),
      swarm_(2 * static_cast<size_t>(options_.num_workers)),
      shares_state_(algorithm->AllToAll()),
      first_algorithm_(std::move(algorithm)),
      health_(options_.num_workers) {}

absl::Status RoundEngine::Init(const std::vector<ParamTensor>& layout, absl::Span<const float> x0) {
  {
    absl::MutexLock lock(&mu_);
    if (registered_.num_params > 0) {
      if (!SameLayout(layout, registered_.layout)) {
        return absl::FailedPreconditionError(
            "a different model is already registered with this worker");
      }
      return broken_;  // OK, or why this worker cannot go on (a failed rejoin)
    }
  }
  if (x0.empty() || x0.size() > options_.max_params) {
    return absl::InvalidArgumentError(absl::StrCat("model of ", x0.size(), " values"));
  }
  TERN_RETURN_IF_ERROR(MakeLanes(layout, x0));
  {
    absl::MutexLock lock(&mu_);
    registered_.layout = layout;
    registered_.num_params = x0.size();
    registered_.cut = cut_;
    for (const Lane& lane : lanes_) {
      registered_.lanes.push_back({lane.inbox, lane.size});
      if (shut_down_) lane.inbox->Close();
    }
    rejoin_asking_ = rejoins();
  }
  if (rejoins()) {
    if (absl::Status s = Rejoin(); !s.ok()) {
      // Registered, but with no state to go on from: the trainer's Register fails, and the
      // worker must be restarted.
      broken_ = s;
      return s;
    }
  }
  if (options_.snapshot_every > 0) {
    // As many as the run will keep: the first step's, one every snapshot_every, the last's.
    const int64_t runs = options_.final_step > 0 ? options_.final_step / options_.snapshot_every + 2
                                                 : int64_t{options_.max_snapshots};
    snapshots_.Reserve(x0.size(),
                       static_cast<int>(std::min<int64_t>(runs, options_.max_snapshots)));
  }
  KeepSnapshot(next_step());
  if (asynchronous_) TERN_RETURN_IF_ERROR(Publish(0));
  return absl::OkStatus();
}

absl::Status RoundEngine::MakeLanes(const std::vector<ParamTensor>& layout,
                                    absl::Span<const float> x0) {
  const std::vector<TensorBlock> blocks = BlocksOf(layout, x0.size());
  // Each lane's blocks (indices, ascending).
  std::vector<std::vector<size_t>> plan;
  if (options_.fragments > 1 && options_.fragment_cut == FragmentCut::kStrided && !blocks.empty()) {
    plan = StridedFragments(layout, options_.fragments);
  } else {
    uint64_t target = options_.bucket_values;
    if (options_.fragments > 1) {
      const uint64_t p = static_cast<uint64_t>(options_.fragments);
      target = (x0.size() + p - 1) / p;
    }
    const std::vector<size_t> starts = BucketStarts(blocks, target);
    for (size_t k = 0; k < starts.size(); ++k) {
      const size_t end = k + 1 < starts.size() ? starts[k + 1] : blocks.size();
      plan.emplace_back();
      for (size_t b = starts[k]; b < end; ++b) plan.back().push_back(b);
    }
  }
  std::vector<uint64_t> block_offset(blocks.size() + 1, 0);
  for (size_t b = 0; b < blocks.size(); ++b)
    block_offset[b + 1] = block_offset[b] + blocks[b].numel;
  std::vector<Lane> lanes(plan.size());
  for (size_t k = 0; k < lanes.size(); ++k) {
    Lane& lane = lanes[k];
    std::vector<TensorBlock> mine;
    for (size_t b : plan[k]) {
      mine.push_back(blocks[b]);
      if (!lane.pieces.empty() &&
          lane.pieces.back().offset + lane.pieces.back().size == block_offset[b]) {
        lane.pieces.back().size += blocks[b].numel;
      } else {
        lane.pieces.push_back({block_offset[b], blocks[b].numel});
      }
    }
    if (blocks.empty()) lane.pieces.push_back({0, x0.size()});  // no layout: one flat tensor
    lane.offset = lane.pieces.front().offset;
    for (const Piece& p : lane.pieces) lane.size += p.size;
    // Lane 0 runs the algorithm made by Create, which stays ours until every lane is made (a
    // failed Init may be tried again).
    Algorithm* algorithm = first_algorithm_.get();
    if (k > 0) {
      // Stochastic codecs draw apart in each bucket.
      AlgorithmOptions o = options_.algorithm_options;
      o.seed = Mix64(o.seed ^ (0x9e3779b97f4a7c15ULL * k));
      o.lane = static_cast<int>(k);
      o.lanes = static_cast<int>(plan.size());
      TERN_ASSIGN_OR_RETURN(lane.algorithm, registries_->algorithms->Create(
                                                options_.algorithm, o, registries_->codecs.get()));
      algorithm = lane.algorithm.get();
    }
    lane.blocks = mine;
    TERN_RETURN_IF_ERROR(
        algorithm->Init(lane.Gather(x0, &lane.grad), options_.worker_id, std::move(mine)));
    // Rounds are as far apart as the longest H the group may take.
    lane.inbox = std::make_shared<GossipInbox>(
        options_.max_rounds_ahead,
        std::max<int64_t>(algorithm->StepsPerRound(), options_.algorithm_options.local_steps_max));
    lane.last_push.resize(static_cast<size_t>(options_.num_workers));
    lane.push_before.resize(static_cast<size_t>(options_.num_workers));
    lane.held.resize(static_cast<size_t>(options_.num_workers));
  }
  lanes[0].algorithm = std::move(first_algorithm_);
  lanes_ = std::move(lanes);
  std::vector<std::vector<Piece>> cut;
  for (const Lane& lane : lanes_) cut.push_back(lane.pieces);
  cut_ = CutFingerprint(cut);
  if (lanes_.size() > 1) {
    own_params_.assign(x0.begin(), x0.end());
    TERN_RETURN_IF_ERROR(BindParams(absl::MakeSpan(own_params_)));
  }
  return absl::OkStatus();
}

std::vector<uint64_t> RoundEngine::BucketOffsets() const {
  std::vector<uint64_t> offsets;
  for (const Lane& lane : lanes_) offsets.push_back(lane.offset);
  return offsets;
}

bool RoundEngine::initialized() const {
  absl::MutexLock lock(&mu_);
  return registered_.num_params > 0;
}

std::vector<ParamTensor> RoundEngine::layout() const {
  absl::MutexLock lock(&mu_);
  return registered_.layout;
}

int64_t RoundEngine::next_step() const {
  absl::MutexLock lock(&mu_);
  return next_step_;
}

StepInput StepInputOf(const v1::StepInfo& info) {
  StepInput in;
  in.step = static_cast<int64_t>(info.step());
  in.lr = info.lr();
  in.loss = info.loss();
  in.compute_seconds = info.compute_seconds();
  in.io_seconds = info.io_seconds();
  in.mix_now = info.mix_now();
  return in;
}

double RoundEngine::momentum() const {
  // Every lane's algorithm has the same; lane 0's is still first_algorithm_ until Init.
  return (lanes_.empty() ? *first_algorithm_ : *lanes_[0].algorithm).Momentum();
}

absl::Span<const float> RoundEngine::params() const {
  if (lanes_.size() == 1) return lanes_[0].algorithm->params();
  return params_;
}

absl::Status RoundEngine::BindParams(absl::Span<float> storage) {
  if (lanes_.empty()) return absl::FailedPreconditionError("no model registered");
  if (lanes_.size() == 1) return lanes_[0].algorithm->BindParams(storage);
  // Every lane moves onto its range of one buffer (copying its values there): `storage`, or our
  // own again.
  if (storage.empty()) storage = absl::MakeSpan(own_params_);
  if (storage.data() == params_.data()) return absl::OkStatus();
  if (storage.size() != own_params_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("storage for ", storage.size(),
                                                   " values; the model has ", own_params_.size()));
  }
  for (Lane& lane : lanes_) {
    // A gathered lane's algorithm keeps its own vector, copied into the model as it changes.
    if (lane.gathered()) {
      lane.Scatter(storage);
    } else {
      TERN_RETURN_IF_ERROR(lane.algorithm->BindParams(storage.subspan(lane.offset, lane.size)));
    }
  }
  params_ = storage;
  return absl::OkStatus();
}

absl::StatusOr<StepOutcome> RoundEngine::Step(const StepInput& in) {
  if (!broken_.ok()) return broken_;
  // The whole gradient is checked first: a refused step changes nothing in any bucket.
  if (!AllFinite(in.grad)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the gradient of step ", in.step, " holds Inf or NaN; nothing was changed"));
  }
  TERN_RETURN_IF_ERROR(BeginStep(in));
  open_->grad_checked = true;
  return FinishStep(in);
}

absl::Status RoundEngine::BeginStep(const StepInput& in) {
  uint64_t num_params;
  {
    absl::MutexLock lock(&mu_);
    num_params = registered_.num_params;
    if (num_params == 0) return absl::FailedPreconditionError("no model registered");
    if (shut_down_) return absl::UnavailableError("worker is shutting down");
    if (in.step != next_step_) {
      return absl::FailedPreconditionError(
          absl::StrCat("step ", in.step, " sent, but this worker's next step is ", next_step_));
    }
  }
  if (!broken_.ok()) return broken_;
  if (in.grad.size() != num_params) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient of ", in.grad.size(), " values for a model of ", num_params));
  }
  // A step left open by a failure that changed nothing is begun again.
  open_ = OpenStep();
  open_->in = in;
  open_->out.step = in.step;
  open_->out.lr = in.lr > 0 ? in.lr : static_cast<float>(options_.lr.At(in.step));
  open_->engine_seconds = 0;
  for (Lane& lane : lanes_) lane.started = false;
  if (asynchronous_) {
    absl::Status s = ApplyMerges();
    if (!s.ok()) open_.reset();
    return s;
  }
  return absl::OkStatus();
}

absl::Status RoundEngine::GradReadyFrom(uint64_t from) {
  if (!open_.has_value()) return absl::FailedPreconditionError("no step begun");
  const absl::Time t0 = absl::Now();
  const int64_t step = open_->in.step;
  for (size_t k = lanes_.size(); k-- > 0 && lanes_[k].offset >= from;) {
    if (lanes_[k].started) continue;
    absl::Status s = StartLane(k);
    if (!s.ok()) {
      open_.reset();
      // Buckets already updated and pushed cannot be taken back: this worker cannot go on.
      if (std::any_of(lanes_.begin(), lanes_.end(), [](const Lane& l) { return l.started; })) {
        broken_ = absl::FailedPreconditionError(
            absl::StrCat("step ", step, " failed part-way (", s.message(),
                         "), after some of its buckets were "
                         "sent; this worker cannot go on: restart it"));
      }
      return s;
    }
  }
  open_->engine_seconds += Seconds(t0);
  return absl::OkStatus();
}

absl::Status RoundEngine::StartLane(size_t k) {
  Lane& lane = lanes_[k];
  OpenStep& open = *open_;
  const int64_t step = open.in.step;
  const absl::Span<const float> grad = lane.Gather(open.in.grad, &lane.grad);
  if (!open.grad_checked && !AllFinite(grad)) {
    return absl::InvalidArgumentError(absl::StrCat("the gradient of step ", step, " holds Inf or ",
                                                   "NaN in bucket ", k, "; the step failed"));
  }
  lane.started = true;
  // Lanes may take turns (diloco's fragments): the step communicates when any lane does.
  const bool communicates = lane.algorithm->Communicates(step);
  if (lane.round.has_value() &&
      (communicates || step - lane.round->step >= options_.overlap_steps)) {
    // Overlap: the previous round's messages had this step's compute (overlap_steps' worth) to
    // arrive. Mixing them before this step's local update keeps the algorithm's order of calls.
    InFlight previous = *std::move(lane.round);
    lane.round.reset();
    TERN_RETURN_IF_ERROR(FinishRound(lane, std::move(previous), &open.out));
  }
  const absl::Time t0 = absl::Now();
  TERN_ASSIGN_OR_RETURN(GossipMessage msg, lane.algorithm->Prepare(grad, open.out.lr, step));
  open.communicates = open.communicates || communicates;
  const int bucket = static_cast<int>(k);
  if (communicates) arrival_.ObserveOwn(bucket, step, msg);  // the norm guard's reference: encoding
  CountTime(&v1::WorkerStats::encode_seconds, &v1::WorkerStats::set_encode_seconds, t0);
  if (asynchronous_) {
    if (communicates) TERN_RETURN_IF_ERROR(RunSwap(step, std::move(msg), &open.out));
    return Publish(step + 1);
  }
  if (!communicates) {
    // A round still in flight (overlap_steps > 1) stays open; the steps after it are closed when
    // it is taken.
    if (!lane.round.has_value()) lane.inbox->Skip(step + 1);
    return absl::OkStatus();
  }
  const absl::Time t_pack = absl::Now();
  TERN_ASSIGN_OR_RETURN(lane.round, StartRound(lane, bucket, step, std::move(msg)));
  // Serializing, chunking and handing the pushes to the transport count as encoding.
  counters_.AddSeconds(&v1::WorkerStats::encode_seconds, &v1::WorkerStats::set_encode_seconds,
                       Seconds(t_pack));
  return absl::OkStatus();
}

absl::Status RoundEngine::TuneLink(int64_t step, const v1::WorkerStats& delta) {
  if (step < sync_steps()) return absl::OkStatus();
  if (steps_tuner_ != nullptr) {
    steps_tuner_->ObserveStep(delta.step_seconds(),
                              delta.wait_seconds() + delta.transfer_seconds());
    const int64_t current = lanes_[0].algorithm->StepsPerRound();
    const int64_t turns = lanes_[0].algorithm->FragmentCount();
    if (const std::optional<int64_t> h = steps_tuner_->Decide(current, turns); h.has_value()) {
      const StepsState st = steps_tuner_->Snapshot();
      for (Lane& lane : lanes_) lane.algorithm->ProposeSchedule(*h, st.fragments);
      if (*h != current || st.fragments != turns) {
        spdlog::info(
            "worker {}: step {}: proposes H = {}{} (now {}{}): compute utilization {:.0f}%, an "
            "update's pushes took {:.3f} s against {:.3f} s of compute a step{}",
            options_.worker_id, step, *h,
            st.fragments > 0 ? absl::StrCat(" in ", st.fragments, " fragments") : "", current,
            turns > 0 ? absl::StrCat(" in ", turns) : "", 100 * st.cu, st.push_seconds,
            st.compute_seconds,
            st.fragments > 0
                ? absl::StrFormat(" (the link as fitted: %.3f s a round trip, %.3g MB/s)",
                                  st.round_trip_seconds, st.bytes_per_second / 1e6)
                : "");
      }
    }
  }
  if (tuner_ == nullptr) return absl::OkStatus();
  tuner_->ObserveStep(delta.step_seconds(), delta.wait_seconds() + delta.transfer_seconds());
  const std::optional<LinkTuner::Change> change = tuner_->Decide();
  if (!change.has_value()) return absl::OkStatus();
  for (Lane& lane : lanes_) TERN_RETURN_IF_ERROR(lane.algorithm->SetCodec(change->codec));
  spdlog::info("worker {}: step {}: updates in {} from now on: {}", options_.worker_id, step,
               change->codec, change->why);
  return absl::OkStatus();
}

absl::StatusOr<StepOutcome> RoundEngine::FinishStep(const StepInput& in) {
  if (!open_.has_value() || open_->in.step != in.step) {
    return absl::FailedPreconditionError(absl::StrCat("step ", in.step, " was not begun"));
  }
  const absl::Time t_finish = absl::Now();
  TERN_RETURN_IF_ERROR(GradReadyFrom(0));
  open_->engine_seconds -= Seconds(t_finish);  // counted whole below
  OpenStep open = *std::move(open_);
  open_.reset();
  StepOutcome& out = open.out;
  // Without overlap every round is mixed now, the first pushed first; the last step mixes its
  // own round either way (the final model includes it), and so does a step the trainer reads
  // the result of before its next (mix_now).
  if (!options_.overlap || in.mix_now || in.step + 1 == options_.final_step) {
    for (size_t k = lanes_.size(); k-- > 0;) {
      Lane& lane = lanes_[k];
      if (!lane.round.has_value()) continue;
      InFlight r = *std::move(lane.round);
      lane.round.reset();
      TERN_RETURN_IF_ERROR(FinishRound(lane, std::move(r), &out));
    }
  }
  if (lanes_.size() > 1) {
    for (std::vector<int>* v : {&out.mixed, &out.dropped}) {
      std::sort(v->begin(), v->end());
      v->erase(std::unique(v->begin(), v->end()), v->end());
    }
  }
  const absl::Time t_settle = absl::Now();
  for (Lane& lane : lanes_) {
    lane.algorithm->Settle();  // mixing Combine deferred (combining)
    // A gathered lane's values go back into the model once a step, when the trainer reads it.
    if (lane.gathered()) lane.Scatter(params_);
  }
  CountTime(&v1::WorkerStats::combine_seconds, &v1::WorkerStats::set_combine_seconds, t_settle);
  out.delta = counters_.EndStep(open.communicates, in.loss, in.compute_seconds, in.io_seconds);
  TERN_RETURN_IF_ERROR(TuneLink(in.step, out.delta));
  {
    absl::MutexLock lock(&mu_);
    next_step_ = in.step + 1;
  }
  if (!repairs_.empty()) RepairGroupModels(in.step);
  // After next_step_ moves on (GetSnapshot relies on that order).
  if (SnapshotDue(in.step + 1)) KeepSnapshot(in.step + 1);
  if (share_.Wanted(in.step)) PublishState(in.step);
  out.seconds = open.engine_seconds + Seconds(t_finish);
  return out;
}

absl::StatusOr<RoundEngine::Outgoing> RoundEngine::Pack(int64_t step, int bucket,
                                                        GossipMessage msg) const {
  const int me = options_.worker_id;
  Outgoing o;
  o.payload = msg.PayloadBytes();
  for (const auto& [name, t] : msg.parts) o.dense += 4 * t.numel;
  v1::TensorBundle bundle = GossipToBundle(std::move(msg), options_.run_id, step, me);
  if (lanes_.size() > 1) {
    bundle.set_bucket(static_cast<uint32_t>(bucket));
    bundle.set_buckets(static_cast<uint32_t>(lanes_.size()));
    bundle.set_cut(cut_);
  }
  TERN_ASSIGN_OR_RETURN(
      std::vector<v1::BundleChunk> chunks,
      ChunkBundle(bundle, (static_cast<uint64_t>(me) << 40) ^ static_cast<uint64_t>(step) ^
                              (static_cast<uint64_t>(bucket) << 56)));
  for (const auto& c : chunks) o.wire += c.ByteSizeLong() + 5;  // + gRPC message prefix
  o.chunks = std::make_shared<const std::vector<v1::BundleChunk>>(std::move(chunks));
  return o;
}

void RoundEngine::NoteNewMembers(int64_t step) {
  if (!options_.members || step == members_seen_step_) return;
  std::optional<std::vector<int>> now = options_.members(step);
  if (!now.has_value()) return;
  std::sort(now->begin(), now->end());
  if (!members_seen_.has_value()) {
    // A worker going on in a running run sees the members for the first time: those its rejoin
    // did not find there (admitted since, or still taking the state) are newcomers to it, as
    // they are to the members that saw them join. Without this it waited a round deadline for
    // each every exchange, where the others did not.
    absl::MutexLock lock(&mu_);
    members_seen_ = std::exchange(members_at_rejoin_, std::nullopt);
  }
  if (members_seen_.has_value()) {
    for (int j : *now) {
      if (!IsPeer(j) || std::binary_search(members_seen_->begin(), members_seen_->end(), j)) {
        continue;
      }
      health_.Joining(j);
      spdlog::info(
          "worker {}: round {}: worker {} joins the run; waited for once it says from when",
          options_.worker_id, step, j);
    }
  }
  members_seen_ = std::move(now);
  members_seen_step_ = step;
}

absl::StatusOr<InFlight> RoundEngine::StartRound(Lane& lane, int bucket, int64_t step,
                                                 GossipMessage msg) {
  NoteNewMembers(step);
  std::vector<int> back;
  std::set<int> listening;
  {
    absl::MutexLock lock(&mu_);
    listening.swap(peers_listening_);
    for (auto it = peers_back_.begin(); it != peers_back_.end();) {
      if (it->second > step) {
        ++it;
        continue;
      }
      back.push_back(it->first);
      it = peers_back_.erase(it);
    }
  }
  for (int j : listening) health_.Returning(j);
  for (int j : back) {
    if (!health_.up(j)) {
      spdlog::info("worker {}: round {}: worker {} is back", options_.worker_id, step, j);
    }
    health_.MarkUp(j);
  }
  InFlight r;
  r.step = step;
  TERN_ASSIGN_OR_RETURN(RoundGraph::Round round, graph_.At(step));
  r.nbrs = std::move(round.neighbours);
  r.row = std::move(round.row);
  r.deadline = absl::Now() + options_.round_timeout;
  // A round's timeout more: a transfer the rejoiner's state shares its link with, not a wait.
  r.lasting_deadline = r.deadline + options_.round_timeout;
  bool sit_out;
  {
    absl::MutexLock lock(&mu_);
    sit_out = step < sit_out_below_;
  }
  if (sit_out) {
    // A rejoined worker before its peers wait for it: a message might reach some in time and
    // not others, so it sends none, and its update waits for a later round.
    r.sat_out = true;
    r.pushes = std::make_shared<RoundPushes>();
    r.pushes->sent = absl::Now();
    lane.algorithm->WithdrawOwn();
    return r;
  }
  if (shares_state_) {
    // Every worker applies the same exchanges to θ: its CRC, said with the message, lets each
    // receiver check that the group's model is the same bytes everywhere.
    const absl::Span<const float> theta = lane.algorithm->GroupModel();
    if (!theta.empty()) {
      r.group_crc = Crc32(theta.data(), theta.size() * sizeof(float));
      msg.group_crc = r.group_crc;
    }
  }
  TERN_ASSIGN_OR_RETURN(Outgoing o, Pack(step, bucket, std::move(msg)));
  r.payload = o.payload;
  r.dense = o.dense;
  r.wire = o.wire;
  lane.Push(r, o.chunks, health_, transport_);
  return r;
}

absl::Status RoundEngine::FinishRound(Lane& lane, InFlight r, StepOutcome* out) {
  const size_t k = static_cast<size_t>(&lane - lanes_.data());
  const int64_t h = lane.algorithm->StepsPerRound();
  const int64_t turns = lane.algorithm->FragmentCount();
  TERN_ASSIGN_OR_RETURN(RoundReport report, lane.Finish(r, options_.worker_id, health_));
  rounds_mixed_.fetch_add(1, std::memory_order_relaxed);
  if (tuner_ != nullptr && r.step >= sync_steps()) {
    tuner_->ObserveExchange(r.payload, report.push_seconds);
  }
  if (steps_tuner_ != nullptr && r.step >= sync_steps()) {
    steps_tuner_->ObserveExchange(report.push_seconds, static_cast<double>(r.payload), turns);
  }
  // The group's agreement (Diloco::Combine): every worker that mixed the same updates moves at
  // the same step.
  NoteScheduleMove(k, h, turns, [&] {
    const int64_t now = lane.algorithm->StepsPerRound();
    int64_t next = r.step + 1;
    while (next < r.step + 2 * now && !lane.algorithm->Communicates(next)) ++next;
    return absl::StrCat(" at step ", r.step, ", its next exchange at step ", next,
                        ": the largest proposed in that exchange");
  });
  CountTime(&v1::WorkerStats::combine_seconds, &v1::WorkerStats::set_combine_seconds,
            report.combine_started);
  out->mixed.insert(out->mixed.end(), report.mixed.begin(), report.mixed.end());
  out->dropped.insert(out->dropped.end(), report.dropped.begin(), report.dropped.end());
  NoteGroupModels(k, r, report);
  if (r.sat_out && shares_state_ && !report.mixed.empty()) {
    // A round sat out mixes the others' updates into θ as they all do. One it missed from a
    // peer still up (sent before this worker could take it: it was taking the group's state)
    // leaves θ apart from theirs, which its first exchange would show, a split, only rounds
    // later: it takes the state again from those it heard, at this step's end.
    std::vector<int> missed;
    for (int j : report.dropped) {
      if (health_.up(j)) missed.push_back(j);
    }
    if (!missed.empty()) {
      spdlog::info(
          "worker {}: round {}: sat out without the update of workers {}: θ taken again from "
          "workers {}",
          options_.worker_id, r.step, absl::StrJoin(missed, ","), absl::StrJoin(report.mixed, ","));
      repairs_.push_back(Repair{.lane = k,
                                .round = r.step,
                                .sources = report.mixed,
                                .holders = static_cast<int>(report.mixed.size()),
                                .ours = 1});
    }
  }
  int up = 0;
  for (int j : r.nbrs) up += health_.up(j) ? 1 : 0;
  counters_.CountRound(r, report, {up, static_cast<int>(r.nbrs.size())});
  return absl::OkStatus();
}

void RoundEngine::NoteScheduleMove(size_t lane, int64_t h, int64_t turns,
                                   absl::FunctionRef<std::string()> how) {
  const Algorithm& a = *lanes_[lane].algorithm;
  const int64_t now = a.StepsPerRound();
  const int64_t now_turns = a.FragmentCount();
  if (now == h && now_turns == turns) return;
  spdlog::info(
      "worker {}: lane {}: H = {} (was {}){}{}", options_.worker_id, lane, now, h,
      now_turns != turns ? absl::StrCat(" in ", now_turns, " fragments (was ", turns, ")") : "",
      how());
  counters_.CountScheduleChange(now, now_turns);
  if (now != h) {
    arrival_.ScaleOuterReference(static_cast<int>(lane),
                                 static_cast<double>(now) / static_cast<double>(h));
  }
}

void RoundEngine::NoteGroupModels(size_t lane, const InFlight& r, const RoundReport& report) {
  if (!r.group_crc.has_value()) return;
  counters_.CountGroupMismatches(report.group_mismatch.size());
  if (!report.group_mismatch.empty()) {
    if (std::optional<GroupMajority> other =
            MajorityElsewhere(options_.worker_id, *r.group_crc, report.group_crcs)) {
      repairs_.push_back(Repair{.lane = lane,
                                .round = r.step,
                                .sources = std::move(other->holders),
                                .holders = other->count,
                                .ours = other->ours});
    }
  }
  std::set<int> differ(report.group_mismatch.begin(), report.group_mismatch.end());
  for (int j : report.mixed) {
    // Said when it starts and when it ends, not every round it lasts.
    const bool now = differ.count(j) > 0;
    auto [it, first] = group_differs_.try_emplace({lane, j}, false);
    if (it->second == now) continue;
    it->second = now;
    if (now) {
      spdlog::warn(
          "worker {}: round {}: worker {}'s group model differs from this worker's (lane {}; a "
          "split: counted in tern_worker_group_model_mismatches_total until it ends)",
          options_.worker_id, r.step, j, lane);
    } else if (!first) {
      spdlog::info("worker {}: round {}: worker {}'s group model is this worker's again (lane {})",
                   options_.worker_id, r.step, j, lane);
    }
  }
}

absl::Status RoundEngine::Deliver(ReceivedBundle received, uint64_t wire_bytes,
                                  PayloadScans* scans) {
  const v1::TensorBundle& bundle = received.bundle;
  uint64_t num_params, size = 0, buckets, cut;
  int64_t sit_out;
  bool asking, finished;
  std::shared_ptr<GossipInbox> inbox;
  const int bucket = static_cast<int>(std::min<uint32_t>(bundle.bucket(), 1u << 30));
  {
    absl::MutexLock lock(&mu_);
    num_params = registered_.num_params;
    buckets = registered_.lanes.size();
    cut = registered_.cut;
    sit_out = sit_out_below_;
    asking = rejoin_asking_;
    finished = FinishedLocked();
    if (static_cast<size_t>(bucket) < buckets) {
      inbox = registered_.lanes[static_cast<size_t>(bucket)].inbox;
      size = registered_.lanes[static_cast<size_t>(bucket)].size;
    }
  }
  absl::Status s = [&]() -> absl::Status {
    if (num_params == 0) return absl::UnavailableError("this worker has no model registered yet");
    if (asynchronous_) {
      return absl::FailedPreconditionError(
          absl::StrCat(options_.algorithm, " has no rounds; use Gossip.Swap"));
    }
    if (std::max<uint32_t>(bundle.buckets(), 1) != buckets || inbox == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("message for bucket ", bundle.bucket(), " of ",
                                                     std::max<uint32_t>(bundle.buckets(), 1),
                                                     "; this worker cuts its model into ", buckets,
                                                     " (--bucket_mb, or --fragments, must match)"));
    }
    if (buckets > 1 && bundle.cut() != 0 && bundle.cut() != cut) {
      return absl::InvalidArgumentError(absl::StrCat(
          "message for bucket ", bundle.bucket(), " of a model cut another way (fingerprint ",
          absl::Hex(bundle.cut()), "; this worker's ", absl::Hex(cut),
          "): --bucket_mb, --fragments and --fragment_cut must match, and the model"));
    }
    // Checked again by Put under the inbox's lock; this early answer saves the decoding of a
    // message for a closed round. One too far ahead is still checked: if genuine, it tells how
    // far its sender has come (GossipInbox::kPassedBy), so this worker stops waiting for it.
    const int64_t round =
        static_cast<int64_t>(std::min<uint64_t>(bundle.round(), uint64_t{1} << 62));
    const absl::Status window = inbox->CheckRound(round);
    const auto sits_out = [&] { return SitsOutError(options_.worker_id, round); };
    if (!window.ok() && (absl::IsCancelled(window) || round < inbox->floor())) {
      // A rejoining worker's state covers the rounds it closed: it sends nothing for them, so
      // their senders must not wait for its message there (as for a round it sits out). A plain
      // "closed" would keep it awaited, for a round deadline, as a peer ahead is.
      if (!absl::IsCancelled(window) && round < sit_out) return sits_out();
      if (!absl::IsCancelled(window) && finished) {
        // Behind a worker that has run every round, its sender would wait a round deadline for
        // it in each of its own (a peer that refused as ahead of it is alive, and mixes again
        // once the sender catches up): this one never will.
        return absl::CancelledError(absl::StrCat("worker ", options_.worker_id,
                                                 " has finished its training (",
                                                 options_.final_step, " steps) and mixes no more"));
      }
      return window;
    }
    TERN_ASSIGN_OR_RETURN(auto checked, arrival_.Check(std::move(received), bucket, size, scans));
    if (!window.ok() || asking) {
      if (!window.ok()) inbox->Note(round, checked.first);
      if (asking || sit_out == std::numeric_limits<int64_t>::max()) {
        // Rejoining, before its inbox moved to where the group is: the state it takes will be
        // after this round (Rejoin asks for one), and the sender is not to wait for it here. Not
        // kept, even within the window: a run that turns out to be starting (nobody mixed yet)
        // takes it on the sender's retry, which goes on while this worker was never heard from.
        absl::MutexLock lock(&mu_);
        rejoin_refused_ = std::max(rejoin_refused_, round);
        if (asking) {
          // Not final: a sender that never heard from this worker tries again.
          return absl::UnavailableError(
              absl::StrCat("worker ", options_.worker_id,
                           " is rejoining the run and does not know where it is yet: round ", round,
                           " not taken"));
        }
        // Final: its sender does not try again, so it is not waited for here either.
        inbox->GiveUp(round, checked.first);
        return sits_out();
      }
      return window;
    }
    const uint64_t payload = checked.second.PayloadBytes();
    const int sender = checked.first;
    TERN_RETURN_IF_ERROR(inbox->Put(round, sender, std::move(checked.second)));
    counters_.CountReceived(sender, payload, wire_bytes);
    // Kept and mixed, but its sender is not to wait for this worker's message in that round.
    if (round < sit_out) return sits_out();
    return absl::OkStatus();
  }();
  if (!s.ok() && !absl::IsUnavailable(s)) CountRefused(s);
  return s;
}

void RoundEngine::CountTime(EngineCounters::Seconds get, EngineCounters::SetSeconds set,
                            absl::Time since) {
  const double total = Seconds(since);
  const double decoded = DecodeSeconds();
  const double decode = std::clamp(decoded - decode_counted_, 0.0, total);
  decode_counted_ = decoded;
  counters_.AddSeconds(get, set, total - decode, decode);
  // Mixing is where contributions are clipped: counted after every call that mixes.
  uint64_t clipped = 0, resynced = 0;
  for (const Lane& lane : lanes_) {
    clipped += lane.algorithm->contributions_clipped();
    resynced += lane.algorithm->copies_resynced();
  }
  counters_.SetClipped(clipped);
  counters_.SetCopiesResynced(resynced);
}

double RoundEngine::DecodeSeconds() const {
  double total = 0;
  for (const Lane& lane : lanes_) total += lane.algorithm->decode_seconds();
  return total;
}

bool RoundEngine::SnapshotDue(int64_t step) const {
  return (options_.snapshot_every > 0 &&
          step % options_.snapshot_every == options_.snapshot_offset) ||
         step == options_.final_step;
}

void RoundEngine::KeepSnapshot(int64_t step) {
  if (!options_.snapshot_group) {
    snapshots_.Keep(step, params());
    return;
  }
  // One model-sized copy a snapshot, gathered straight into the store's own: the lanes cut the
  // whole model, so they write every value of it.
  snapshots_.Keep(step, params().size(), [this](absl::Span<float> group) {
    for (const Lane& lane : lanes_) lane.Place(lane.algorithm->GroupModel(), group);
  });
}

absl::StatusOr<std::vector<float>> RoundEngine::GetSnapshot(int64_t step) const {
  // Read before the store: FinishStep keeps step s's snapshot after next_step_ reaches s and
  // before it passes s, so a snapshot missing when next_step_ was past it is gone, not late.
  int64_t next;
  bool registered;
  {
    absl::MutexLock lock(&mu_);
    next = next_step_;
    registered = registered_.num_params > 0;
  }
  if (std::optional<std::vector<float>> x = snapshots_.Get(step)) return *std::move(x);
  if (!registered || step > next || (step == next && (step == 0 || SnapshotDue(step)))) {
    // TernTrainer.snapshot waits on this message's "not at step ", and only on it.
    return absl::UnavailableError(
        absl::StrCat("not at step ", step, " yet (done ", next, " steps)"));
  }
  return absl::NotFoundError(absl::StrCat(
      "no snapshot of step ", step, " (kept every ", options_.snapshot_every, " steps from step ",
      options_.snapshot_offset, ", the newest ", options_.max_snapshots, ")"));
}

bool RoundEngine::stopping() const {
  absl::MutexLock lock(&mu_);
  return shut_down_;
}

void RoundEngine::Shutdown() {
  swarm_.Close();
  std::vector<std::shared_ptr<GossipInbox>> inboxes;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    for (const Registered::Route& r : registered_.lanes) inboxes.push_back(r.inbox);
  }
  for (const auto& inbox : inboxes) inbox->Close();
}

}  // namespace tern

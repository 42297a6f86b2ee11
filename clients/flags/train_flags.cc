#include "clients/flags/train_flags.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "clients/flags/flag_types.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "core/workload/partition.h"

ABSL_DECLARE_FLAG(std::string, lr_schedule);  // task_flags.cc: the servers' too

ABSL_FLAG(std::string, algorithm, "decentlam",
          "training: dpsgd | dmsgd | decentlam | heavy-ball | choco | local-sgd | swarm | diloco "
          "(DiLoCo's outer step among the workers, no server: the complete graph, --outer, "
          "--local_steps, --fragments; --codec on the updates, with error feedback)");
ABSL_FLAG(std::string, codec, "fp16",
          "training: CHOCO's and diloco's compressor (any codec spec, e.g. topk:ratio=0.01); for "
          "the other algorithms what x is sent with (none, fp16, bf16)");
ABSL_FLAG(tern::Double<tern::HalfOpen(0, 1)>, momentum, 0.9,
          "training: momentum of dmsgd, decentlam, heavy-ball, choco");
ABSL_FLAG(tern::Double<tern::AboveUpTo(0, 1)>, consensus_step, 0.5,
          "training: CHOCO's consensus step size in (0, 1]");
ABSL_FLAG(tern::Double<tern::AtLeast(0)>, gossip_clip, 4,
          "training: clip each neighbour's contribution (its model's distance from this "
          "worker's; CHOCO's compressed difference) to this many times the lower median of "
          "recent ones, so that no message moves a worker far (ClippedGossip; "
          "docs/robustness.md); 0 turns clipping off");
ABSL_FLAG(bool, overlap, false,
          "training: push round t's message at the end of step t and mix it at the start of step "
          "t+1, so its transfer overlaps the next compute (round algorithms; docs/worker.md)");
ABSL_FLAG(tern::Int<tern::In(1, 1024)>, overlap_steps, 1,
          "training, with --overlap: mix a round this many steps after its push, so its transfer "
          "has that many steps' compute (Streaming DiLoCo's tau); above 1 only for diloco and "
          "local-sgd, below --local_steps");
ABSL_FLAG(tern::Double<tern::HalfOpen(0, 1)>, merge_alpha, 0,
          "training, diloco: after an exchange the model becomes alpha x the local model + (1 - "
          "alpha) x the group's outer model (Streaming DiLoCo's merge, e.g. 0.5 with "
          "--overlap_steps); 0: the outer model");
ABSL_FLAG(bool, keep_overlap, false,
          "training, diloco: after an exchange the model becomes the group's outer model plus the "
          "steps taken since the update was sent (with --overlap none is lost; in place of "
          "--merge_alpha; docs/worker.md)");
ABSL_FLAG(std::string, outer_delay, "none",
          "training, diloco, with --overlap: none | delayed (each exchange runs during the next "
          "round's inner steps, its outer step taken a round late; every round starts from the "
          "outer model) | eager (the same, each round started from the outer model stepped with "
          "this worker's own fresh update as a stand-in for the group's; docs/worker.md)");
ABSL_FLAG(tern::Int<tern::In(0, 1 << 30)>, sync_steps, 0,
          "training, diloco: the first this many steps exchange every step and end on the "
          "group's plain mean, the outer optimizer untouched (synchronous data parallelism for a "
          "warm-up, as PostLocalSGD's; docs/worker.md); 0: the outer loop from the first step");
ABSL_FLAG(std::string, codec_ladder, "",
          "training, diloco: codecs for the updates, widest first (e.g. none,int8,fp4; --codec, "
          "where each worker starts, among them): each worker moves along them as its link "
          "measures, to keep its compute utilization at --cu_target (docs/worker.md); empty: "
          "--codec always");
ABSL_FLAG(tern::Double<tern::Open(0, 1)>, cu_target, 0.9,
          "training, with --codec_ladder or --local_steps_max: the share of each step's time not "
          "spent waiting that the codec's and H's choices aim for");
ABSL_FLAG(tern::Int<tern::In(0, 1 << 20)>, local_steps_max, 0,
          "training, diloco: H moves within [--local_steps_min, this] as the group agrees (each "
          "worker proposes the least H that keeps its compute utilization at --cu_target over "
          "its link as measured; the group takes the largest; docs/worker.md), starting from "
          "--local_steps; 0: H fixed");
ABSL_FLAG(tern::Int<tern::In(1, 1 << 20)>, local_steps_min, 1,
          "training, diloco with --local_steps_max: the least H the group may move to");
ABSL_FLAG(tern::Int<tern::In(0, 1024)>, fragments_min, 0,
          "training, diloco with --fragments and --local_steps_max: the fragment count moves "
          "with H within [this, --fragments] as the group agrees: at q, the fragments exchange "
          "in q turns a period, fragment k with those k mod q (fewer where the round trip, not "
          "the bytes, is what the overlap cannot hide; docs/worker.md); 0: every fragment its "
          "own turn, always");
ABSL_FLAG(tern::Double<tern::In(0, 1048576)>, bucket_mb, 0,
          "training: cut the model into buckets of about this many MB of fp32 values (whole "
          "tensors, from the last back), each gossiped as soon as the backward pass finishes it, "
          "with the built-in trainer (round algorithms; same on every worker; docs/worker.md); "
          "0: one message a round");
ABSL_FLAG(tern::Int<tern::In(0, 1024)>, fragments, 0,
          "training, diloco: cut the model into about this many fragments (runs of whole tensors "
          "of about equal size), each exchanged at its own step, --local_steps / fragments apart "
          "(Streaming DiLoCo: each exchange carries one fragment); the same on every worker; 0 "
          "or 1: the whole model at once");
ABSL_FLAG(std::string, fragment_cut, "contiguous",
          "training, diloco, with --fragments: contiguous (runs of whole tensors from the last "
          "back) | strided (the layers dealt out in turn, layer l to fragment l mod fragments, "
          "so each fragment spans the depth: Streaming DiLoCo's cut; layers are named by the "
          "first number in a tensor's name, e.g. blocks.3.; docs/worker.md)");
ABSL_FLAG(tern::Double<tern::Above(0)>, round_timeout, 10,
          "training: seconds a round waits for its neighbours");
ABSL_FLAG(bool, rejoin, true,
          "training, diloco: a worker whose peers are past their first exchange when its trainer "
          "registers (a restarted one) takes the group's state from them and goes on where they "
          "are (docs/worker.md, \"A worker that rejoins\"); false: it starts from its own start");
ABSL_FLAG(tern::Double<tern::Above(0)>, rejoin_timeout, 300,
          "training, diloco: seconds a rejoining worker waits for the group's state");
ABSL_FLAG(tern::Int<tern::In(1, 64)>, state_sources, 3,
          "training: a rejoining or joining worker takes the state from this many peers at once, "
          "a slice from each (docs/worker.md, \"A worker that rejoins\"): faster where peers "
          "send slower than they receive, and over a long round trip; 1: all of it from one");
ABSL_FLAG(tern::Int<tern::AtLeast(1)>, epochs, 5,
          "training: passes over the training set (all workers together)");
ABSL_FLAG(tern::Int64<tern::AtLeast(0)>, max_steps, 0,
          "training: stop each worker after this many steps (0: --epochs)");
ABSL_FLAG(tern::Int64<tern::AtLeast(0)>, crash_after_steps, 0,
          "training, fault injection: the built-in trainer SIGKILLs its worker once it has done "
          "this many steps, at that step's end (tern run --kill_worker sets it); 0: never");
ABSL_FLAG(tern::Int<tern::In(0, 600000)>, min_step_ms, 0,
          "training, testing: the built-in trainer makes each step take at least this many "
          "milliseconds (it sleeps after its compute), as a larger model's would: keeps a run of "
          "the small built-in model in the proportion of compute to failure detection real runs "
          "have; 0: as fast as it computes");
ABSL_FLAG(tern::Int<tern::In(1, 256)>, compute_threads, 1,
          "training: threads of the built-in model's matrix products (OpenBLAS) per process; 1 "
          "suits several workers on one machine");

namespace tern {

double EffectiveLr() {
  const double lr = absl::GetFlag(FLAGS_lr).value;
  if (lr > 0) return lr;
  const std::string a = absl::GetFlag(FLAGS_algorithm);
  const bool momentum = a != "dpsgd" && a != "local-sgd" && a != "swarm" && a != "diloco";
  // Same effective step lr / (1 - beta) either way.
  return momentum ? 0.1 * (1 - absl::GetFlag(FLAGS_momentum).value) : 0.1;
}

std::string EffectiveTopology() {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag("topology");
  // diloco needs every worker to hear every other: at its default, --topology means the complete
  // graph for it (any other graph is refused).
  if (absl::GetFlag(FLAGS_algorithm) == "diloco" && flag != nullptr &&
      flag->CurrentValue() == flag->DefaultValue()) {
    return "complete";
  }
  return absl::GetFlag(FLAGS_topology);
}

absl::StatusOr<EngineOptions> EngineOptionsFromFlags(int id, int workers, int64_t snapshot_every,
                                                     int64_t total_steps) {
  EngineOptions o;
  o.run_id = absl::GetFlag(FLAGS_run_id);
  o.worker_id = id;
  o.num_workers = workers;
  o.algorithm = absl::GetFlag(FLAGS_algorithm);
  o.algorithm_options.momentum = absl::GetFlag(FLAGS_momentum).value;
  o.algorithm_options.consensus_step = absl::GetFlag(FLAGS_consensus_step).value;
  o.algorithm_options.codec = absl::GetFlag(FLAGS_codec);
  o.algorithm_options.local_steps = absl::GetFlag(FLAGS_local_steps).value;
  if (const std::string outer = absl::GetFlag(FLAGS_outer); !outer.empty()) {
    o.algorithm_options.outer = outer;
  }
  o.algorithm_options.seed = absl::GetFlag(FLAGS_seed);
  o.algorithm_options.clip.factor = absl::GetFlag(FLAGS_gossip_clip).value;
  o.topology = EffectiveTopology();
  TERN_ASSIGN_OR_RETURN(o.weights, ParseWeightRule(absl::GetFlag(FLAGS_weights)));
  TERN_ASSIGN_OR_RETURN(
      o.lr, ParseLrSchedule(absl::GetFlag(FLAGS_lr_schedule), EffectiveLr(), total_steps));
  const double timeout = absl::GetFlag(FLAGS_round_timeout).value;
  if (!(timeout > 0)) return absl::InvalidArgumentError("--round_timeout must be > 0");
  o.round_timeout = absl::Seconds(timeout);
  o.rejoin = absl::GetFlag(FLAGS_rejoin);
  o.rejoin_timeout = absl::Seconds(absl::GetFlag(FLAGS_rejoin_timeout).value);
  o.state_sources = absl::GetFlag(FLAGS_state_sources).value;
  o.overlap = absl::GetFlag(FLAGS_overlap);
  o.overlap_steps = absl::GetFlag(FLAGS_overlap_steps).value;
  o.algorithm_options.merge_alpha = absl::GetFlag(FLAGS_merge_alpha).value;
  o.algorithm_options.keep_overlap = absl::GetFlag(FLAGS_keep_overlap);
  TERN_ASSIGN_OR_RETURN(o.algorithm_options.outer_delay,
                        ParseOuterDelay(absl::GetFlag(FLAGS_outer_delay)));
  o.algorithm_options.sync_steps = absl::GetFlag(FLAGS_sync_steps).value;
  o.codec_ladder = absl::StrSplit(absl::GetFlag(FLAGS_codec_ladder), ',', absl::SkipEmpty());
  o.cu_target = absl::GetFlag(FLAGS_cu_target).value;
  o.algorithm_options.local_steps_min = absl::GetFlag(FLAGS_local_steps_min).value;
  o.algorithm_options.local_steps_max = absl::GetFlag(FLAGS_local_steps_max).value;
  o.algorithm_options.fragments_min = absl::GetFlag(FLAGS_fragments_min).value;
  // In [0, 1048576] by its type (clients/flags/flag_types.h).
  o.bucket_values = static_cast<uint64_t>(absl::GetFlag(FLAGS_bucket_mb).value * (1 << 20) / 4);
  o.fragments = absl::GetFlag(FLAGS_fragments).value;
  TERN_ASSIGN_OR_RETURN(o.fragment_cut, ParseFragmentCut(absl::GetFlag(FLAGS_fragment_cut)));
  o.norm_guard.factor = absl::GetFlag(FLAGS_norm_guard).value;
  o.snapshot_every = snapshot_every;
  o.final_step = total_steps;
  return o;
}

BuiltinTrainerOptions TrainerOptionsFromFlags(int id, int workers) {
  BuiltinTrainerOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.data_dir = absl::GetFlag(FLAGS_data);
  o.partition = absl::GetFlag(FLAGS_partition);
  o.batch = absl::GetFlag(FLAGS_batch).value;
  o.epochs = absl::GetFlag(FLAGS_epochs).value;
  o.worker_id = id;
  o.num_workers = workers;
  o.seed = absl::GetFlag(FLAGS_seed);
  o.max_steps = absl::GetFlag(FLAGS_max_steps).value;
  o.crash_after_steps = absl::GetFlag(FLAGS_crash_after_steps).value;
  o.min_step = absl::Milliseconds(absl::GetFlag(FLAGS_min_step_ms).value);
  return o;
}

std::string ModelFlag() { return absl::GetFlag(FLAGS_model); }
int BatchFlag() { return absl::GetFlag(FLAGS_batch).value; }
int ComputeThreadsFlag() { return absl::GetFlag(FLAGS_compute_threads).value; }

void ApplyComputeThreads() { SetComputeThreads(absl::GetFlag(FLAGS_compute_threads).value); }

absl::Status CheckDataFlags() {
  const std::string model = absl::GetFlag(FLAGS_model);
  // Fashion-MNIST's shape: a spec's validity does not depend on it.
  if (absl::Status m = CreateModel(model, 784, 10).status(); !m.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--model=", model, ": ", m.message()));
  }
  const std::string partition = absl::GetFlag(FLAGS_partition);
  if (absl::Status p = ParsePartition(partition).status(); !p.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--partition=", partition, ": ", p.message()));
  }
  const std::string data = absl::GetFlag(FLAGS_data);
  if (!data.empty() && !IsDirectory(data)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data=", data, ": no such directory (Fashion-MNIST's .gz files)"));
  }
  return absl::OkStatus();
}

int64_t CapSteps(int64_t steps) {
  const int64_t cap = absl::GetFlag(FLAGS_max_steps).value;
  return cap > 0 ? std::min(steps, cap) : steps;
}

std::vector<std::string> SharedTrainFlagArgs() {
  return {
      absl::StrCat("--run_id=", absl::GetFlag(FLAGS_run_id)),
      absl::StrCat("--algorithm=", absl::GetFlag(FLAGS_algorithm)),
      absl::StrCat("--topology=", EffectiveTopology()),
      absl::StrCat("--weights=", absl::GetFlag(FLAGS_weights)),
      absl::StrCat("--codec=", absl::GetFlag(FLAGS_codec)),
      absl::StrCat("--momentum=", absl::GetFlag(FLAGS_momentum).value),
      absl::StrCat("--consensus_step=", absl::GetFlag(FLAGS_consensus_step).value),
      absl::StrCat("--gossip_clip=", absl::GetFlag(FLAGS_gossip_clip).value),
      absl::StrCat("--local_steps=", absl::GetFlag(FLAGS_local_steps).value),
      absl::StrCat("--outer=", absl::GetFlag(FLAGS_outer)),
      absl::StrCat("--lr=", EffectiveLr()),
      absl::StrCat("--lr_schedule=", absl::GetFlag(FLAGS_lr_schedule)),
      absl::StrCat("--round_timeout=", absl::GetFlag(FLAGS_round_timeout).value),
      absl::StrCat("--rejoin=", absl::GetFlag(FLAGS_rejoin) ? "true" : "false"),
      absl::StrCat("--rejoin_timeout=", absl::GetFlag(FLAGS_rejoin_timeout).value),
      absl::StrCat("--state_sources=", absl::GetFlag(FLAGS_state_sources).value),
      absl::StrCat("--overlap=", absl::GetFlag(FLAGS_overlap) ? "true" : "false"),
      absl::StrCat("--overlap_steps=", absl::GetFlag(FLAGS_overlap_steps).value),
      absl::StrCat("--merge_alpha=", absl::GetFlag(FLAGS_merge_alpha).value),
      absl::StrCat("--keep_overlap=", absl::GetFlag(FLAGS_keep_overlap) ? "true" : "false"),
      absl::StrCat("--outer_delay=", absl::GetFlag(FLAGS_outer_delay)),
      absl::StrCat("--sync_steps=", absl::GetFlag(FLAGS_sync_steps).value),
      absl::StrCat("--codec_ladder=", absl::GetFlag(FLAGS_codec_ladder)),
      absl::StrCat("--cu_target=", absl::GetFlag(FLAGS_cu_target).value),
      absl::StrCat("--local_steps_min=", absl::GetFlag(FLAGS_local_steps_min).value),
      absl::StrCat("--local_steps_max=", absl::GetFlag(FLAGS_local_steps_max).value),
      absl::StrCat("--fragments_min=", absl::GetFlag(FLAGS_fragments_min).value),
      absl::StrCat("--bucket_mb=", absl::GetFlag(FLAGS_bucket_mb).value),
      absl::StrCat("--fragments=", absl::GetFlag(FLAGS_fragments).value),
      absl::StrCat("--fragment_cut=", absl::GetFlag(FLAGS_fragment_cut)),
      absl::StrCat("--norm_guard=", absl::GetFlag(FLAGS_norm_guard).value),
      absl::StrCat("--seed=", absl::GetFlag(FLAGS_seed)),
      absl::StrCat("--model=", absl::GetFlag(FLAGS_model)),
      absl::StrCat("--data=", absl::GetFlag(FLAGS_data)),
      absl::StrCat("--partition=", absl::GetFlag(FLAGS_partition)),
      absl::StrCat("--batch=", absl::GetFlag(FLAGS_batch).value),
      absl::StrCat("--epochs=", absl::GetFlag(FLAGS_epochs).value),
      absl::StrCat("--max_steps=", absl::GetFlag(FLAGS_max_steps).value),
      absl::StrCat("--compute_threads=", absl::GetFlag(FLAGS_compute_threads).value),
      absl::StrCat("--min_step_ms=", absl::GetFlag(FLAGS_min_step_ms).value),
  };
}

int LoadEvalSetup(EvalSetup* out) {
  auto data = LoadTrainingData(absl::GetFlag(FLAGS_data), absl::GetFlag(FLAGS_seed));
  if (!data.ok()) {
    std::fprintf(stderr, "tern run: %s\n", data.status().ToString().c_str());
    return 1;
  }
  auto model = CreateModel(absl::GetFlag(FLAGS_model), data->test.dim, data->test.num_classes);
  if (!model.ok()) {
    std::fprintf(stderr, "tern run: %s\n", model.status().ToString().c_str());
    return 2;
  }
  out->data = *std::move(data);
  out->model = *std::move(model);
  return 0;
}

}  // namespace tern

#include "server/aggregator.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/chunking.h"
#include "common/crc32.h"
#include "common/file_util.h"
#include "common/finite.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "core/federated/protocol.h"
#include "core/model/bundle.h"
#include "kernels/builtin.h"
#include "kernels/format/cast.h"
#include "kernels/format/randomk.h"
#include "kernels/wire.h"
#include "server/buffered_rounds.h"
#include "server/round.h"
#include "spdlog/spdlog.h"

namespace tern {
namespace {

constexpr int kUnlimited = 1 << 30;
// internal::AggregatorCheckpoint.format this server writes; it also reads format 2 (the same
// snapshot without an update log).
constexpr uint32_t kCheckpointFormat = 3;
constexpr uint32_t kOldCheckpointFormat = 2;
// ServerStatus.staleness's entries; the last counts every older update too.
constexpr int64_t kStalenessBuckets = 64;

void Scale(double s, absl::Span<float> values) {
  if (s == 1.0) return;
  const float f = static_cast<float>(s);
  for (float& v : values) v *= f;
}

std::unique_ptr<Downstream> MakeDownstream(const AggregatorOptions& o,
                                           const CodecRegistry* codecs) {
  if (o.downstream == "delta") {
    return std::make_unique<DeltaDownstream>(codecs, o.downstream_codec, o.task.seed(),
                                             o.keep_deltas);
  }
  return std::make_unique<ModelDownstream>(codecs, o.downstream_codec);
}

std::unique_ptr<Rounds> MakeRounds(const AggregatorOptions& o) {
  if (o.mode == "fedbuff") return std::make_unique<BufferedRounds>(o.policy);
  return std::make_unique<RoundTracker>(o.policy);
}

// The run's rate by round, from the task's: ps's server step's, or the clients' local rate.
absl::StatusOr<LrSchedule> RoundLrSchedule(const AggregatorOptions& o) {
  const double base = o.mode == "ps" ? o.task.gradient().lr() : o.task.local().lr();
  absl::StatusOr<LrSchedule> lr = ParseLrSchedule(o.lr_schedule, base, o.total_rounds);
  if (!lr.ok()) {
    return absl::Status(lr.status().code(),
                        absl::StrCat("--lr_schedule=", o.lr_schedule, ": ", lr.status().message()));
  }
  return lr;
}

bool Scheduled(const LrSchedule& lr) {
  return lr.kind != LrSchedule::Kind::kConstant || lr.warmup_steps > 0;
}

// Checked by NormalizeAggregatorOptions: never the fallback.
LrSchedule ValidRoundLrSchedule(const AggregatorOptions& o) {
  return RoundLrSchedule(o).value_or(LrSchedule{});
}

// `round_lr`: the run's rate by round (ValidRoundLrSchedule).
std::unique_ptr<ServerStep> MakeServerStep(const AggregatorOptions& o, Downstream* downstream,
                                           std::unique_ptr<OuterOptimizer> outer,
                                           const LrSchedule& round_lr) {
  // Only ps steps with the run's rate; the other modes' outer step has its own (server_lr).
  const LrSchedule lr = o.mode == "ps" ? round_lr : LrSchedule{};
  const v1::GradientStep& g = o.task.gradient();
  const std::string& opt = g.optimizer();
  if (IsAdamOptimizer(opt)) {
    AdamSettings as;
    as.lr = g.lr();
    as.beta1 = g.beta1();
    as.beta2 = o.beta2;
    as.eps = g.eps();
    as.lamb = opt.find("lamb") != std::string::npos;
    // NormalizeAggregatorOptions gives the 1-bit ones a delta downstream.
    if (IsOnebitOptimizer(opt)) {
      return std::make_unique<AdamServerStep>(as, static_cast<int64_t>(g.warmup_rounds()),
                                              static_cast<DeltaDownstream*>(downstream));
    }
    return std::make_unique<AdamServerStep>(as, 0, nullptr, lr);
  }
  return std::make_unique<OuterServerStep>(std::move(outer), lr);
}

// The outer optimizer of a run that is not Adam's (null for those), and what it asks of the
// clients: SparseLoCo's decaying residual needs their error feedback.
absl::StatusOr<std::unique_ptr<OuterOptimizer>> MakeOuter(AggregatorOptions* o,
                                                          const OuterOptimizerRegistry& registry) {
  const v1::GradientStep& g = o->task.gradient();
  if (IsAdamOptimizer(g.optimizer())) return std::unique_ptr<OuterOptimizer>();
  if (o->outer.empty()) {
    // ps: the updates are gradients, so the server takes the SGD step itself.
    const float lr = o->mode == "ps" ? -g.lr() : static_cast<float>(o->server_lr);
    return NewHeavyBallOuterOptimizer(lr, static_cast<float>(o->server_momentum));
  }
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<OuterOptimizer> outer, registry.Create(o->outer));
  if (const float decay = outer->residual_decay(); decay != 1.0f) {
    if (!o->task.memory().empty() && o->task.memory() != "ef") {
      return absl::InvalidArgumentError(
          absl::StrCat("--outer=", o->outer,
                       " keeps its momentum in the clients' error feedback: "
                       "no other --memory (got ",
                       o->task.memory(), ")"));
    }
    o->task.set_error_feedback(true);
    o->task.set_residual_decay(decay);
  }
  return outer;
}

}  // namespace

namespace {

absl::Status CheckLocalTraining(const v1::LocalTraining& l, const std::string& mode) {
  if (l.local_epochs() == 0 && l.local_steps() == 0) {
    return absl::InvalidArgumentError("local training needs local epochs or local steps");
  }
  if (l.batch() == 0 || !(l.lr() > 0)) {
    return absl::InvalidArgumentError("local training needs batch >= 1 and lr > 0");
  }
  if (!(l.norm_test_eta() >= 0) || !std::isfinite(l.norm_test_eta())) {
    return absl::InvalidArgumentError("the norm test's eta must be >= 0");
  }
  if (const float a = l.anchor_pull(); !(a >= 0 && a <= 1)) {
    return absl::InvalidArgumentError("the anchor pull alpha must be in [0, 1]");
  } else if (a > 0 && mode != "local-sgd") {
    // Clients keep their own models between rounds: every client must take part in every one.
    return absl::InvalidArgumentError("Overlap-Local-SGD's anchor needs mode local-sgd");
  }
  return absl::OkStatus();
}

// Majority-vote signSGD / Signum: signs up (the update codec "sign" unless one is given), the
// vote down as one bit a coordinate (a delta downstream in "sign" with one scale a tensor), and
// the server steps by the vote alone: no server momentum, no error feedback (a vote's signs are
// the whole message), no Adam.
absl::Status NormalizeMajorityVote(AggregatorOptions* o, const CodecRegistry& codecs) {
  const auto parsed = SpecParams::ParseSpec(o->rule);
  // A malformed rule is the registry's to refuse, with its own message.
  if (!parsed.ok() || parsed->first != "majority-vote") return absl::OkStatus();
  const std::string& m = o->task.memory();
  if (o->mode != "ps") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rule=majority-vote votes on gradients' signs: it needs --mode=ps (got ", o->mode, ")"));
  }
  if (const std::string& opt = o->task.gradient().optimizer(); !opt.empty() && opt != "sgd") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rule=majority-vote steps by the vote itself: --optimizer=sgd (got ", opt, ")"));
  }
  if (o->server_momentum != 0) {
    return absl::InvalidArgumentError(
        "--rule=majority-vote steps by the vote itself: no --server_momentum (Signum's momentum "
        "is the clients': --memory=momentum)");
  }
  if (o->task.error_feedback() || (!m.empty() && m.rfind("momentum", 0) != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rule=majority-vote sends signs without error feedback: no --error_feedback and no "
        "--memory but momentum (got '",
        m, "')"));
  }
  if (o->task.update_codec() == "none") o->task.set_update_codec("sign");
  o->downstream = "delta";
  if (o->downstream_codec == "none") o->downstream_codec = "sign:chunk=1073741824";
  return codecs.Create(o->downstream_codec).status();
}

absl::Status CheckGradientStep(const v1::GradientStep& g) {
  if (g.batch() == 0 || !(g.lr() > 0)) {
    return absl::InvalidArgumentError("a gradient step needs batch >= 1 and lr > 0");
  }
  TERN_RETURN_IF_ERROR(CheckOptimizerName(g.optimizer()));
  if (IsAdamOptimizer(g.optimizer())) {
    if (!(g.beta1() >= 0 && g.beta1() < 1) || !(g.eps() > 0)) {
      return absl::InvalidArgumentError("Adam needs 0 <= beta1, beta2 < 1 and eps > 0");
    }
    if (IsOnebitOptimizer(g.optimizer()) && g.warmup_rounds() < 1) {
      return absl::InvalidArgumentError("1-bit Adam / LAMB needs warmup rounds >= 1");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AggregatorOptions> NormalizeAggregatorOptions(AggregatorOptions o,
                                                             const CodecRegistry& codecs) {
  if (o.mode == "local-sgd" || o.mode == "ps") {
    // Every available client every round; a round closes when all replied or at its deadline.
    o.policy.clients_per_round = kUnlimited;
    o.policy.min_replies = kUnlimited;
  } else if (o.mode == "fedbuff") {
    if (o.policy.buffer < 1 || o.policy.concurrency < 0) {
      return absl::InvalidArgumentError(absl::StrCat("fedbuff needs --buffer >= 1 (got ",
                                                     o.policy.buffer, ") and --concurrency >= 0"));
    }
    TERN_ASSIGN_OR_RETURN(o.policy.staleness, ParseStaleness(o.staleness));
  } else if (o.mode != "federated") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown mode '", o.mode, "' (--mode: federated, local-sgd, ps, fedbuff)"));
  } else if (o.policy.min_replies > o.policy.clients_per_round) {
    return absl::InvalidArgumentError(
        absl::StrCat("--min_replies=", o.policy.min_replies, " is more than --clients_per_round=",
                     o.policy.clients_per_round, ": a round could never close on its replies"));
  }
  if (o.edge_rounds < 0) return absl::InvalidArgumentError("edge rounds must be >= 0");
  if (o.edge_rounds > 0) {
    if (o.mode != "federated" && o.mode != "local-sgd") {
      return absl::InvalidArgumentError(absl::StrCat(
          "an edge aggregator (--parent) runs federated or local-sgd rounds, not ", o.mode));
    }
    if (o.downstream != "model") {
      // Each parent task replaces the model: there is no chain of deltas to catch up along.
      return absl::InvalidArgumentError(
          "an edge aggregator (--parent) sends its clients the model: --downstream=model");
    }
  }
  if (o.dp.clip < 0) return absl::InvalidArgumentError("--dp_clip must be >= 0");
  if (o.dp.clip > 0) {
    if (o.mode != "federated" && o.mode != "local-sgd") {
      return absl::InvalidArgumentError(
          absl::StrCat("DP-FedAvg (--dp_clip) runs federated or local-sgd rounds, not ", o.mode));
    }
    if (o.rule != "fedavg") {
      return absl::InvalidArgumentError(absl::StrCat(
          "DP-FedAvg (--dp_clip) adds its noise to the sum of --rule=fedavg, not ", o.rule));
    }
    if (o.task.error_feedback() || !o.task.memory().empty()) {
      // The residual would send later what the clip took off now.
      return absl::InvalidArgumentError(
          "DP-FedAvg (--dp_clip) clips what each client sends: no --error_feedback or --memory");
    }
    if (o.dp.clip_count_noise == 0) {
      // Andrew et al. 2021's choice: the count's noise costs the update's little at their K.
      o.dp.clip_count_noise = static_cast<double>(o.policy.clients_per_round) / 20;
    }
    TERN_RETURN_IF_ERROR(CheckDpOptions(o.dp));
    o.task.set_dp_clip(static_cast<float>(o.dp.clip));
  }
  if (o.secagg.enabled) {
    TERN_RETURN_IF_ERROR(CheckSecAggOptions(o.secagg));
    if (o.mode != "federated" && o.mode != "local-sgd") {
      return absl::InvalidArgumentError(absl::StrCat(
          "secure aggregation (--secagg) runs federated or local-sgd rounds, not ", o.mode));
    }
    if (o.rule != "fedavg") {
      return absl::InvalidArgumentError(absl::StrCat(
          "secure aggregation (--secagg) gives the server the sum alone: --rule=fedavg, not ",
          o.rule, " (a robust rule needs each update)"));
    }
    absl::StatusOr<std::pair<std::string, SpecParams>> codec =
        SpecParams::ParseSpec(o.task.update_codec());
    if (codec.ok() && codec->first == "randomk" && !o.task.error_feedback() &&
        o.task.memory().empty()) {
      // Random-k with one seed a round for every client: the kept values of all clients sit at
      // the same positions, so their quantized vectors add up in the ring.
      TERN_ASSIGN_OR_RETURN(const format::RandomKParams keep,
                            format::ParseRandomKParams(codec->second));
      TERN_RETURN_IF_ERROR(codec->second.CheckAllUsed("codec 'randomk'"));
      o.secagg.keep_ratio = keep.ratio;
      o.secagg.keep_unbiased = keep.unbiased;
    } else if (o.task.update_codec() != "none" || o.task.error_feedback() ||
               !o.task.memory().empty()) {
      // The masks are added to integers mod 2^b: a codec's output would have to be integer and
      // add up to the code of the sum, which the other codecs' outputs (each scaled by its own
      // client's norm, or at its own positions) do not. The quantization to --secagg_bits is the
      // compression.
      return absl::InvalidArgumentError(absl::StrCat(
          "secure aggregation (--secagg) sums the clients' updates quantized to --secagg_bits "
          "in the ring: --update_codec=none or randomk:ratio=R (one seed a round for all), with "
          "no --error_feedback or --memory (codec '",
          o.task.update_codec(), "''s output is not an integer vector that adds up)"));
    }
    if (o.dp.clip > 0) {
      if (o.dp.clip_quantile > 0) {
        // Each client's "within the clip" would reach the server in the clear.
        return absl::InvalidArgumentError(
            "adaptive clipping (--dp_clip_quantile) counts each client's answer in the clear: "
            "with --secagg the clip is fixed");
      }
      // Distributed noise: each of the K clients adds N(0, z^2 S^2 / K), so that K masked
      // updates sum with the central mechanism's noise (fewer, with less: each round is
      // accounted at the noise its survivors added).
      o.secagg.noise_sd = o.dp.noise * o.dp.clip /
                          std::sqrt(static_cast<double>(std::max(1, o.policy.clients_per_round)));
    }
    if (o.edge_rounds > 0) {
      return absl::InvalidArgumentError(
          "an edge aggregator (--parent) runs its own rounds in the clear so far: no --secagg");
    }
    const uint32_t k = static_cast<uint32_t>(o.policy.clients_per_round);
    if (o.mode == "federated" && (k < 3 || (o.secagg.threshold > 0 && k < o.secagg.threshold + 1) ||
                                  (o.secagg.levels > 0 && uint64_t{k} * o.secagg.levels >=
                                                              (uint64_t{1} << o.secagg.bits)))) {
      return absl::InvalidArgumentError(
          absl::StrCat("secure aggregation (--secagg) with --clients_per_round=", k,
                       ": a round needs 3 clients at least, t + 1 for --secagg_threshold, and K x "
                       "--secagg_levels under 2^--secagg_bits"));
    }
    if (o.min_clients < 3) o.min_clients = 3;  // the fewest a mask hides one update among
  }
  // The work matches the mode: gradients for ps, local training otherwise.
  if (o.mode == "ps") {
    if (!o.task.has_gradient()) {
      return absl::InvalidArgumentError("mode ps needs a gradient-step task (Task.gradient)");
    }
    TERN_RETURN_IF_ERROR(CheckGradientStep(o.task.gradient()));
  } else {
    if (!o.task.has_local()) {
      return absl::InvalidArgumentError(
          absl::StrCat("mode ", o.mode, " needs a local-training task (Task.local)"));
    }
    TERN_RETURN_IF_ERROR(CheckLocalTraining(o.task.local(), o.mode));
  }
  if (o.total_rounds < 1) return absl::InvalidArgumentError("total rounds must be >= 1");
  TERN_ASSIGN_OR_RETURN(const LrSchedule lr, RoundLrSchedule(o));
  if (Scheduled(lr) && IsOnebitOptimizer(o.task.gradient().optimizer())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--lr_schedule=", o.lr_schedule, " with --optimizer=", o.task.gradient().optimizer(),
        ": not built (a client catching up replays the missed rounds' steps at its task's one "
        "rate)"));
  }
  if (Scheduled(lr) && o.edge_rounds > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lr_schedule=", o.lr_schedule,
                     " on an edge aggregator: its rounds are its parent's; give the schedule to "
                     "the parent"));
  }
  if (o.eval_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eval_every must be >= 0, got ", o.eval_every));
  }
  if (o.min_clients < 1) return absl::InvalidArgumentError("min clients must be >= 1");
  if (o.policy.clients_per_round < 1 || o.policy.min_replies < 1) {
    return absl::InvalidArgumentError("clients per round and min replies must be >= 1");
  }
  if (o.policy.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the round deadline must be > 0");
  }
  TERN_RETURN_IF_ERROR(CheckLearnedDeadline(LearnedDeadline(o.policy)));
  if (!(o.server_lr > 0) || !(o.server_momentum >= 0 && o.server_momentum < 1)) {
    return absl::InvalidArgumentError("need server_lr > 0 and 0 <= server_momentum < 1");
  }
  if (!o.outer.empty()) {
    if (o.mode == "ps") {
      return absl::InvalidArgumentError(
          "--outer is for federated and local-sgd runs (ps steps with --optimizer)");
    }
    if (o.server_lr != 1.0 || o.server_momentum != 0.0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--outer=", o.outer,
                       " sets the outer step: leave --server_lr and --server_momentum out"));
    }
  }
  if (o.downstream != "model" && o.downstream != "delta") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown downstream '", o.downstream, "' (model, delta)"));
  }
  TERN_RETURN_IF_ERROR(codecs.Create(o.downstream_codec).status());
  TERN_RETURN_IF_ERROR(codecs.Create(o.task.update_codec()).status());
  TERN_RETURN_IF_ERROR(CheckClientMemory(o.task.memory()));
  TERN_RETURN_IF_ERROR(NormalizeMajorityVote(&o, codecs));
  const std::string& opt = o.task.gradient().optimizer();
  if (IsAdamOptimizer(opt)) {
    if (o.server_momentum != 0 || !o.task.memory().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer '", opt, "' keeps its own momentum: no server momentum or memory"));
    }
    if (!(o.beta2 >= 0 && o.beta2 < 1)) {
      return absl::InvalidArgumentError("Adam needs 0 <= beta1, beta2 < 1 and eps > 0");
    }
    if (IsOnebitOptimizer(opt)) {
      // The compressed phase: the clients' momenta up, the server's re-encoded mean down, each
      // with its error feedback.
      if (o.task.update_codec() == "none") o.task.set_update_codec("sign");
      o.downstream = "delta";
      o.downstream_codec = o.task.update_codec();
      TERN_RETURN_IF_ERROR(codecs.Create(o.downstream_codec).status());
    }
  }
  o.task.set_total_rounds(static_cast<uint64_t>(o.total_rounds));
  return o;
}

ServerRegistries NewBuiltinServerRegistries() {
  ServerRegistries r;
  r.codecs = NewBuiltinCodecRegistry();
  r.rules = NewBuiltinAggregationRuleRegistry();
  r.outer = NewBuiltinOuterOptimizerRegistry();
  return r;
}

absl::StatusOr<std::unique_ptr<Aggregator>> Aggregator::Build(AggregatorOptions options,
                                                              const ServerRegistries& registries) {
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<AggregationRule> rule,
                        registries.rules->Create(options.rule));
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<OuterOptimizer> outer,
                        MakeOuter(&options, *registries.outer));
  return std::unique_ptr<Aggregator>(new Aggregator(std::move(options), registries.codecs.get(),
                                                    std::move(rule), std::move(outer)));
}

absl::StatusOr<std::unique_ptr<Aggregator>> Aggregator::Create(AggregatorOptions options,
                                                               const ServerRegistries* registries,
                                                               absl::Time now) {
  TERN_ASSIGN_OR_RETURN(options,
                        NormalizeAggregatorOptions(std::move(options), *registries->codecs));
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<Aggregator> a, Build(std::move(options), *registries));
  if (a->store_ == nullptr) return a;
  absl::Status resumed = a->Resume(now);
  if (absl::IsDataLoss(resumed) && a->options_.fresh_start_if_damaged) {
    // Only on the operator's word: the damaged files are kept, moved aside.
    TERN_ASSIGN_OR_RETURN(std::string aside, a->store_->MoveAside());
    spdlog::warn("server: {}; moved it aside to {}* and starting a new run",
                 std::string(resumed.message()), aside);
    return Build(a->options_, *registries);
  }
  TERN_RETURN_IF_ERROR(resumed);
  return a;
}

absl::Status Aggregator::Resume(absl::Time now) {
  const std::string& path = store_->path();
  TERN_ASSIGN_OR_RETURN(std::optional<StateStore::Saved> saved, store_->Read());
  if (!saved.has_value()) return absl::OkStatus();  // a new run
  const internal::AggregatorCheckpoint& ckpt = saved->snapshot;
  const std::vector<internal::LoggedUpdate>& logged = saved->log.updates;
  std::shared_ptr<internal::AggregatorCheckpoint> fresh;
  uint64_t seq = 0;
  size_t open_round_updates = 0;
  int64_t round = 0;
  {
    absl::MutexLock lock(&mu_);
    absl::Status s = Restore(ckpt);
    // Clients have a fresh timeout from now; the open round's deadline restarts.
    clients_.HeardAll(now);
    rounds_->Restore(ckpt, logged, now);
    for (size_t i = 0; i < logged.size() && s.ok(); ++i) s = Replay(logged[i]);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("checkpoint ", path, ": ", s.message()));
    }
    counters_.set_restarts(counters_.restarts() + 1);
    // A new snapshot (with the replayed updates in it) and a fresh log from here on; its
    // generation is past every record the old log may still hold.
    state_seq_ = ckpt.generation();
    fresh = SnapshotState();
    seq = state_seq_;
    if (rounds_->open() && accumulator_ != nullptr) open_round_updates = accumulator_->count();
    round = rounds_->round();
  }
  if (!logged.empty()) {
    spdlog::info("server: replayed {} accepted updates from {}", logged.size(), store_->log_path());
  }
  // A snapshot written mid-round holds the updates accepted before it, so the log alone does not
  // say what the open round has back.
  if (open_round_updates > 0) {
    spdlog::info("server: resumed round {} with {} accepted updates (the snapshot's and the log's)",
                 round, open_round_updates);
  }
  return WriteCheckpoint(std::move(fresh), seq);
}

Aggregator::Aggregator(AggregatorOptions options, const CodecRegistry* codecs,
                       std::unique_ptr<AggregationRule> rule, std::unique_ptr<OuterOptimizer> outer)
    : options_(std::move(options)),
      codecs_(codecs),
      rule_(std::move(rule)),
      round_lr_(ValidRoundLrSchedule(options_)),
      downstream_(MakeDownstream(options_, codecs)),
      step_(MakeServerStep(options_, downstream_.get(), std::move(outer), round_lr_)),
      rounds_(MakeRounds(options_)),
      edge_(options_.edge_rounds > 0 ? std::make_unique<EdgeTier>(options_.edge_rounds) : nullptr),
      dp_(options_.dp.clip > 0 ? std::make_unique<DpFedAvg>(options_.dp) : nullptr),
      secure_(options_.secagg.enabled ? std::make_unique<SecureRounds>(options_.secagg) : nullptr),
      clients_(options_.client_timeout),
      norm_guard_(options_.norm_guard),
      // A client catches up only from a model the downstream still has every update since.
      history_(options_.keep_models, options_.keep_deltas + 1),
      store_(options_.checkpoint_path.empty()
                 ? nullptr
                 : std::make_unique<StateStore>(options_.checkpoint_path)) {
  counters_.set_mode(options_.mode);
  // An edge learns its from the parent's first task.
  counters_.set_total_rounds(edge_ != nullptr ? 0 : static_cast<uint64_t>(options_.total_rounds));
  if (dp_ != nullptr) {
    counters_.set_dp_delta(options_.dp.delta);
    counters_.set_dp_clip(options_.dp.clip);
    counters_.set_dp_noise(options_.dp.noise);
  }
}

absl::Status Aggregator::Restore(const internal::AggregatorCheckpoint& ckpt) {
  if (ckpt.format() != kCheckpointFormat && ckpt.format() != kOldCheckpointFormat) {
    return absl::DataLossError(
        absl::StrCat("format ", ckpt.format(), ", this server reads ", kCheckpointFormat));
  }
  if (ckpt.run_id() != options_.run_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("belongs to run '", ckpt.run_id(), "', not '", options_.run_id, "'"));
  }
  counters_ = ckpt.counters();
  counters_.set_mode(options_.mode);
  // An edge's is its parent's, as saved.
  if (edge_ == nullptr) counters_.set_total_rounds(static_cast<uint64_t>(options_.total_rounds));
  clients_.Restore(ckpt);
  if (ckpt.model().tensors_size() == 0) return absl::OkStatus();  // no model yet
  TERN_RETURN_IF_ERROR(AdoptModel(ckpt.model()));
  TERN_RETURN_IF_ERROR(accumulator_->Restore(ckpt.round_state()));
  round_eval_ = ckpt.round_eval();
  TERN_RETURN_IF_ERROR(step_->Restore(ckpt.optimizer(), static_cast<int64_t>(ckpt.round())));
  TERN_RETURN_IF_ERROR(downstream_->Restore(ckpt.downstream()));
  if (edge_ != nullptr) TERN_RETURN_IF_ERROR(edge_->Restore(ckpt.edge(), layout_, *codecs_));
  if (dp_ != nullptr) {
    TERN_RETURN_IF_ERROR(dp_->Restore(ckpt.dp()));
    dp_round_q_ = ckpt.dp().round_q();
    counters_.set_dp_clip(dp_->clip());
  }
  // The model adopted above is the global model after ckpt.round() rounds.
  history_.Clear();
  PublishModel(static_cast<int64_t>(ckpt.round()));
  return absl::OkStatus();
}

absl::Status Aggregator::AdoptModel(const v1::TensorBundle& bundle) {
  TERN_ASSIGN_OR_RETURN(std::vector<ParamTensor> layout,
                        LayoutFromBundle(bundle, options_.max_params));
  std::vector<float> x(LayoutNumel(layout));
  TERN_RETURN_IF_ERROR(BundleToFlat(bundle, layout, *codecs_, absl::MakeSpan(x)));
  if (!AllFinite(x)) return absl::InvalidArgumentError("the model holds Inf or NaN");
  layout_ = std::move(layout);
  model_ = std::move(x);
  accumulator_ = std::make_unique<RoundAccumulator>(rule_.get(), model_.size());
  step_->Reset(layout_);
  downstream_->Reset(layout_);
  have_model_ = true;
  return absl::OkStatus();
}

void Aggregator::PublishModel(int64_t round) {
  auto dense = FlatToBundle(layout_, model_);
  auto b = std::make_shared<v1::TensorBundle>(*std::move(dense));
  b->set_run_id(options_.run_id);
  b->set_round(static_cast<uint64_t>(round));
  b->set_sender("server");
  history_.Publish({round, std::move(b), counters_}, Crc32(model_.data(), 4 * model_.size()));
  ++events_;
}

v1::JoinReply Aggregator::Join(const v1::JoinRequest& request, absl::Time now, absl::Status* status,
                               const std::string& principal) {
  v1::JoinReply reply;
  absl::MutexLock lock(&mu_);
  *status = absl::OkStatus();
  if (request.run_id() != options_.run_id) {
    *status = absl::FailedPreconditionError(
        absl::StrCat("this server runs '", options_.run_id, "', not '", request.run_id(), "'"));
    return reply;
  }
  absl::StatusOr<uint32_t> id = clients_.Join(
      request.client_id(), principal, request.name().substr(0, 128), request.num_samples(), now);
  if (!id.ok()) {
    *status = id.status();
    return reply;
  }
  reply.set_client_id(*id);
  reply.set_model_needed(!have_model_);
  reply.set_mode(options_.mode);
  counters_.set_clients_joined(static_cast<uint32_t>(clients_.size()));
  return reply;
}

absl::Status Aggregator::CheckCaller(uint32_t client, const std::string& principal) const {
  absl::MutexLock lock(&mu_);
  return clients_.CheckCaller(client, principal);
}

absl::StatusOr<bool> Aggregator::InitModel(uint32_t client, const v1::TensorBundle& bundle) {
  std::shared_ptr<internal::AggregatorCheckpoint> ckpt;
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!clients_.Has(client)) {
      return absl::NotFoundError(absl::StrCat("client ", client, " has not joined"));
    }
    if (have_model_) {
      TERN_ASSIGN_OR_RETURN(std::vector<ParamTensor> layout,
                            LayoutFromBundle(bundle, options_.max_params));
      if (!SameLayout(layout, layout_)) {
        return absl::FailedPreconditionError("this model's layout differs from the run's");
      }
      return false;
    }
    TERN_RETURN_IF_ERROR(AdoptModel(bundle));
    PublishModel(static_cast<int64_t>(counters_.round()));
    ckpt = SnapshotState();
    seq = state_seq_;
  }
  TERN_RETURN_IF_ERROR(WriteCheckpoint(std::move(ckpt), seq));
  return true;
}

absl::StatusOr<FetchResult> Aggregator::Fetch(uint32_t client, absl::Time now, int64_t have_round,
                                              uint32_t have_crc32, bool have_state) {
  absl::MutexLock lock(&mu_);
  TERN_RETURN_IF_ERROR(clients_.Heard(client, now));
  FetchResult r;
  r.task = options_.task;
  r.task.set_round(rounds_->round());
  if (edge_ != nullptr) r.task.set_total_rounds(counters_.total_rounds());
  step_->AdjustTask(rounds_->round(), &r.task);
  // The round's local rate: the schedule's (constant: the task's own), or an edge's parent's.
  if (r.task.has_local()) {
    r.task.mutable_local()->set_lr(static_cast<float>(RoundLr(rounds_->round())));
  }
  if (counters_.done()) {
    r.task.set_kind(v1::Task::DONE);
    return r;
  }
  if (history_.empty()) {
    r.task.set_kind(v1::Task::WAIT);
    return r;
  }
  if (secure_ != nullptr && !secure_->Admits(client)) {
    // A secure round takes its clients in at its key stage only: a client fetching later
    // (left out of a stage, or back from a restart) waits for the next round.
    r.task.set_kind(v1::Task::WAIT);
    return r;
  }
  const Rounds::Turn turn = rounds_->Take(static_cast<int>(client), now);
  if (turn.offered) ++events_;  // the waiter a slot was kept for may be parked
  if (!turn.train) {
    r.task.set_kind(v1::Task::WAIT);
    return r;
  }
  const int64_t from = CatchUpFrom(have_round, have_crc32, have_state);
  TERN_ASSIGN_OR_RETURN(ChunkedPayload c, DownstreamChunks(from));
  r.task.set_kind(v1::Task::TRAIN);
  r.task.set_evaluate(Evaluates(rounds_->round()));
  r.task.set_round_clients(rounds_->round_clients());
  r.task.set_attempt(turn.attempt);
  if (secure_ != nullptr && secure_->active() && secure_->round() == rounds_->round()) {
    *r.task.mutable_secagg() = secure_->params();
  }
  if (dp_ != nullptr) r.task.set_dp_clip(static_cast<float>(dp_->clip()));
  r.task.set_payload(from >= 0 ? v1::Task::DELTAS : v1::Task::MODEL);
  r.task.set_delta_from(from);
  // The CRC lets a client check its copy; a lossy model encoding leaves nothing to check.
  r.task.set_model_crc32(
      downstream_->exact() ? history_.Crc(static_cast<int64_t>(counters_.round())).value_or(0) : 0);
  r.chunks = c.chunks;
  counters_.set_payload_bytes_down(counters_.payload_bytes_down() + c.payload_bytes);
  counters_.set_wire_bytes_down(counters_.wire_bytes_down() + c.wire_bytes);
  counters_.set_dense_bytes_down(counters_.dense_bytes_down() + 4 * model_.size());
  return r;
}

int64_t Aggregator::CatchUpFrom(int64_t have_round, uint32_t have_crc32, bool have_state) const {
  // Only from a model we published, and (1-bit) with the optimizer state that goes with it:
  // the compressed phase's updates are momenta, useless without it.
  if (history_.Crc(have_round) != have_crc32) return -1;
  if (step_->UpdatesNeedState(rounds_->round()) && !have_state) return -1;
  return downstream_->CatchUpFrom(have_round, static_cast<int64_t>(counters_.round()));
}

absl::StatusOr<ChunkedPayload> Aggregator::DownstreamChunks(int64_t from) {
  if (const ChunkedPayload* hit = history_.Chunks(from); hit != nullptr) return *hit;
  const uint64_t round = static_cast<uint64_t>(rounds_->round());
  TERN_ASSIGN_OR_RETURN(v1::TensorBundle b,
                        downstream_->Payload(from, model_, *history_.newest().bundle,
                                             options_.task.seed() ^ (round << 20)));
  if (from < 0) TERN_RETURN_IF_ERROR(step_->AppendState(rounds_->round(), &b));
  b.set_run_id(options_.run_id);
  b.set_sender("server");
  b.set_round(round);
  ChunkedPayload c;
  c.payload_bytes = PayloadBytes(b);
  TERN_ASSIGN_OR_RETURN(std::vector<v1::BundleChunk> chunks, ChunkBundle(b, round));
  for (const v1::BundleChunk& ch : chunks) c.wire_bytes += ch.ByteSizeLong() + 5;
  c.chunks = std::make_shared<const std::vector<v1::BundleChunk>>(std::move(chunks));
  history_.KeepChunks(from, c);
  return c;
}

absl::StatusOr<v1::UpdateReply> Aggregator::Push(const v1::UpdateInfo& info,
                                                 const v1::TensorBundle& update,
                                                 uint64_t wire_bytes, absl::Time now) {
  const std::vector<ParamTensor>* layout = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = Admit(info, update, now); !s.ok()) return Refuse(s);
    if (secure_ != nullptr) return PushMasked(info, update, wire_bytes, now);
    layout = &layout_;  // fixed once there is a model
  }
  // Decoded and checked outside the lock, into this call's own buffer; a malformed update does
  // not take the client's reply slot (it spends its turn: RefuseContent). One pass: the norm of
  // finite floats is finite (summed in double), so a non-finite norm means an Inf or a NaN.
  std::vector<float> values(LayoutNumel(*layout));
  absl::Status s = BundleToFlat(update, *layout, *codecs_, absl::MakeSpan(values));
  const double norm = s.ok() ? L2Norm(values) : 0;
  if (s.ok() && !std::isfinite(norm)) s = absl::InvalidArgumentError("the update holds Inf or NaN");
  internal::LoggedUpdate record;
  record.set_scale(1.0);
  absl::StatusOr<v1::UpdateReply> reply;
  RoundAccumulator* accumulator = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!s.ok()) return RefuseContent(info, s);
    reply = Decide(info, update, wire_bytes, norm, now, &record);
    if (!reply.ok() || reply->verdict() == v1::UpdateReply::DROPPED) return reply;
    NoteExactTensors(update);
    accumulator = accumulator_.get();  // made once with the model; thread-safe
  }
  // The place reserved under the lock keeps the round from closing (and a snapshot from being
  // taken) without this update. It is logged first, so that one the log could not take leaves
  // no trace in the round: the client hears why and may send it again.
  if (store_ != nullptr) {
    *record.mutable_update() = update;
    if (absl::Status logged = store_->Append(record); !logged.ok()) {
      accumulator->CancelReserved();
      return Unlogged(info, record, logged);
    }
  }
  Scale(record.scale(), absl::MakeSpan(values));
  TERN_RETURN_IF_ERROR(accumulator->AddReserved(info.client_id(), values, record.weight(),
                                                info.loss(), info.batch()));
  return reply;
}

absl::StatusOr<v1::UpdateReply> Aggregator::PushMasked(const v1::UpdateInfo& info,
                                                       const v1::TensorBundle& update,
                                                       uint64_t wire_bytes, absl::Time now) {
  const uint32_t client = info.client_id();
  const int64_t round = static_cast<int64_t>(info.round());
  if (update.tensors_size() != 1 || update.tensors(0).name() != "secagg" ||
      update.tensors(0).tensor().codec() != "secagg" ||
      update.tensors(0).tensor().numel() != model_.size()) {
    return Refuse(absl::InvalidArgumentError(absl::StrCat(
        "this run aggregates securely (--secagg): an update is one tensor 'secagg' of codec "
        "'secagg' with ",
        model_.size(), " values, masked as Task.secagg says")));
  }
  if (absl::Status s = secure_->TakesMasked(client, round); !s.ok()) return Refuse(s);
  absl::StatusOr<ReplyDecision> d = rounds_->Reply(static_cast<int>(client), round, now);
  if (!d.ok()) return Refuse(d.status());
  if (d->verdict != ReplyVerdict::kAccepted) {
    rounds_->Unreply(static_cast<int>(client), round);
    return Refuse(absl::FailedPreconditionError("a masked update is taken in its round only"));
  }
  // Added to the round's masked sum at once (under the lock: a pass over b-bit integers); not
  // logged, since a restarted server cannot unmask a round whose keys and shares it lost.
  if (absl::Status s = secure_->AddMasked(client, round, update.tensors(0).tensor().payload());
      !s.ok()) {
    // Not a spent turn: nothing in a masked vector can probe a guard, so a client whose
    // vector was damaged may send it again while the stage is open.
    rounds_->Unreply(static_cast<int>(client), round);
    return Refuse(s);
  }
  CountBytesUp(PayloadBytes(update), wire_bytes);
  CountAccepted(false, 0);
  secure_loss_sum_ += info.loss();
  secure_batch_sum_ += info.batch();
  v1::UpdateReply reply;
  reply.set_server_round(static_cast<uint64_t>(rounds_->round()));
  reply.set_verdict(v1::UpdateReply::ACCEPTED);
  return reply;
}

absl::StatusOr<v1::SecAggReply> Aggregator::SecAgg(const v1::SecAggRequest& request,
                                                   absl::Time now) {
  absl::MutexLock lock(&mu_);
  TERN_RETURN_IF_ERROR(clients_.Heard(request.client_id(), now));
  if (secure_ == nullptr) {
    return absl::FailedPreconditionError("this server runs no secure aggregation (--secagg)");
  }
  absl::StatusOr<v1::SecAggReply> r = secure_->Handle(request);
  counters_.set_secagg_bytes(counters_.secagg_bytes() + request.ByteSizeLong() +
                             (r.ok() ? r->ByteSizeLong() : 0));
  if (!r.ok()) {
    spdlog::warn("server: refused a secure-aggregation message of client {} for round {}: {}",
                 request.client_id(), request.round(), r.status().ToString());
  }
  return r;
}

absl::StatusOr<bool> Aggregator::TickSecure(absl::Time now) {
  if (!rounds_->open()) return false;
  if (!secure_->active() || secure_->round() != rounds_->round()) {
    // Its keys and shares are gone (the server restarted mid-round, or the round was too small
    // to mask in): the round closes without an update and the next one starts afresh.
    spdlog::warn("server: round {} has no secure aggregation state; it closes without an update",
                 rounds_->round());
    counters_.set_secagg_failed_rounds(counters_.secagg_failed_rounds() + 1);
    TERN_RETURN_IF_ERROR(CloseRound(now));
    return true;
  }
  const SecAggServerRound::Stage before = secure_->stage();
  std::optional<absl::StatusOr<SecAggServerRound::Result>> end =
      secure_->Advance(now, rounds_->ShouldClose(now));
  if (secure_->stage() != before) ++events_;  // the calls waiting on the stage's answer wake
  if (!end.has_value()) return false;
  if (!end->ok()) {
    spdlog::warn(
        "server: round {}'s secure aggregation failed: {}; the round closes without an "
        "update",
        rounds_->round(), end->status().ToString());
    counters_.set_secagg_failed_rounds(counters_.secagg_failed_rounds() + 1);
    TERN_RETURN_IF_ERROR(CloseRound(now));
    return true;
  }
  const SecAggServerRound::Result& result = **end;
  counters_.set_secagg_dropped(counters_.secagg_dropped() + result.dropped.size());
  spdlog::info(
      "server: round {}: unmasked the sum of {} clients' masked updates ({} dropped "
      "after masking)",
      rounds_->round(), result.clients.size(), result.dropped.size());
  TERN_RETURN_IF_ERROR(CloseRound(now, &result));
  return true;
}

absl::Status Aggregator::Unlogged(const v1::UpdateInfo& info, const internal::LoggedUpdate& record,
                                  const absl::Status& why) {
  std::shared_ptr<internal::AggregatorCheckpoint> ckpt;
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    rounds_->Unreply(static_cast<int>(info.client_id()), static_cast<int64_t>(info.round()));
    // What Decide counted of it, taken back.
    CountAccepted(record.stale(), static_cast<int64_t>(record.staleness()), -1);
    if (!record.stale() && record.has_eval()) AddEval(record.eval(), -1);
    if (dp_ != nullptr && !record.stale()) dp_->CountWithin(record.update().dp_within_clip(), -1);
    (void)Refuse(why);
    // A log that failed a write takes no more appends: a snapshot (holding every update that was
    // logged) starts a fresh one, once per generation, so that a retry is logged when there is
    // room again.
    if (state_seq_ == record.generation()) {
      ckpt = SnapshotState();
      seq = state_seq_;
    }
  }
  if (absl::Status s = WriteCheckpoint(std::move(ckpt), seq); !s.ok()) {
    spdlog::warn("server: a snapshot after a failed log append failed too: {}",
                 std::string(s.message()));
  }
  return absl::UnavailableError(
      absl::StrCat("the update could not be logged, so it was not "
                   "counted; send it again (",
                   why.message(), ")"));
}

absl::Status Aggregator::Admit(const v1::UpdateInfo& info, const v1::TensorBundle& update,
                               absl::Time now) {
  TERN_RETURN_IF_ERROR(clients_.Heard(info.client_id(), now));
  if (!have_model_) return absl::FailedPreconditionError("no model yet");
  if (update.run_id() != options_.run_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("update for run '", update.run_id(), "', this is '", options_.run_id, "'"));
  }
  if (update.round() != info.round()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the bundle says round ", update.round(), ", the header ", info.round()));
  }
  const double weight = info.weight();
  if (!(weight > 0) || !std::isfinite(weight) || weight > 1e12) {
    return absl::InvalidArgumentError(absl::StrCat("weight ", weight, " is not in (0, 1e12]"));
  }
  if (info.has_eval()) return CheckEvaluation(info.eval());
  return absl::OkStatus();
}

bool Aggregator::Evaluates(int64_t round) const {
  const int every = options_.eval_every;
  return every > 0 && (round % every == 0 || round == options_.total_rounds);
}

void Aggregator::AddEval(const v1::Evaluation& e, int times) {
  const double examples = times * e.examples();
  round_eval_.set_examples(round_eval_.examples() + examples);
  round_eval_.set_loss_sum(round_eval_.loss_sum() + examples * e.loss());
  round_eval_.set_accuracy_sum(round_eval_.accuracy_sum() + examples * e.accuracy());
  round_eval_.set_clients(round_eval_.clients() + times);
}

absl::StatusOr<v1::UpdateReply> Aggregator::Decide(const v1::UpdateInfo& info,
                                                   const v1::TensorBundle& update,
                                                   uint64_t wire_bytes, double norm, absl::Time now,
                                                   internal::LoggedUpdate* record) {
  if (dp_ != nullptr && !dp_->WithinClip(norm)) {
    return RefuseContent(info,
                         absl::FailedPreconditionError(absl::StrCat(
                             "the update's L2 norm ", norm, " is over the clip norm ", dp_->clip(),
                             " (DP-FedAvg: clients clip to Task.dp_clip before they send)")));
  }
  if (dp_ != nullptr && dp_->adaptive() && !update.has_dp_within_clip()) {
    return RefuseContent(info,
                         absl::FailedPreconditionError(
                             "the update does not say whether its norm was within the clip "
                             "(TensorBundle.dp_within_clip), which adaptive clipping counts"));
  }
  if (absl::Status g = norm_guard_.Check(norm, "the update"); !g.ok()) {
    return RefuseContent(info, g);
  }
  absl::StatusOr<ReplyDecision> d =
      rounds_->Reply(static_cast<int>(info.client_id()), static_cast<int64_t>(info.round()), now);
  if (!d.ok()) return Refuse(d.status());
  v1::UpdateReply reply;
  reply.set_server_round(static_cast<uint64_t>(rounds_->round()));
  const uint64_t payload_bytes = PayloadBytes(update);
  CountBytesUp(payload_bytes, wire_bytes);
  if (d->frees_slot) ++events_;  // a waiting client may take the slot
  if (d->verdict == ReplyVerdict::kDropped) {
    counters_.set_updates_dropped(counters_.updates_dropped() + 1);
    reply.set_verdict(v1::UpdateReply::DROPPED);
    return reply;
  }
  const bool stale = d->verdict == ReplyVerdict::kAcceptedStale;
  // The clip adapts on the open round's count: a stale update was clipped to an older one.
  if (dp_ != nullptr && !stale) dp_->CountWithin(update.dp_within_clip());
  accumulator_->Reserve();
  norm_guard_.Observe(norm);
  CountAccepted(stale, d->staleness);
  reply.set_verdict(stale ? v1::UpdateReply::ACCEPTED_STALE : v1::UpdateReply::ACCEPTED);
  record->set_generation(state_seq_);
  record->set_client(info.client_id());
  record->set_round(info.round());
  // DP-FedAvg weighs every client alike: the noise is sized for one client's clipped update.
  record->set_weight(dp_ != nullptr ? 1.0 : info.weight() * d->weight_scale);
  record->set_loss(info.loss());
  record->set_batch(info.batch());
  record->set_stale(stale);
  record->set_norm(norm);
  record->set_scale(d->value_scale);
  record->set_staleness(static_cast<uint64_t>(d->staleness));
  record->set_payload_bytes(payload_bytes);
  record->set_wire_bytes(wire_bytes);
  if (!stale && info.has_eval()) {
    AddEval(info.eval());
    *record->mutable_eval() = info.eval();
  }
  return reply;
}

absl::Status Aggregator::Replay(const internal::LoggedUpdate& u) {
  if (!have_model_) return absl::DataLossError("the update log has updates but there is no model");
  std::vector<float> values(model_.size());
  if (absl::Status s = BundleToFlat(u.update(), layout_, *codecs_, absl::MakeSpan(values));
      !s.ok()) {
    return absl::DataLossError(absl::StrCat("a logged update does not decode: ", s.message()));
  }
  Scale(u.scale() == 0 ? 1.0 : u.scale(), absl::MakeSpan(values));
  TERN_RETURN_IF_ERROR(accumulator_->Add(u.client(), values, u.weight(), u.loss(), u.batch()));
  NoteExactTensors(u.update());
  norm_guard_.Observe(u.norm());
  CountBytesUp(u.payload_bytes(), u.wire_bytes());
  CountAccepted(u.stale(), static_cast<int64_t>(u.staleness()));
  if (!u.stale() && u.has_eval()) AddEval(u.eval());
  if (dp_ != nullptr && !u.stale()) dp_->CountWithin(u.update().dp_within_clip());
  return absl::OkStatus();
}

// A tensor a client sends exactly (codec none) beside others it compresses, in a run whose update
// codec is lossy, is state training sets rather than descends (BatchNorm's running statistics:
// tern.federated's exact_tensors): the delta downstream then sends its change exactly too. A
// client that sends everything as none (one without the codecs) marks nothing. Marks last the
// run; after a restart the open round's replayed and new updates mark again before it closes.
void Aggregator::NoteExactTensors(const v1::TensorBundle& update) {
  const std::string& codec = options_.task.update_codec();
  if (codec.empty() || codec.substr(0, codec.find(':')) == format::kNone.spec) return;
  const auto exact = [](const v1::NamedTensor& t) {
    return t.tensor().codec() == format::kNone.name;
  };
  if (std::all_of(update.tensors().begin(), update.tensors().end(), exact)) return;
  for (int i = 0; i < update.tensors_size(); ++i) {
    if (exact(update.tensors(i))) downstream_->MarkExact(static_cast<size_t>(i));
  }
}

void Aggregator::CountBytesUp(uint64_t payload_bytes, uint64_t wire_bytes) {
  counters_.set_payload_bytes_up(counters_.payload_bytes_up() + payload_bytes);
  counters_.set_wire_bytes_up(counters_.wire_bytes_up() + wire_bytes);
  counters_.set_dense_bytes_up(counters_.dense_bytes_up() + 4 * model_.size());
}

void Aggregator::CountAccepted(bool stale, int64_t staleness, int times) {
  // Unsigned counters: adding -1 wraps to one less.
  const uint64_t n = static_cast<uint64_t>(static_cast<int64_t>(times));
  const int bucket = static_cast<int>(std::clamp<int64_t>(staleness, 0, kStalenessBuckets - 1));
  while (counters_.staleness_size() <= bucket) counters_.add_staleness(0);
  counters_.set_staleness(bucket, counters_.staleness(bucket) + n);
  if (stale) {
    counters_.set_updates_stale(counters_.updates_stale() + n);
  } else {
    counters_.set_updates_accepted(counters_.updates_accepted() + n);
  }
}

absl::Status Aggregator::RefuseContent(const v1::UpdateInfo& info, absl::Status s) {
  rounds_->Spend(static_cast<int>(info.client_id()), static_cast<int64_t>(info.round()));
  return Refuse(std::move(s));
}

absl::Status Aggregator::Refuse(absl::Status s) {
  counters_.set_updates_refused(counters_.updates_refused() + 1);
  ++refusals_[absl::StatusCodeToString(s.code())];
  return s;
}

std::map<std::string, uint64_t> Aggregator::RefusalsByReason() const {
  absl::MutexLock lock(&mu_);
  return refusals_;
}

absl::Time Aggregator::LastCheckpoint() const {
  return store_ == nullptr ? absl::InfinitePast() : store_->LastWrite();
}

absl::Status Aggregator::Leave(uint32_t client) {
  absl::MutexLock lock(&mu_);
  return clients_.Leave(client);
}

double Aggregator::RoundLr(int64_t round) const {
  if (edge_ != nullptr && edge_->parent_lr() > 0) return edge_->parent_lr();
  return round_lr_.At(std::max<int64_t>(0, round - 1));
}

absl::Status Aggregator::CloseRound(absl::Time now, const SecAggServerRound::Result* secure) {
  rounds_->Close();
  const int64_t round = static_cast<int64_t>(counters_.round()) + 1;
  counters_.set_round_closed_unix_s(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
  counters_.set_lr(RoundLr(round));
  if (secure_ != nullptr) {
    // The losses and minibatches the masked updates reported (in the clear, as every client's).
    const double n = secure != nullptr ? static_cast<double>(secure->clients.size()) : 0;
    counters_.set_mean_batch(n > 0 ? secure_batch_sum_ / n : 0);
    counters_.set_last_round_updates(static_cast<uint32_t>(n));
    counters_.set_train_loss(n > 0 ? secure_loss_sum_ / n : 0);
    secure_loss_sum_ = secure_batch_sum_ = 0;
    secure_->Abandon();  // a round closed before its masking ended leaves no state behind
  } else {
    counters_.set_mean_batch(accumulator_->mean_batch());
    counters_.set_last_round_updates(static_cast<uint32_t>(accumulator_->count()));
    counters_.set_train_loss(accumulator_->mean_loss());
  }
  if (round_eval_.examples() > 0) {
    counters_.set_eval_round(static_cast<uint64_t>(round));
    counters_.set_eval_examples(round_eval_.examples());
    counters_.set_eval_loss(round_eval_.loss_sum() / round_eval_.examples());
    counters_.set_eval_accuracy(round_eval_.accuracy_sum() / round_eval_.examples());
    counters_.set_eval_clients(round_eval_.clients());
  }
  round_eval_.Clear();
  std::vector<float> mean(model_.size(), 0.0f);
  bool have_update = false;
  if (secure != nullptr) {
    mean = secure->mean;
    have_update = !secure->clients.empty();
  } else {
    TERN_ASSIGN_OR_RETURN(have_update, accumulator_->Aggregate(absl::MakeSpan(mean)));
  }
  if (dp_ != nullptr && secure_ != nullptr && have_update) {
    // Distributed noise: each survivor added N(0, z^2 S^2 / K); the survivors' mean becomes
    // their sum over the sampled clients, as the central release's.
    const double n = static_cast<double>(secure->clients.size());
    const double keep = n / static_cast<double>(std::max<size_t>(1, rounds_->round_clients()));
    for (float& v : mean) v = static_cast<float>(v * keep);
    const double z =
        options_.dp.noise * std::sqrt(n / std::max(1, options_.policy.clients_per_round));
    dp_->Spend(dp_round_q_, z);
    counters_.set_dp_epsilon(dp_->Epsilon());
    spdlog::info(
        "server: round {}: DP epsilon {:.3f} at delta {:g} (q = {:.4f}, z = {:.3g}: the noise "
        "of {} clients)",
        round, counters_.dp_epsilon(), options_.dp.delta, dp_round_q_, z, n);
  } else if (dp_ != nullptr && secure_ == nullptr) {
    // Released whoever replied: the noise hides them, and the round's sample was drawn.
    TERN_RETURN_IF_ERROR(dp_->Release(absl::MakeSpan(mean), have_update ? accumulator_->count() : 0,
                                      rounds_->round_clients()));
    have_update = true;
    dp_->Spend(dp_round_q_, options_.dp.noise);
    counters_.set_dp_epsilon(dp_->Epsilon());
    spdlog::info("server: round {}: DP epsilon {:.3f} at delta {:g} (q = {:.4f}, z = {:g})", round,
                 counters_.dp_epsilon(), options_.dp.delta, dp_round_q_, options_.dp.noise);
    if (dp_->adaptive()) {
      double within = 0;
      const double was = dp_->clip();
      TERN_RETURN_IF_ERROR(dp_->AdaptClip(rounds_->round_clients(), &within));
      counters_.set_dp_clip(dp_->clip());
      spdlog::info(
          "server: round {}: {:.3f} of the clients within clip {:.4g} (noised); the next "
          "round's clip is {:.4g}",
          round, within, was, dp_->clip());
    }
  }
  if (edge_ != nullptr) {
    edge_->Closed(round, accumulator_->total_weight(), accumulator_->mean_loss(),
                  accumulator_->mean_batch());
  }
  accumulator_->Reset();
  counters_.set_round(static_cast<uint64_t>(round));
  // An edge's run ends when its parent's does (Finish).
  if (edge_ == nullptr && round >= options_.total_rounds) counters_.set_done(true);
  TERN_RETURN_IF_ERROR(
      step_->Close(have_update ? &mean : nullptr, round, &model_, downstream_.get()));
  PublishModel(round);
  return absl::OkStatus();
}

absl::Status Aggregator::Tick(absl::Time now) {
  std::shared_ptr<internal::AggregatorCheckpoint> ckpt;
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!have_model_ || counters_.done()) return absl::OkStatus();
    bool changed = false;
    if (secure_ != nullptr) {
      TERN_ASSIGN_OR_RETURN(changed, TickSecure(now));
    } else if (rounds_->ShouldClose(now)) {
      TERN_RETURN_IF_ERROR(CloseRound(now));
      changed = true;
    }
    // Only between rounds: the set of available clients is O(N) to build, and Tick runs after
    // every push. A secure round needs three clients at least.
    const int needed = counters_.round() == 0 ? options_.min_clients : (secure_ != nullptr ? 3 : 1);
    const bool may_open =
        edge_ == nullptr || edge_->MayOpen(static_cast<int64_t>(counters_.round()));
    if (!rounds_->open() && !counters_.done() && may_open &&
        clients_.CountAvailable(now) >= needed) {
      // Once a round, as it opens: those gone are not available, so the count above stands.
      clients_.Forget(now, std::max(options_.forget_clients_after, options_.client_timeout), {});
      counters_.set_clients_joined(static_cast<uint32_t>(clients_.size()));
      std::set<int> available = clients_.Available(now);
      counters_.set_clients_alive(static_cast<uint32_t>(available.size()));
      const size_t population = available.size();
      rounds_->SetAvailable(std::move(available));
      // The round's sampling rate, the same for the budget's check and for what it spends.
      const double q = static_cast<double>(rounds_->NextRoundClients(population)) /
                       static_cast<double>(std::max<size_t>(1, population));
      if (dp_ != nullptr && StopForBudget(q)) {
        changed = true;
      } else if (absl::StatusOr<std::vector<int>> sampled = rounds_->Open(now); sampled.ok()) {
        if (secure_ != nullptr) {
          std::string why;
          secure_->Open(rounds_->round(), *sampled, model_.size(), options_.policy.seed, now, &why);
          if (!why.empty()) {
            spdlog::warn("server: round {} cannot aggregate securely: {}", rounds_->round(), why);
          }
        }
        if (dp_ != nullptr) dp_round_q_ = q;
        NoteDeadline();
        history_.ForgetChunks();
        ++events_;
        changed = true;
      }
    }
    counters_.set_round_open(rounds_->open());
    if (!changed) return absl::OkStatus();
    ckpt = SnapshotState();
    seq = state_seq_;
  }
  return WriteCheckpoint(std::move(ckpt), seq);
}

std::shared_ptr<internal::AggregatorCheckpoint> Aggregator::SnapshotState() {
  ++state_seq_;
  if (store_ == nullptr) return nullptr;
  auto c = std::make_shared<internal::AggregatorCheckpoint>();
  c->set_format(kCheckpointFormat);
  c->set_generation(state_seq_);
  c->set_run_id(options_.run_id);
  c->set_round(counters_.round());
  rounds_->Save(c.get());
  if (have_model_) {
    *c->mutable_model() = *history_.newest().bundle;
    accumulator_->Save(c->mutable_round_state());
    *c->mutable_round_eval() = round_eval_;
    step_->Save(c->mutable_optimizer());
    downstream_->Save(c->mutable_downstream());
    // Only a layout the base has fails here, and the base was made in it.
    if (edge_ != nullptr) edge_->Save(layout_, c->mutable_edge()).IgnoreError();
    if (dp_ != nullptr) {
      dp_->Save(c->mutable_dp());
      c->mutable_dp()->set_round_q(dp_round_q_);
    }
  }
  clients_.Save(c.get());
  *c->mutable_counters() = counters_;
  return c;
}

absl::Status Aggregator::WriteCheckpoint(std::shared_ptr<internal::AggregatorCheckpoint> ckpt,
                                         uint64_t seq) {
  if (ckpt == nullptr) return absl::OkStatus();
  return store_->Write(*ckpt, seq);
}

absl::StatusOr<Aggregator::KeptModel> Aggregator::Model(int64_t round) const {
  absl::MutexLock lock(&mu_);
  return history_.Find(round);
}

bool Aggregator::StopForBudget(double q) {
  double then = 0;
  if (!dp_->WouldExceedBudget(q, &then)) return false;
  counters_.set_done(true);
  counters_.set_stop_reason(absl::StrFormat(
      "privacy budget: round %d would take epsilon from %.3f to %.3f, past --dp_epsilon_budget=%g",
      counters_.round() + 1, dp_->Epsilon(), then, options_.dp.epsilon_budget));
  spdlog::warn("server: {}; the run ends after round {}", counters_.stop_reason(),
               counters_.round());
  ++events_;  // waiting fetches hear DONE
  return true;
}

void Aggregator::NoteDeadline() {
  const double d = absl::ToDoubleSeconds(rounds_->deadline());
  counters_.set_round_deadline_s(d);
  // Logged when it moves a tenth or more, not every round.
  if (!rounds_->deadline_learned() ||
      std::fabs(d - logged_deadline_s_) < 0.1 * logged_deadline_s_) {
    return;
  }
  logged_deadline_s_ = d;
  const DeadlineLearner::Fit f = rounds_->deadline_fit();
  spdlog::info(
      "server: round {}'s deadline {:.3f} s: the median arrival {:.3f} s + {} x the spread "
      "{:.3f} s of the last {} (within [{}, {}] s)",
      rounds_->round(), d, absl::ToDoubleSeconds(f.median), options_.policy.deadline_k,
      absl::ToDoubleSeconds(f.spread), f.samples,
      absl::ToDoubleSeconds(options_.policy.deadline_floor),
      absl::ToDoubleSeconds(options_.policy.deadline));
}

v1::ServerStatus Aggregator::Status(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  v1::ServerStatus s = counters_;
  s.set_clients_alive(static_cast<uint32_t>(clients_.CountAvailable(now)));
  s.set_round_open(rounds_->open());
  return s;
}

v1::ServerStatus Aggregator::Counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

std::optional<std::vector<int>> Aggregator::ClientsToWake() const {
  absl::MutexLock lock(&mu_);
  return rounds_->ToWake();
}

uint64_t Aggregator::events() const {
  absl::MutexLock lock(&mu_);
  return events_;
}

bool Aggregator::done() const {
  absl::MutexLock lock(&mu_);
  return counters_.done();
}

uint64_t Aggregator::MaxUpdateBytes() const {
  absl::MutexLock lock(&mu_);
  return 8 * static_cast<uint64_t>(model_.size()) + (uint64_t{1} << 20);
}

std::vector<ParamTensor> Aggregator::layout() const {
  absl::MutexLock lock(&mu_);
  return layout_;
}

std::vector<float> Aggregator::model() const {
  absl::MutexLock lock(&mu_);
  return model_;
}

absl::Status Aggregator::Rebase(int64_t parent_round, int64_t parent_client,
                                uint64_t parent_total_rounds, absl::Span<const float> global,
                                float parent_lr) {
  std::shared_ptr<internal::AggregatorCheckpoint> ckpt;
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    if (edge_ == nullptr) return absl::FailedPreconditionError("not an edge aggregator");
    if (!(parent_lr >= 0) || !std::isfinite(parent_lr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the parent's task has local rate ", parent_lr));
    }
    if (!have_model_ || global.size() != model_.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the parent's model has ", global.size(), " parameters; this edge's ", model_.size()));
    }
    if (!AllFinite(global))
      return absl::InvalidArgumentError("the parent's model holds Inf or NaN");
    if (rounds_->open()) {
      // Trained from an older parent model: of no use to the parent's task now.
      rounds_->Close();
      counters_.set_updates_dropped(counters_.updates_dropped() + accumulator_->count());
      spdlog::warn("server: edge round {} closed unused: the parent moved on to round {}",
                   rounds_->round(), parent_round);
      accumulator_->Reset();
      round_eval_.Clear();
      counters_.set_round(static_cast<uint64_t>(rounds_->round()));
    }
    const int64_t round = static_cast<int64_t>(counters_.round());
    model_.assign(global.begin(), global.end());
    edge_->Rebase(parent_round, parent_client, parent_total_rounds, model_, round, parent_lr);
    counters_.set_parent_round(static_cast<uint64_t>(parent_round));
    counters_.set_total_rounds(parent_total_rounds * static_cast<uint64_t>(options_.edge_rounds));
    // The clients' copies are of another model now: every one gets this model whole.
    history_.Clear();
    PublishModel(round);
    ckpt = SnapshotState();
    seq = state_seq_;
  }
  return WriteCheckpoint(std::move(ckpt), seq);
}

Aggregator::EdgeProgress Aggregator::Edge(bool with_update) const {
  absl::MutexLock lock(&mu_);
  EdgeProgress p;
  if (edge_ == nullptr || !edge_->active()) return p;
  const int64_t round = static_cast<int64_t>(counters_.round());
  p.active = true;
  p.parent_round = edge_->parent_round();
  p.parent_client = edge_->parent_client();
  p.base_crc = edge_->base_crc();
  p.ready = edge_->Ready(round);
  if (!p.ready || !with_update) return p;
  const std::vector<float>& base = edge_->base();
  p.update.resize(model_.size());
  for (size_t i = 0; i < model_.size(); ++i) p.update[i] = model_[i] - base[i];
  p.weight = edge_->weight();
  p.loss = edge_->mean_loss();
  p.batch = edge_->mean_batch();
  return p;
}

void Aggregator::CountParentTraffic(uint64_t bytes_up, uint64_t bytes_down, bool accepted) {
  absl::MutexLock lock(&mu_);
  counters_.set_parent_bytes_up(counters_.parent_bytes_up() + bytes_up);
  counters_.set_parent_bytes_down(counters_.parent_bytes_down() + bytes_down);
  if (accepted) counters_.set_parent_updates(counters_.parent_updates() + 1);
}

absl::Status Aggregator::Finish() {
  std::shared_ptr<internal::AggregatorCheckpoint> ckpt;
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    if (counters_.done()) return absl::OkStatus();
    counters_.set_done(true);
    ++events_;  // waiting fetches hear DONE
    ckpt = SnapshotState();
    seq = state_seq_;
  }
  return WriteCheckpoint(std::move(ckpt), seq);
}

}  // namespace tern

#include "server/aggregator.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/chunking.h"
#include "common/crc32.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "core/federated/protocol.h"
#include "core/model/bundle.h"
#include "kernels/builtin.h"
#include "kernels/wire.h"
#include "spdlog/spdlog.h"

namespace tern {
namespace {

constexpr int kUnlimited = 1 << 30;

}  // namespace

absl::StatusOr<AggregatorOptions> NormalizeAggregatorOptions(AggregatorOptions o,
                                                             const CodecRegistry& codecs) {
  if (o.mode == "local-sgd" || o.mode == "ps") {
    // Every available client every round; a round closes when all replied or at its deadline.
    o.policy.clients_per_round = kUnlimited;
    o.policy.min_replies = kUnlimited;
    if (o.mode == "ps") {
      o.task.set_local_epochs(0);
      o.task.set_local_steps(1);
      o.task.set_gradient(true);
    }
  } else if (o.mode != "federated") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown mode '", o.mode, "' (federated, local-sgd, ps)"));
  }
  if (o.total_rounds < 1) return absl::InvalidArgumentError("total rounds must be >= 1");
  if (o.min_clients < 1) return absl::InvalidArgumentError("min clients must be >= 1");
  if (o.policy.clients_per_round < 1 || o.policy.min_replies < 1) {
    return absl::InvalidArgumentError("clients per round and min replies must be >= 1");
  }
  if (o.policy.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the round deadline must be > 0");
  }
  if (!(o.server_lr > 0) || !(o.server_momentum >= 0 && o.server_momentum < 1)) {
    return absl::InvalidArgumentError("need server_lr > 0 and 0 <= server_momentum < 1");
  }
  if (o.task.local_epochs() == 0 && o.task.local_steps() == 0) {
    return absl::InvalidArgumentError("a task needs local epochs or local steps");
  }
  if (o.task.batch() == 0 || !(o.task.lr() > 0)) {
    return absl::InvalidArgumentError("a task needs batch >= 1 and lr > 0");
  }
  if (o.downstream != "model" && o.downstream != "delta") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown downstream '", o.downstream, "' (model, delta)"));
  }
  TERN_RETURN_IF_ERROR(codecs.Create(o.downstream_codec).status());
  TERN_RETURN_IF_ERROR(codecs.Create(o.task.update_codec()).status());
  if (const std::string& m = o.task.memory(); !m.empty() && m != "ef") {
    TERN_RETURN_IF_ERROR(ParseDgcMemory(m, 1).status());
  }
  if (!(o.task.norm_test_eta() >= 0) || !std::isfinite(o.task.norm_test_eta())) {
    return absl::InvalidArgumentError("the norm test's eta must be >= 0");
  }
  if (o.task.norm_test_eta() > 0 && o.mode == "ps") {
    return absl::InvalidArgumentError("the adaptive batch size is for local work, not ps mode");
  }
  if (const float a = o.task.anchor_pull(); !(a >= 0 && a <= 1)) {
    return absl::InvalidArgumentError("the anchor pull alpha must be in [0, 1]");
  } else if (a > 0 && o.mode != "local-sgd") {
    // Clients keep their own models between rounds: every client must take part in every one.
    return absl::InvalidArgumentError("Overlap-Local-SGD's anchor needs mode local-sgd");
  }
  const std::string& opt = o.task.optimizer();
  TERN_RETURN_IF_ERROR(CheckOptimizerName(opt));
  if (IsAdamOptimizer(opt)) {
    if (o.mode != "ps") {
      return absl::InvalidArgumentError(absl::StrCat("optimizer '", opt, "' needs mode ps"));
    }
    if (o.server_momentum != 0 || !o.task.memory().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer '", opt, "' keeps its own momentum: no server momentum or memory"));
    }
    if (!(o.task.beta1() >= 0 && o.task.beta1() < 1) || !(o.beta2 >= 0 && o.beta2 < 1) ||
        !(o.task.eps() > 0)) {
      return absl::InvalidArgumentError("Adam needs 0 <= beta1, beta2 < 1 and eps > 0");
    }
    if (IsOnebitOptimizer(opt)) {
      if (o.task.warmup_rounds() < 1) {
        return absl::InvalidArgumentError("1-bit Adam / LAMB needs warmup rounds >= 1");
      }
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
  return r;
}

absl::StatusOr<std::unique_ptr<Aggregator>> Aggregator::Create(AggregatorOptions options,
                                                               const ServerRegistries* registries,
                                                               absl::Time now) {
  const CodecRegistry* codecs = registries->codecs.get();
  TERN_ASSIGN_OR_RETURN(options, NormalizeAggregatorOptions(std::move(options), *codecs));
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<AggregationRule> rule,
                        registries->rules->Create(options.rule));
  std::unique_ptr<Aggregator> a(new Aggregator(std::move(options), codecs, std::move(rule)));
  if (!a->options_.checkpoint_path.empty()) {
    std::ifstream f(a->options_.checkpoint_path, std::ios::binary);
    if (f) {
      std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      v1::AggregatorCheckpoint ckpt;
      if (!ckpt.ParseFromString(bytes)) {
        return absl::DataLossError(
            absl::StrCat("checkpoint ", a->options_.checkpoint_path, " does not parse"));
      }
      absl::MutexLock lock(&a->mu_);
      absl::Status s = a->Restore(ckpt);
      if (!s.ok()) {
        return absl::Status(
            s.code(), absl::StrCat("checkpoint ", a->options_.checkpoint_path, ": ", s.message()));
      }
      // Clients have a fresh timeout from now; the open round's deadline restarts.
      for (auto& [id, c] : a->clients_) c.last_seen = now;
      std::vector<int> sampled(ckpt.sampled().begin(), ckpt.sampled().end());
      std::set<int> replied(ckpt.replied().begin(), ckpt.replied().end());
      a->rounds_.Restore(static_cast<int64_t>(ckpt.round()) + (ckpt.round_open() ? 1 : 0),
                         ckpt.round_open(), std::move(sampled), std::move(replied),
                         ckpt.sampling_draws(), now);
      a->counters_.set_restarts(a->counters_.restarts() + 1);
    }
  }
  return a;
}

Aggregator::Aggregator(AggregatorOptions options, const CodecRegistry* codecs,
                       std::unique_ptr<AggregationRule> rule)
    : options_(std::move(options)),
      codecs_(codecs),
      rule_(std::move(rule)),
      fedavg_(rule_->Spec() == "fedavg"),
      adam_opt_(IsAdamOptimizer(options_.task.optimizer())),
      onebit_(IsOnebitOptimizer(options_.task.optimizer())),
      rounds_(options_.policy) {
  counters_.set_mode(options_.mode);
  counters_.set_total_rounds(static_cast<uint64_t>(options_.total_rounds));
}

absl::Status Aggregator::Restore(const v1::AggregatorCheckpoint& ckpt) {
  if (ckpt.run_id() != options_.run_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("belongs to run '", ckpt.run_id(), "', not '", options_.run_id, "'"));
  }
  counters_ = ckpt.counters();
  counters_.set_mode(options_.mode);
  counters_.set_total_rounds(static_cast<uint64_t>(options_.total_rounds));
  for (const v1::CheckpointClient& c : ckpt.clients()) {
    Client& client = clients_[c.id()];
    client.name = c.name();
    client.num_samples = c.num_samples();
    client.left = c.left();
  }
  if (ckpt.model().tensors_size() == 0) return absl::OkStatus();  // no model yet
  TERN_RETURN_IF_ERROR(AdoptModel(ckpt.model()));
  const size_t d = model_.size();
  if (ckpt.sum_size() != 0 && static_cast<size_t>(ckpt.sum_size()) != d) {
    return absl::DataLossError("the round's sum does not match the model");
  }
  if (ckpt.momentum_size() != 0 && static_cast<size_t>(ckpt.momentum_size()) != d) {
    return absl::DataLossError("the momentum does not match the model");
  }
  if (ckpt.sum_size() != 0) sum_.assign(ckpt.sum().begin(), ckpt.sum().end());
  if (ckpt.momentum_size() != 0) momentum_.assign(ckpt.momentum().begin(), ckpt.momentum().end());
  if (adam_opt_) {
    if (static_cast<size_t>(ckpt.adam_v_size()) != d ||
        static_cast<size_t>(ckpt.trust_ratio_size()) != layout_.size()) {
      return absl::DataLossError("the Adam state does not match the model");
    }
    adam_.m = momentum_;
    adam_.v.assign(ckpt.adam_v().begin(), ckpt.adam_v().end());
    adam_.ratio.assign(ckpt.trust_ratio().begin(), ckpt.trust_ratio().end());
    const int64_t closed = static_cast<int64_t>(ckpt.round());
    adam_.steps =
        onebit_ ? std::min(closed, static_cast<int64_t>(options_.task.warmup_rounds())) : closed;
  }
  if (ckpt.server_residual_size() != 0) {
    if (static_cast<size_t>(ckpt.server_residual_size()) != d) {
      return absl::DataLossError("the server residual does not match the model");
    }
    server_residual_.assign(ckpt.server_residual().begin(), ckpt.server_residual().end());
  }
  for (const v1::CheckpointUpdate& u : ckpt.pending()) {
    if (static_cast<size_t>(u.values_size()) != d || !(u.weight() > 0)) {
      return absl::DataLossError("a kept update does not match the model");
    }
    pending_.push_back({u.client(), u.weight(), {u.values().begin(), u.values().end()}});
  }
  total_weight_ = ckpt.total_weight();
  loss_sum_ = ckpt.loss_sum();
  // The model adopted above is the global model after ckpt.round() rounds.
  models_.clear();
  PublishModel();
  models_.back().round = static_cast<int64_t>(ckpt.round());
  return absl::OkStatus();
}

absl::Status Aggregator::AdoptModel(const v1::TensorBundle& bundle) {
  TERN_ASSIGN_OR_RETURN(std::vector<ParamTensor> layout,
                        LayoutFromBundle(bundle, options_.max_params));
  std::vector<float> x(LayoutNumel(layout));
  TERN_RETURN_IF_ERROR(BundleToFlat(bundle, layout, *codecs_, absl::MakeSpan(x)));
  for (float v : x) {
    if (!std::isfinite(v)) return absl::InvalidArgumentError("the model holds Inf or NaN");
  }
  layout_ = std::move(layout);
  model_ = std::move(x);
  sum_.assign(model_.size(), 0.0);
  momentum_.assign(model_.size(), 0.0f);
  scratch_.assign(model_.size(), 0.0f);
  server_residual_.assign(model_.size(), 0.0f);
  adam_.Reset(model_.size(), layout_.size());
  have_model_ = true;
  return absl::OkStatus();
}

void Aggregator::PublishModel() {
  auto dense = FlatToBundle(layout_, model_);
  auto b = std::make_shared<v1::TensorBundle>(*std::move(dense));
  b->set_run_id(options_.run_id);
  const int64_t round = static_cast<int64_t>(counters_.round());
  b->set_round(static_cast<uint64_t>(round));
  b->set_sender("server");
  models_.push_back({round, std::move(b), counters_});
  model_crc_[round] = Crc32(model_.data(), 4 * model_.size());
  while (models_.size() > static_cast<size_t>(std::max(1, options_.keep_models))) {
    models_.pop_front();
  }
  fetch_cache_.clear();  // downstream copies are made when clients fetch
}

v1::JoinReply Aggregator::Join(const v1::JoinRequest& request, absl::Time now,
                               absl::Status* status) {
  v1::JoinReply reply;
  absl::MutexLock lock(&mu_);
  *status = absl::OkStatus();
  if (request.run_id() != options_.run_id) {
    *status = absl::FailedPreconditionError(
        absl::StrCat("this server runs '", options_.run_id, "', not '", request.run_id(), "'"));
    return reply;
  }
  uint32_t id;
  if (request.client_id() >= 0 && clients_.count(static_cast<uint32_t>(request.client_id()))) {
    id = static_cast<uint32_t>(request.client_id());
  } else {
    id = clients_.empty() ? 0 : clients_.rbegin()->first + 1;
  }
  Client& c = clients_[id];
  c.name = request.name().substr(0, 128);
  c.num_samples = request.num_samples();
  c.last_seen = now;
  c.left = false;
  reply.set_client_id(id);
  reply.set_model_needed(!have_model_);
  reply.set_mode(options_.mode);
  counters_.set_clients_joined(static_cast<uint32_t>(clients_.size()));
  return reply;
}

absl::StatusOr<bool> Aggregator::InitModel(uint32_t client, const v1::TensorBundle& bundle) {
  std::shared_ptr<v1::AggregatorCheckpoint> ckpt;
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!clients_.count(client)) {
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
    PublishModel();
    ckpt = SnapshotState();
    seq = state_seq_;
  }
  TERN_RETURN_IF_ERROR(WriteCheckpoint(std::move(ckpt), seq));
  return true;
}

std::set<int> Aggregator::Available(absl::Time now) const {
  std::set<int> out;
  for (const auto& [id, c] : clients_) {
    if (!c.left && now - c.last_seen <= options_.client_timeout) out.insert(static_cast<int>(id));
  }
  return out;
}

absl::StatusOr<FetchResult> Aggregator::Fetch(uint32_t client, absl::Time now, int64_t have_round,
                                              uint32_t have_crc32, bool have_state) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(client);
  if (it == clients_.end()) {
    return absl::NotFoundError(absl::StrCat("client ", client, " has not joined"));
  }
  it->second.last_seen = now;
  FetchResult r;
  r.task = options_.task;
  r.task.set_round(rounds_.round());
  const bool onebit_phase = OnebitPhase(rounds_.round());
  if (onebit_ && !onebit_phase) {  // warm-up: dense gradients
    r.task.set_update_codec("none");
    r.task.set_error_feedback(false);
  } else if (onebit_) {
    r.task.set_error_feedback(true);
  }
  if (counters_.done()) {
    r.task.set_kind(v1::Task::DONE);
    return r;
  }
  const std::vector<int>& sampled = rounds_.sampled();
  const bool mine = rounds_.open() &&
                    std::binary_search(sampled.begin(), sampled.end(), static_cast<int>(client)) &&
                    rounds_.replied_set().count(static_cast<int>(client)) == 0;
  if (!mine || models_.empty()) {
    r.task.set_kind(v1::Task::WAIT);
    return r;
  }
  // Catch-up from the kept downstream updates when the client's copy is one we published and
  // every update since is still kept (and they are cheaper than the model); else the model.
  const int64_t latest = static_cast<int64_t>(counters_.round());
  int64_t from = -1;
  if (options_.downstream == "delta" && have_round >= 0 && have_round <= latest) {
    auto crc = model_crc_.find(have_round);
    const bool known = crc != model_crc_.end() && crc->second == have_crc32;
    uint64_t bytes = 0;
    bool kept = have_round == latest;
    if (known && !kept && !deltas_.empty() && deltas_.front().round <= have_round + 1) {
      kept = true;
      for (const Delta& dl : deltas_) {
        if (dl.round > have_round) bytes += dl.payload_bytes;
      }
    }
    // The compressed phase's updates are momenta: useless without the state that goes with them.
    const bool state_ok = !onebit_phase || have_state;
    if (known && kept && state_ok && bytes < 4 * model_.size()) from = have_round;
  }
  TERN_ASSIGN_OR_RETURN(Chunked c, Downstream(from));
  r.task.set_kind(v1::Task::TRAIN);
  r.task.set_round_clients(static_cast<uint32_t>(sampled.size()));
  r.task.set_payload(from >= 0 ? v1::Task::DELTAS : v1::Task::MODEL);
  r.task.set_delta_from(from);
  // The CRC lets a client check its copy; a lossy model encoding leaves nothing to check.
  const bool exact = options_.downstream == "delta" || options_.downstream_codec == "none";
  r.task.set_model_crc32(exact ? model_crc_[latest] : 0);
  r.chunks = c.chunks;
  counters_.set_payload_bytes_down(counters_.payload_bytes_down() + c.payload_bytes);
  counters_.set_wire_bytes_down(counters_.wire_bytes_down() + c.wire_bytes);
  counters_.set_dense_bytes_down(counters_.dense_bytes_down() + 4 * model_.size());
  return r;
}

absl::StatusOr<Aggregator::Chunked> Aggregator::Downstream(int64_t from) {
  auto hit = fetch_cache_.find(from);
  if (hit != fetch_cache_.end()) return hit->second;
  v1::TensorBundle b;
  if (from >= 0) {
    for (const Delta& dl : deltas_) {
      if (dl.round <= from) continue;
      for (const v1::NamedTensor& t : dl.tensors) *b.add_tensors() = t;
    }
  } else if (options_.downstream == "delta" || options_.downstream_codec == "none") {
    b = *models_.back().bundle;  // exact
    if (OnebitPhase(rounds_.round())) {
      TERN_RETURN_IF_ERROR(AppendOptimizerState(layout_, adam_, &b));
    }
  } else {
    TERN_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, codecs_->Create(options_.downstream_codec));
    EncodeOptions eo;
    eo.seed = options_.task.seed() ^ (static_cast<uint64_t>(rounds_.round()) << 20);
    TERN_ASSIGN_OR_RETURN(b, EncodeFlatToBundle(layout_, model_, *codec, eo, nullptr));
  }
  b.set_run_id(options_.run_id);
  b.set_sender("server");
  b.set_round(static_cast<uint64_t>(rounds_.round()));
  Chunked c;
  c.payload_bytes = PayloadBytes(b);
  TERN_ASSIGN_OR_RETURN(std::vector<v1::BundleChunk> chunks,
                        ChunkBundle(b, static_cast<uint64_t>(rounds_.round())));
  for (const v1::BundleChunk& ch : chunks) c.wire_bytes += ch.ByteSizeLong() + 5;
  c.chunks = std::make_shared<const std::vector<v1::BundleChunk>>(std::move(chunks));
  fetch_cache_[from] = c;
  return c;
}

absl::Status Aggregator::ApplyStep(const std::vector<float>& step) {
  const size_t d = model_.size();
  // Updates are finite, but enough huge ones could still overflow the model: such a step is
  // not taken (the round counts, the model stays as it was).
  for (size_t i = 0; i < d; ++i) {
    if (!std::isfinite(model_[i] + step[i]) || !std::isfinite(step[i] + server_residual_[i])) {
      spdlog::warn("server: round {}: the aggregate would overflow the model; step skipped",
                   counters_.round());
      std::fill(momentum_.begin(), momentum_.end(), 0.0f);
      return absl::OkStatus();
    }
  }
  if (options_.downstream != "delta") {
    for (size_t i = 0; i < d; ++i) model_[i] += step[i];
    return absl::OkStatus();
  }
  // The model moves by exactly what clients will decode.
  const int64_t round = static_cast<int64_t>(counters_.round());
  TERN_ASSIGN_OR_RETURN(EncodedDownstream e, EncodeDownstream(step, round));
  for (size_t i = 0; i < d; ++i) {
    if (!std::isfinite(model_[i] + scratch_[i])) {
      spdlog::warn("server: round {}: the encoded step would overflow the model; step skipped",
                   round);
      return absl::OkStatus();
    }
  }
  for (size_t i = 0; i < d; ++i) model_[i] += scratch_[i];
  KeepDelta(std::move(e), round);
  return absl::OkStatus();
}

absl::StatusOr<Aggregator::EncodedDownstream> Aggregator::EncodeDownstream(
    const std::vector<float>& step, int64_t round) {
  const size_t d = model_.size();
  std::vector<float> target(d);
  for (size_t i = 0; i < d; ++i) target[i] = step[i] + server_residual_[i];
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, codecs_->Create(options_.downstream_codec));
  EncodeOptions eo;
  eo.seed = options_.task.seed() ^ (static_cast<uint64_t>(round) << 20) ^ 0x5eed;
  EncodedDownstream e;
  e.residual.assign(d, 0.0f);
  TERN_ASSIGN_OR_RETURN(e.bundle, EncodeFlatToBundle(layout_, target, *codec, eo, &e.residual));
  // residual = target - decoded, so decoded = target - residual; decode again to apply the
  // exact values a client computes (decode, then use in float, tensor by tensor).
  TERN_RETURN_IF_ERROR(BundleToFlat(e.bundle, layout_, *codecs_, absl::MakeSpan(scratch_)));
  return e;
}

void Aggregator::KeepDelta(EncodedDownstream e, int64_t round) {
  const size_t d = model_.size();
  server_residual_ = std::move(e.residual);
  v1::TensorBundle& b = e.bundle;
  Delta dl;
  dl.round = round;
  dl.payload_bytes = PayloadBytes(b);
  for (v1::NamedTensor& t : *b.mutable_tensors()) {
    t.set_name(absl::StrCat(round, ":", t.name()));
    dl.tensors.push_back(std::move(t));
  }
  deltas_bytes_ += dl.payload_bytes;
  deltas_.push_back(std::move(dl));
  // The oldest update is useful only to a client just before it, who would need every later one
  // too: once those alone cost as much as the model, it never will be sent.
  while (!deltas_.empty() &&
         (deltas_.size() > static_cast<size_t>(std::max(1, options_.keep_deltas)) ||
          deltas_bytes_ - deltas_.front().payload_bytes >= 4 * d)) {
    deltas_bytes_ -= deltas_.front().payload_bytes;
    deltas_.pop_front();
  }
}

absl::Status Aggregator::AdamClose(const std::vector<float>* mean_or_null, int64_t round) {
  const size_t d = model_.size();
  AdamSettings as;
  as.lr = options_.task.lr();
  as.beta1 = options_.task.beta1();
  as.beta2 = options_.beta2;
  as.eps = options_.task.eps();
  as.lamb = options_.task.optimizer().find("lamb") != std::string::npos;
  const bool freeze = onebit_ && round == static_cast<int64_t>(options_.task.warmup_rounds());
  if (mean_or_null == nullptr) {  // no update this round: the model stays
    if (freeze) FreezeVariance(as, &adam_);
    return absl::OkStatus();
  }
  const std::vector<float>& mean = *mean_or_null;
  if (OnebitPhase(round)) {
    // `mean` is the clients' mean momentum: re-encode it with the server's error feedback; the
    // momentum becomes what clients decode, and everyone steps with the frozen variance.
    TERN_ASSIGN_OR_RETURN(EncodedDownstream e, EncodeDownstream(mean, round));
    std::vector<float> x = model_;
    for (size_t l = 0; l < layout_.size(); ++l) {
      const ParamTensor& p = layout_[l];
      FrozenAdamStep(as.lr, adam_.ratio[l], as.eps,
                     absl::MakeConstSpan(scratch_).subspan(p.offset, p.numel),
                     absl::MakeConstSpan(adam_.v).subspan(p.offset, p.numel),
                     absl::MakeSpan(x).subspan(p.offset, p.numel));
    }
    for (size_t i = 0; i < d; ++i) {
      if (!std::isfinite(x[i])) {
        spdlog::warn("server: round {}: the step would overflow the model; skipped", round);
        return absl::OkStatus();
      }
    }
    model_ = std::move(x);
    adam_.m = scratch_;
    KeepDelta(std::move(e), round);
    return absl::OkStatus();
  }
  AdamState saved = adam_;  // an overflowing step leaves the optimizer as it was too
  std::vector<float> step(d);
  AdamStep(as, layout_, model_, mean, &adam_, absl::MakeSpan(step));
  bool finite = true;
  for (size_t i = 0; i < d && finite; ++i) {
    finite = std::isfinite(step[i]) && std::isfinite(model_[i] + step[i]);
  }
  if (!finite) {
    spdlog::warn("server: round {}: the step would overflow the model; skipped", round);
    adam_ = std::move(saved);
  }
  if (!onebit_) return finite ? ApplyStep(step) : absl::OkStatus();
  // Warm-up: the exact model goes down (no kept updates); its last round freezes the variance
  // (even when that round's step was skipped).
  if (finite) {
    for (size_t i = 0; i < d; ++i) model_[i] += step[i];
  }
  if (freeze) FreezeVariance(as, &adam_);
  return absl::OkStatus();
}

absl::StatusOr<v1::UpdateReply> Aggregator::Push(const v1::UpdateInfo& info,
                                                 const v1::TensorBundle& update,
                                                 uint64_t wire_bytes, absl::Time now) {
  std::shared_ptr<v1::AggregatorCheckpoint> ckpt;
  uint64_t seq = 0;
  v1::UpdateReply reply;
  {
    absl::MutexLock lock(&mu_);
    auto it = clients_.find(info.client_id());
    if (it == clients_.end()) {
      return Refuse(
          absl::NotFoundError(absl::StrCat("client ", info.client_id(), " has not joined")));
    }
    it->second.last_seen = now;
    if (!have_model_) return Refuse(absl::FailedPreconditionError("no model yet"));
    if (update.run_id() != options_.run_id) {
      return Refuse(absl::InvalidArgumentError(
          absl::StrCat("update for run '", update.run_id(), "', this is '", options_.run_id, "'")));
    }
    if (update.round() != info.round()) {
      return Refuse(absl::InvalidArgumentError(
          absl::StrCat("the bundle says round ", update.round(), ", the header ", info.round())));
    }
    const double weight = info.weight();
    if (!(weight > 0) || !std::isfinite(weight) || weight > 1e12) {
      return Refuse(
          absl::InvalidArgumentError(absl::StrCat("weight ", weight, " is not in (0, 1e12]")));
    }
    // Decode first: a malformed update must not take the client's reply slot.
    absl::Status s = BundleToFlat(update, layout_, *codecs_, absl::MakeSpan(scratch_));
    if (s.ok()) {
      for (float v : scratch_) {
        if (!std::isfinite(v)) {
          s = absl::InvalidArgumentError("the update holds Inf or NaN");
          break;
        }
      }
    }
    if (!s.ok()) return Refuse(s);
    absl::StatusOr<ReplyDecision> d =
        rounds_.Reply(static_cast<int>(info.client_id()), static_cast<int64_t>(info.round()), now);
    if (!d.ok()) return Refuse(d.status());
    reply.set_server_round(static_cast<uint64_t>(rounds_.round()));
    counters_.set_payload_bytes_up(counters_.payload_bytes_up() + PayloadBytes(update));
    counters_.set_wire_bytes_up(counters_.wire_bytes_up() + wire_bytes);
    counters_.set_dense_bytes_up(counters_.dense_bytes_up() + 4 * model_.size());
    if (d->verdict == ReplyVerdict::kDropped) {
      counters_.set_updates_dropped(counters_.updates_dropped() + 1);
      reply.set_verdict(v1::UpdateReply::DROPPED);
      return reply;
    }
    const double w = weight * d->weight_scale;
    if (fedavg_) {
      for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += w * scratch_[i];
    } else {
      pending_.push_back({info.client_id(), w, scratch_});
    }
    total_weight_ += w;
    loss_sum_ += w * (std::isfinite(info.loss()) ? info.loss() : 0.0);
    if (info.batch() > 0) {
      batch_sum_ += info.batch();
      ++batch_count_;
    }
    if (d->verdict == ReplyVerdict::kAccepted) {
      counters_.set_updates_accepted(counters_.updates_accepted() + 1);
      reply.set_verdict(v1::UpdateReply::ACCEPTED);
    } else {
      counters_.set_updates_stale(counters_.updates_stale() + 1);
      reply.set_verdict(v1::UpdateReply::ACCEPTED_STALE);
    }
    ckpt = SnapshotState();
    seq = state_seq_;
  }
  // Durable before the client hears "accepted".
  TERN_RETURN_IF_ERROR(WriteCheckpoint(std::move(ckpt), seq));
  return reply;
}

absl::Status Aggregator::Refuse(absl::Status s) {
  counters_.set_updates_refused(counters_.updates_refused() + 1);
  return s;
}

absl::Status Aggregator::Leave(uint32_t client) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(client);
  if (it == clients_.end()) {
    return absl::NotFoundError(absl::StrCat("client ", client, " has not joined"));
  }
  it->second.left = true;
  return absl::OkStatus();
}

absl::Status Aggregator::CloseRound(absl::Time now) {
  rounds_.Close();
  counters_.set_round_closed_unix_s(absl::ToDoubleSeconds(now - absl::UnixEpoch()));
  counters_.set_mean_batch(batch_count_ > 0 ? batch_sum_ / batch_count_ : 0.0);
  batch_sum_ = 0;
  batch_count_ = 0;
  const size_t d = model_.size();
  std::vector<float> mean(d, 0.0f);
  bool have_update = false;
  if (fedavg_) {
    if (total_weight_ > 0) {
      for (size_t i = 0; i < d; ++i) mean[i] = static_cast<float>(sum_[i] / total_weight_);
      have_update = true;
    }
  } else if (!pending_.empty()) {
    std::vector<ClientUpdate> updates;
    for (const PendingUpdate& p : pending_) updates.push_back({p.values, p.weight});
    absl::Status s = rule_->Aggregate(updates, absl::MakeSpan(mean));
    // Too few updates for the rule (e.g. Krum's n >= 2f + 3): the round leaves the model as is.
    have_update = s.ok();
  }
  if (adam_opt_) {
    const int64_t round = static_cast<int64_t>(counters_.round()) + 1;
    counters_.set_last_round_updates(
        static_cast<uint32_t>(fedavg_ ? rounds_.replied_set().size() : pending_.size()));
    counters_.set_train_loss(total_weight_ > 0 ? loss_sum_ / total_weight_ : 0.0);
    std::fill(sum_.begin(), sum_.end(), 0.0);
    pending_.clear();
    total_weight_ = 0;
    loss_sum_ = 0;
    counters_.set_round(static_cast<uint64_t>(round));
    if (round >= options_.total_rounds) counters_.set_done(true);
    TERN_RETURN_IF_ERROR(AdamClose(have_update ? &mean : nullptr, round));
    PublishModel();
    return absl::OkStatus();
  }
  counters_.set_last_round_updates(
      static_cast<uint32_t>(fedavg_ ? rounds_.replied_set().size() : pending_.size()));
  counters_.set_train_loss(total_weight_ > 0 ? loss_sum_ / total_weight_ : 0.0);
  std::vector<float> step(d, 0.0f);
  if (have_update) {
    const float beta = static_cast<float>(options_.server_momentum);
    // ps: the updates are gradients, so the server takes the SGD step itself.
    const float lr =
        options_.mode == "ps" ? -options_.task.lr() : static_cast<float>(options_.server_lr);
    for (size_t i = 0; i < d; ++i) {
      momentum_[i] = beta * momentum_[i] + mean[i];
      step[i] = lr * momentum_[i];
    }
  }
  std::fill(sum_.begin(), sum_.end(), 0.0);
  pending_.clear();
  total_weight_ = 0;
  loss_sum_ = 0;
  counters_.set_round(counters_.round() + 1);
  if (static_cast<int64_t>(counters_.round()) >= options_.total_rounds) counters_.set_done(true);
  TERN_RETURN_IF_ERROR(ApplyStep(step));
  PublishModel();
  return absl::OkStatus();
}

absl::Status Aggregator::Tick(absl::Time now) {
  std::shared_ptr<v1::AggregatorCheckpoint> ckpt;
  uint64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!have_model_ || counters_.done()) return absl::OkStatus();
    bool changed = false;
    if (rounds_.ShouldClose(now)) {
      TERN_RETURN_IF_ERROR(CloseRound(now));
      changed = true;
    }
    const std::set<int> available = Available(now);
    counters_.set_clients_alive(static_cast<uint32_t>(available.size()));
    const int needed = counters_.round() == 0 ? options_.min_clients : 1;
    if (!rounds_.open() && !counters_.done() && static_cast<int>(available.size()) >= needed) {
      rounds_.SetAvailable(available);
      if (rounds_.Open(now).ok()) {
        fetch_cache_.clear();
        changed = true;
      }
    }
    counters_.set_round_open(rounds_.open());
    if (!changed) return absl::OkStatus();
    ckpt = SnapshotState();
    seq = state_seq_;
  }
  return WriteCheckpoint(std::move(ckpt), seq);
}

std::shared_ptr<v1::AggregatorCheckpoint> Aggregator::SnapshotState() {
  ++state_seq_;
  if (options_.checkpoint_path.empty()) return nullptr;
  auto c = std::make_shared<v1::AggregatorCheckpoint>();
  c->set_run_id(options_.run_id);
  c->set_round(counters_.round());
  c->set_round_open(rounds_.open());
  if (rounds_.open()) {
    for (int s : rounds_.sampled()) c->add_sampled(static_cast<uint32_t>(s));
    for (int s : rounds_.replied_set()) c->add_replied(static_cast<uint32_t>(s));
  }
  c->set_total_weight(total_weight_);
  c->set_loss_sum(loss_sum_);
  if (have_model_) {
    *c->mutable_model() = *models_.back().bundle;
    if (total_weight_ > 0 && fedavg_) c->mutable_sum()->Add(sum_.begin(), sum_.end());
    if (adam_opt_) {
      c->mutable_momentum()->Add(adam_.m.begin(), adam_.m.end());
      c->mutable_adam_v()->Add(adam_.v.begin(), adam_.v.end());
      c->mutable_trust_ratio()->Add(adam_.ratio.begin(), adam_.ratio.end());
    } else {
      c->mutable_momentum()->Add(momentum_.begin(), momentum_.end());
    }
    if (options_.downstream == "delta") {
      c->mutable_server_residual()->Add(server_residual_.begin(), server_residual_.end());
    }
    for (const PendingUpdate& p : pending_) {
      v1::CheckpointUpdate* u = c->add_pending();
      u->set_client(p.client);
      u->set_weight(p.weight);
      u->mutable_values()->Add(p.values.begin(), p.values.end());
    }
  }
  for (const auto& [id, cl] : clients_) {
    v1::CheckpointClient* p = c->add_clients();
    p->set_id(id);
    p->set_name(cl.name);
    p->set_num_samples(cl.num_samples);
    p->set_left(cl.left);
  }
  *c->mutable_counters() = counters_;
  c->set_sampling_draws(rounds_.draws());
  return c;
}

absl::Status Aggregator::WriteCheckpoint(std::shared_ptr<v1::AggregatorCheckpoint> ckpt,
                                         uint64_t seq) {
  if (ckpt == nullptr) return absl::OkStatus();
  absl::MutexLock lock(&io_mu_);
  if (seq <= written_seq_) return absl::OkStatus();  // a newer state is already on disk
  TERN_RETURN_IF_ERROR(WriteFileAtomically(options_.checkpoint_path, ckpt->SerializeAsString()));
  written_seq_ = seq;
  return absl::OkStatus();
}

absl::StatusOr<Aggregator::KeptModel> Aggregator::Model(int64_t round) const {
  absl::MutexLock lock(&mu_);
  if (models_.empty()) return absl::UnavailableError("no model yet");
  if (round <= 0) return models_.back();
  for (const auto& m : models_) {
    if (m.round == round) return m;
  }
  if (round > models_.back().round) {
    return absl::UnavailableError(absl::StrCat("round ", round, " has not closed yet"));
  }
  return absl::NotFoundError(absl::StrCat("the model of round ", round, " is no longer kept"));
}

v1::ServerStatus Aggregator::Status(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  v1::ServerStatus s = counters_;
  s.set_clients_alive(static_cast<uint32_t>(Available(now).size()));
  s.set_round_open(rounds_.open());
  return s;
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

}  // namespace tern

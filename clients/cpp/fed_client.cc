#include "clients/cpp/fed_client.h"

#include <algorithm>
#include <cmath>
#include <future>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/chunking.h"
#include "common/crc32.h"
#include "common/spec.h"
#include "common/status_macros.h"
#include "core/federated/protocol.h"
#include "core/model/bundle.h"
#include "core/rpc/channel.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/status.h"
#include "core/workload/partition.h"
#include "kernels/builtin.h"
#include "kernels/wire.h"
#include "spdlog/spdlog.h"
#include "tern/v1/server.grpc.pb.h"

namespace tern {
namespace {

bool Retryable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// The norm test of the adaptive batch size (Task.norm_test_eta) on the rows xb[0..b) at x:
// returns the batch size the test asks for (b when it passes).
size_t NormTestBatch(const Model& model, const float* xb, const uint8_t* yb, size_t b, size_t dim,
                     double eta, size_t max_batch, absl::Span<const float> x) {
  if (b < 2) return std::max<size_t>(b, std::min<size_t>(2, max_batch));
  // One pass, no per-sample copies: sum_s ||g_s - mean||^2 = sum_s ||g_s||^2 - b ||mean||^2.
  const size_t d = x.size();
  std::vector<float> g(d);
  std::vector<double> sum(d, 0.0);
  double sum_sq = 0;
  for (size_t s = 0; s < b; ++s) {
    model.LossAndGradient(x, xb + s * dim, yb + s, 1, absl::MakeSpan(g));
    for (size_t k = 0; k < d; ++k) {
      sum[k] += g[k];
      sum_sq += static_cast<double>(g[k]) * g[k];
    }
  }
  double mean_sq = 0;
  for (size_t k = 0; k < d; ++k) mean_sq += (sum[k] / b) * (sum[k] / b);
  const double var =
      std::max(0.0, sum_sq - static_cast<double>(b) * mean_sq) / static_cast<double>(b - 1);
  const double bound = eta * eta * mean_sq;
  if (!(var / static_cast<double>(b) > bound)) return b;
  const double want = bound > 0 ? std::ceil(var / bound) : static_cast<double>(max_batch);
  return static_cast<size_t>(std::min<double>(want, static_cast<double>(max_batch)));
}

// Local work of one task on `part`: SGD (with the task's momentum) from `x`, in place, with
// minibatches of *batch (which the norm test may raise first). Returns the mean minibatch loss
// and the examples processed.
std::pair<double, int64_t> TrainLocally(const Model& model, const Dataset& train,
                                        const std::vector<uint32_t>& part, const v1::Task& task,
                                        uint64_t seed, absl::Span<float> x, size_t* batch_state) {
  size_t batch = std::max<size_t>(1, *batch_state);
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> order = part;
  size_t pos = order.size();
  if (task.norm_test_eta() > 0 && !order.empty()) {
    // One minibatch of the current size, drawn as the round's data order would.
    std::vector<uint32_t> probe = order;
    std::shuffle(probe.begin(), probe.end(), rng);
    const size_t n = std::min(batch, probe.size());
    std::vector<float> pxb(n * train.dim);
    std::vector<uint8_t> pyb(n);
    for (size_t b = 0; b < n; ++b) {
      std::copy_n(train.row(probe[b]), train.dim, pxb.data() + b * train.dim);
      pyb[b] = train.labels[probe[b]];
    }
    const size_t cap = std::max<size_t>(
        batch, std::min<size_t>(task.max_batch() > 0 ? task.max_batch() : 1024, order.size()));
    batch = std::max(batch, NormTestBatch(model, pxb.data(), pyb.data(), n, train.dim,
                                          task.norm_test_eta(), cap, x));
    *batch_state = batch;
  }
  int64_t steps = task.local_steps();
  if (task.local_epochs() > 0) {
    steps = static_cast<int64_t>(task.local_epochs()) *
            static_cast<int64_t>((part.size() + batch - 1) / batch);
  }
  std::vector<float> xb(batch * train.dim), grad(x.size()), velocity(x.size(), 0.0f);
  std::vector<uint8_t> yb(batch);
  const float lr = task.lr(), mu = task.momentum();
  double loss_sum = 0;
  int64_t seen = 0;
  for (int64_t s = 0; s < steps; ++s) {
    // Epoch-style passes: the last batch of a pass is short rather than wrapping around.
    if (pos == order.size()) {
      std::shuffle(order.begin(), order.end(), rng);
      pos = 0;
    }
    const size_t n = std::min(batch, order.size() - pos);
    for (size_t b = 0; b < n; ++b) {
      const uint32_t i = order[pos++];
      std::copy_n(train.row(i), train.dim, xb.data() + b * train.dim);
      yb[b] = train.labels[i];
    }
    loss_sum += model.LossAndGradient(x, xb.data(), yb.data(), n, absl::MakeSpan(grad));
    seen += static_cast<int64_t>(n);
    for (size_t k = 0; k < x.size(); ++k) {
      velocity[k] = mu * velocity[k] + grad[k];
      x[k] -= lr * velocity[k];
    }
  }
  return {steps > 0 ? loss_sum / static_cast<double>(steps) : 0.0, seen};
}

// One round's local work (TrainLocally) from `start`, timed: what an Overlap-Local-SGD client
// runs in the background while the anchor is averaged.
struct LocalWork {
  std::vector<float> x;
  double loss = 0;
  size_t batch = 0;
  double seconds = 0;
};
LocalWork RunLocalWork(const Model& model, const Dataset& train, const std::vector<uint32_t>& part,
                       const v1::Task& task, uint64_t seed, std::vector<float> start,
                       size_t batch) {
  const absl::Time t0 = absl::Now();
  LocalWork w;
  w.x = std::move(start);
  if (batch == 0 || task.norm_test_eta() <= 0) batch = std::max<uint32_t>(1, task.batch());
  w.loss = TrainLocally(model, train, part, task, seed, absl::MakeSpan(w.x), &batch).first;
  w.batch = batch;
  w.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  return w;
}

// The gradient of one minibatch of `batch` examples of `part` at `x`; returns its loss.
float MinibatchGradient(const Model& model, const Dataset& train, const std::vector<uint32_t>& part,
                        size_t batch, uint64_t seed, absl::Span<const float> x,
                        absl::Span<float> grad) {
  std::mt19937_64 rng(seed);
  const size_t n = std::min(batch, part.size());
  std::vector<uint32_t> order = part;
  for (size_t i = 0; i < n; ++i) {  // partial Fisher-Yates: n distinct examples
    std::uniform_int_distribution<size_t> pick(i, order.size() - 1);
    std::swap(order[i], order[pick(rng)]);
  }
  std::vector<float> xb(n * train.dim);
  std::vector<uint8_t> yb(n);
  for (size_t b = 0; b < n; ++b) {
    std::copy_n(train.row(order[b]), train.dim, xb.data() + b * train.dim);
    yb[b] = train.labels[order[b]];
  }
  return model.LossAndGradient(x, xb.data(), yb.data(), n, grad);
}

// The client's memory between rounds around its update codec (Task.memory).
class UpdateEncoder {
 public:
  absl::StatusOr<v1::TensorBundle> Encode(const v1::Task& task,
                                          const std::vector<ParamTensor>& layout,
                                          absl::Span<const float> update, double epoch,
                                          const EncodeOptions& eo, const CodecRegistry& codecs) {
    const std::string& mem = task.memory();
    if (mem.rfind("dgc", 0) == 0) {
      if (dgc_.size() != layout.size()) {
        TERN_ASSIGN_OR_RETURN(
            DgcOptions opts,
            ParseDgcMemory(mem, static_cast<int>(std::max<uint32_t>(1, task.round_clients()))));
        dgc_.clear();
        for (size_t i = 0; i < layout.size(); ++i) {
          TERN_ASSIGN_OR_RETURN(std::unique_ptr<DgcMemory> m, DgcMemory::Create(opts));
          dgc_.push_back(std::move(m));
        }
      }
      v1::TensorBundle b;
      for (size_t i = 0; i < layout.size(); ++i) {
        const ParamTensor& p = layout[i];
        dgc_[i]->SetEpoch(epoch);
        EncodedTensor t;
        EncodeOptions o = eo;
        o.seed = eo.seed + i;
        TERN_RETURN_IF_ERROR(dgc_[i]->Encode(update.subspan(p.offset, p.numel), o, &t));
        v1::NamedTensor* nt = b.add_tensors();
        nt->set_name(p.name);
        nt->mutable_tensor()->set_dtype(v1::DTYPE_FLOAT32);
        ToProto(std::move(t), nt->mutable_tensor());
        for (int64_t d : p.shape) nt->mutable_tensor()->add_shape(d);
      }
      return b;
    }
    const bool ef = task.error_feedback() || mem == "ef";
    if (ef && residual_.size() != update.size()) residual_.assign(update.size(), 0.0f);
    TERN_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, codecs.Create(task.update_codec()));
    return EncodeFlatToBundle(layout, update, *codec, eo, ef ? &residual_ : nullptr);
  }

 private:
  std::vector<float> residual_;  // error feedback
  std::vector<std::unique_ptr<DgcMemory>> dgc_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<FedClientData>> LoadFedClientData(const std::string& data_dir,
                                                                 const std::string& partition,
                                                                 int num_partitions,
                                                                 const std::string& model,
                                                                 uint64_t seed) {
  auto d = std::make_unique<FedClientData>();
  TERN_ASSIGN_OR_RETURN(d->data, LoadTrainingData(data_dir, seed));
  TERN_ASSIGN_OR_RETURN(PartitionSpec spec, ParsePartition(partition));
  TERN_ASSIGN_OR_RETURN(d->parts, Partition(d->data.train.labels, d->data.train.num_classes,
                                            num_partitions, spec, seed));
  TERN_ASSIGN_OR_RETURN(d->model, CreateModel(model, d->data.train.dim, d->data.train.num_classes));
  return d;
}

absl::StatusOr<FedClientStats> RunFederatedClient(const std::shared_ptr<grpc::Channel>& channel,
                                                  const FedClientOptions& o,
                                                  const FedClientData& shared,
                                                  const std::atomic<bool>& stop) {
  if (o.index < 0 || static_cast<size_t>(o.index) >= shared.parts.size()) {
    return absl::InvalidArgumentError(absl::StrCat("client index ", o.index, " outside the ",
                                                   shared.parts.size(), " partitions"));
  }
  const Model& model = *shared.model;
  const std::vector<uint32_t>& part = shared.parts[static_cast<size_t>(o.index)];
  const std::string name = o.name.empty() ? absl::StrCat("client-", o.index) : o.name;
  const std::vector<ParamTensor>& layout = model.Layout();
  auto codecs = NewBuiltinCodecRegistry();
  auto stub = v1::Aggregator::NewStub(channel);
  FedClientStats stats;
  int64_t id = -1;
  UpdateEncoder encoder;  // error feedback / DGC memory, kept between rounds
  size_t batch = 0;       // the adaptive batch size, once the norm test runs
  AdamState adam;         // 1-bit Adam / LAMB's compressed phase: momentum, frozen variance
  bool have_adam = false;
  // The global model as of `have_round` (delta downstream keeps it in step with the server).
  // It starts as the initial model every client makes from the shared seed: the server's round
  // 0 when one of us gave it the model, which the CRC confirms (else the server sends the model).
  std::vector<float> global(model.NumParams());
  model.Init(o.seed, absl::MakeSpan(global));
  int64_t have_round = 0;
  uint32_t have_crc = Crc32(global.data(), 4 * global.size());
  absl::Time unreachable_since = absl::InfiniteFuture();
  auto deadline = [&](grpc::ClientContext* ctx, absl::Duration extra = absl::ZeroDuration()) {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + o.call_timeout + extra));
  };
  // Backs off on a transient error, saying so now and then; returns false once the server has
  // been gone too long.
  absl::Time last_said = absl::InfinitePast();
  auto still_trying = [&](const grpc::Status& s) {
    if (!Retryable(s)) return false;
    const absl::Time now = absl::Now();
    if (unreachable_since == absl::InfiniteFuture()) unreachable_since = now;
    if (now - unreachable_since > o.give_up_after) {
      spdlog::error("{}: cannot reach {} ({}); gave up after {}", name,
                    o.server.empty() ? "the server" : o.server, s.error_message(),
                    absl::FormatDuration(o.give_up_after));
      return false;
    }
    if (now - last_said >= absl::Seconds(5)) {
      spdlog::warn("{}: cannot reach {} ({}), retrying for up to {}", name,
                   o.server.empty() ? "the server" : o.server, s.error_message(),
                   absl::FormatDuration(o.give_up_after - (now - unreachable_since)));
      last_said = now;
    }
    absl::SleepFor(absl::Milliseconds(200));
    return true;
  };

  // Overlap-Local-SGD: the client's own model and the next round's local steps, in flight.
  std::vector<float> local;
  std::future<LocalWork> pending;
  const absl::Time started = absl::Now();

  while (!stop.load()) {
    // (Re)join: after a server restart the old id is asked back.
    if (id < 0 || unreachable_since != absl::InfiniteFuture()) {
      grpc::ClientContext ctx;
      deadline(&ctx);
      v1::JoinRequest req;
      req.set_run_id(o.run_id);
      req.set_name(name);
      req.set_num_samples(part.size());
      req.set_client_id(id);
      v1::JoinReply reply;
      grpc::Status s = stub->Join(&ctx, req, &reply);
      if (!s.ok()) {
        if (still_trying(s)) continue;
        return FromGrpcStatus(s);
      }
      unreachable_since = absl::InfiniteFuture();
      id = reply.client_id();
      if (reply.model_needed()) {
        std::vector<float> x(model.NumParams());
        model.Init(o.seed, absl::MakeSpan(x));
        TERN_ASSIGN_OR_RETURN(v1::TensorBundle b, FlatToBundle(layout, x));
        TERN_ASSIGN_OR_RETURN(std::vector<v1::BundleChunk> chunks, ChunkBundle(b, 0));
        grpc::ClientContext ictx;
        deadline(&ictx);
        v1::InitModelReply ireply;
        auto writer = stub->InitModel(&ictx, &ireply);
        WriteChunks<v1::InitModelRequest>(
            writer.get(), std::move(chunks),
            [&](v1::InitModelRequest& r) { r.set_client_id(static_cast<uint32_t>(id)); });
        writer->WritesDone();
        grpc::Status is = writer->Finish();
        if (!is.ok() && !still_trying(is)) return FromGrpcStatus(is);
      }
    }

    // Fetch (long poll).
    grpc::ClientContext fctx;
    deadline(&fctx, o.fetch_wait);
    v1::FetchRequest freq;
    freq.set_client_id(static_cast<uint32_t>(id));
    freq.set_max_wait_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(o.fetch_wait)));
    freq.set_have_round(have_round);
    freq.set_have_crc32(have_crc);
    freq.set_have_optimizer_state(have_adam);
    auto reader = stub->Fetch(&fctx, freq);
    v1::FetchReply first;
    if (!reader->Read(&first)) {
      grpc::Status s = reader->Finish();
      if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
        id = -1;  // the server does not know us (a fresh server): join again
        continue;
      }
      if (still_trying(s)) continue;
      return FromGrpcStatus(s);
    }
    const v1::Task task = first.task();
    if (task.kind() == v1::Task::DONE) {
      reader->Finish();
      break;
    }
    if (task.kind() != v1::Task::TRAIN) {
      reader->Finish();
      continue;
    }
    // The first message may carry the first chunk: assemble from it, then the rest.
    BundleAssembler assembler(uint64_t{1} << 31);
    absl::Status as = assembler.Add(first.chunk());
    v1::FetchReply more;
    while (as.ok() && !assembler.complete() && reader->Read(&more)) {
      as = assembler.Add(more.chunk());
    }
    if (!as.ok()) {
      while (reader->Read(&more)) {
      }
    }
    grpc::Status fs = reader->Finish();
    if (!fs.ok()) {
      if (still_trying(fs)) continue;
      return FromGrpcStatus(fs);
    }
    TERN_RETURN_IF_ERROR(as);
    if (!assembler.complete()) return absl::DataLossError("the model stream ended early");
    TERN_ASSIGN_OR_RETURN(v1::TensorBundle mb, assembler.Finish());
    const bool onebit = IsOnebitOptimizer(task.optimizer()) && task.round() > task.warmup_rounds();
    if (task.payload() == v1::Task::DELTAS) {
      if (task.delta_from() != have_round) {
        return absl::DataLossError(absl::StrCat("updates from round ", task.delta_from(),
                                                " for a copy of round ", have_round));
      }
      if (onebit) {
        if (!have_adam) return absl::DataLossError("1-bit updates without the optimizer state");
        TERN_RETURN_IF_ERROR(
            ApplyOnebitDeltas(mb, layout, *codecs, task, &adam, absl::MakeSpan(global)));
      } else {
        TERN_RETURN_IF_ERROR(ApplyDeltas(mb, layout, *codecs, absl::MakeSpan(global)));
      }
    } else {
      TERN_ASSIGN_OR_RETURN(have_adam, TakeOptimizerState(layout, *codecs, &mb, &adam));
      TERN_RETURN_IF_ERROR(BundleToFlat(mb, layout, *codecs, absl::MakeSpan(global)));
    }
    if (onebit && !have_adam) {
      return absl::DataLossError("the server sent no optimizer state for 1-bit Adam");
    }
    have_round = -1;  // unless the copy is known to be exact
    if (task.model_crc32() != 0) {
      have_crc = Crc32(global.data(), 4 * global.size());
      if (have_crc == task.model_crc32()) {
        have_round = static_cast<int64_t>(task.round()) - 1;
      } else {
        spdlog::warn("{}: model copy for round {} fails its CRC; asking for the model next time",
                     name, task.round());
        continue;
      }
    }
    const std::vector<float>& x0 = global;

    // Local training, then the update x - x0 (or, for parameter-server steps, one minibatch
    // gradient at x0), encoded.
    const absl::Time t0 = absl::Now();
    std::vector<float> x = x0;
    const uint64_t data_seed =
        o.seed * 1000003 + static_cast<uint64_t>(o.index) * 7919 + task.round();
    double loss;
    double train_s;
    const bool overlap = task.anchor_pull() > 0 && !task.gradient();
    if (overlap) {
      // Overlap-Local-SGD: this round's local steps ran from the client's own model while the
      // anchor x0 was averaged and fetched (run now in the first round, when none did). Pull
      // towards the anchor; push the pulled model's offset from it.
      if (local.empty()) local = x0;
      LocalWork w = pending.valid() ? pending.get()
                                    : RunLocalWork(model, shared.data.train, part, task, data_seed,
                                                   local, batch);
      x = std::move(w.x);
      const float a = task.anchor_pull();
      for (size_t k = 0; k < x.size(); ++k) x[k] -= a * (x[k] - x0[k]);
      local = x;
      for (size_t k = 0; k < x.size(); ++k) x[k] -= x0[k];
      if (w.batch != batch) {
        spdlog::info("{}: round {}: norm test raised the batch from {} to {}", name, task.round(),
                     batch, w.batch);
      }
      batch = w.batch;
      loss = w.loss;
      train_s = w.seconds;
      // The next round's steps start now, from the pulled model, with this task's settings.
      const uint64_t next_seed = data_seed + 1;
      pending = std::async(
          std::launch::async, [&model, &shared, &part, task, next_seed, start = local, b = batch] {
            return RunLocalWork(model, shared.data.train, part, task, next_seed, start, b);
          });
    } else if (task.gradient()) {
      loss = MinibatchGradient(model, shared.data.train, part, std::max<uint32_t>(1, task.batch()),
                               data_seed, x0, absl::MakeSpan(x));
      if (onebit) {  // push this worker's momentum, not its gradient
        const float b1 = task.beta1();
        for (size_t k = 0; k < x.size(); ++k) x[k] = b1 * adam.m[k] + (1.0f - b1) * x[k];
      }
    } else {
      if (batch == 0 || task.norm_test_eta() <= 0) batch = std::max<uint32_t>(1, task.batch());
      const size_t before = batch;
      loss =
          TrainLocally(model, shared.data.train, part, task, data_seed, absl::MakeSpan(x), &batch)
              .first;
      if (batch != before) {
        spdlog::info("{}: round {}: norm test raised the batch from {} to {}", name, task.round(),
                     before, batch);
      }
      for (size_t k = 0; k < x.size(); ++k) x[k] -= x0[k];
    }
    if (!overlap) train_s = absl::ToDoubleSeconds(absl::Now() - t0);
    stats.train_seconds += train_s;
    ++stats.rounds_trained;
    EncodeOptions eo;
    eo.seed = task.seed() ^ (task.round() << 24) ^ (static_cast<uint64_t>(id) << 48);
    // Epochs of this client's data seen before this round (DGC's warm-up schedule).
    const double epoch = part.empty() ? 0.0
                                      : static_cast<double>(task.round() - 1) *
                                            std::max<uint32_t>(1, task.batch()) /
                                            static_cast<double>(part.size());
    TERN_ASSIGN_OR_RETURN(v1::TensorBundle ub, encoder.Encode(task, layout, x, epoch, eo, *codecs));
    ub.set_run_id(o.run_id);
    ub.set_round(task.round());
    ub.set_sender(name);
    TERN_ASSIGN_OR_RETURN(std::vector<v1::BundleChunk> chunks, ChunkBundle(ub, task.round()));
    grpc::ClientContext pctx;
    deadline(&pctx);
    v1::UpdateReply preply;
    auto writer = stub->Push(&pctx, &preply);
    WriteChunks<v1::UpdateRequest>(writer.get(), std::move(chunks), [&](v1::UpdateRequest& r) {
      v1::UpdateInfo* info = r.mutable_info();
      info->set_client_id(static_cast<uint32_t>(id));
      info->set_round(task.round());
      info->set_weight(static_cast<double>(part.size()));
      info->set_loss(static_cast<float>(loss));
      info->set_train_seconds(train_s);
      info->set_batch(static_cast<uint32_t>(task.gradient() ? task.batch() : batch));
    });
    writer->WritesDone();
    grpc::Status ps = writer->Finish();
    if (ps.ok() && preply.verdict() != v1::UpdateReply::DROPPED) {
      ++stats.updates_accepted;
    } else {
      ++stats.updates_refused;
      spdlog::warn("{}: update for round {} not used: {}", name, task.round(),
                   ps.ok() ? "dropped as late" : ps.error_message());
      if (!ps.ok() && Retryable(ps)) unreachable_since = absl::Now();
    }
  }
  stats.wall_seconds = absl::ToDoubleSeconds(absl::Now() - started);
  spdlog::info("{}: {} rounds; {:.1f} s of local work in {:.1f} s ({:.0f} % busy)", name,
               stats.rounds_trained, stats.train_seconds, stats.wall_seconds,
               stats.wall_seconds > 0 ? 100 * stats.train_seconds / stats.wall_seconds : 0.0);
  return stats;
}

}  // namespace tern

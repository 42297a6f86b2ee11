#include "clients/cpp/builtin_trainer.h"

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/chunking.h"
#include "common/status_macros.h"
#include "core/model/bundle.h"
#include "core/rpc/channel.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/status.h"
#include "core/workload/builtin_model.h"
#include "core/workload/dataset.h"
#include "core/workload/partition.h"
#include "kernels/builtin.h"
#include "spdlog/spdlog.h"
#include "tern/v1/worker.grpc.pb.h"

namespace tern {

int64_t StepsPerEpoch(size_t train_size, int workers, int batch) {
  const size_t per_step = static_cast<size_t>(std::max(1, workers)) * std::max(1, batch);
  return static_cast<int64_t>((train_size + per_step - 1) / per_step);
}

absl::Status RunBuiltinTrainer(const std::shared_ptr<grpc::Channel>& channel,
                               const BuiltinTrainerOptions& o, const std::atomic<bool>& stop) {
  if (o.batch < 1 || o.epochs < 0) return absl::InvalidArgumentError("batch >= 1, epochs >= 0");
  TERN_ASSIGN_OR_RETURN(PartitionSpec pspec, ParsePartition(o.partition));
  Dataset shard;
  size_t train_size;
  {
    // The full training set is only held while this worker's shard is cut from it.
    TERN_ASSIGN_OR_RETURN(TrainTest data, LoadTrainingData(o.data_dir, o.seed));
    if (data.synthetic) {
      spdlog::warn("worker {}: Fashion-MNIST not found; training on synthetic data", o.worker_id);
    }
    train_size = data.train.size();
    TERN_ASSIGN_OR_RETURN(auto parts, Partition(data.train.labels, data.train.num_classes,
                                                o.num_workers, pspec, o.seed));
    const std::vector<uint32_t>& mine = parts[o.worker_id];
    if (mine.empty()) return absl::FailedPreconditionError("this worker's partition is empty");
    shard.dim = data.train.dim;
    shard.num_classes = data.train.num_classes;
    shard.source = data.train.source;
    shard.features.resize(mine.size() * shard.dim);
    shard.labels.resize(mine.size());
    for (size_t i = 0; i < mine.size(); ++i) {
      std::copy_n(data.train.row(mine[i]), shard.dim, shard.features.data() + i * shard.dim);
      shard.labels[i] = data.train.labels[mine[i]];
    }
  }
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                        CreateModel(o.model, shard.dim, shard.num_classes));
  std::vector<float> params(model->NumParams()), grad(model->NumParams());
  model->Init(o.seed, absl::MakeSpan(params));
  const std::vector<ParamTensor>& layout = model->Layout();
  auto codecs = NewBuiltinCodecRegistry();
  auto stub = v1::Trainer::NewStub(channel);

  // Register.
  {
    TERN_ASSIGN_OR_RETURN(v1::TensorBundle b, FlatToBundle(layout, params));
    TERN_ASSIGN_OR_RETURN(std::vector<v1::BundleChunk> chunks, ChunkBundle(b, 0));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + o.step_timeout));
    v1::RegisterReply reply;
    auto writer = stub->Register(&ctx, &reply);
    for (auto& c : chunks) {
      v1::RegisterRequest req;
      *req.mutable_chunk() = std::move(c);
      if (!writer->Write(req)) break;
    }
    writer->WritesDone();
    TERN_RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
    if (reply.step() != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker is at step ", reply.step(), "; the built-in trainer only starts fresh runs"));
    }
  }

  const int64_t steps = o.epochs * StepsPerEpoch(train_size, o.num_workers, o.batch);
  spdlog::info("worker {}: training {} on {} examples ({}), {} steps of batch {}", o.worker_id,
               model->Spec(), shard.size(), shard.source, steps, o.batch);
  std::mt19937_64 rng(o.seed * 1000003 + static_cast<uint64_t>(o.worker_id));
  std::vector<uint32_t> order(shard.size());
  std::iota(order.begin(), order.end(), 0u);
  size_t pos = order.size();
  std::vector<float> x(static_cast<size_t>(o.batch) * shard.dim);
  std::vector<uint8_t> y(static_cast<size_t>(o.batch));
  for (int64_t step = 0; step < steps && !stop.load(); ++step) {
    const absl::Time t0 = absl::Now();
    for (int b = 0; b < o.batch; ++b) {
      if (pos == order.size()) {
        std::shuffle(order.begin(), order.end(), rng);
        pos = 0;
      }
      const uint32_t i = order[pos++];
      std::copy_n(shard.row(i), shard.dim, x.data() + static_cast<size_t>(b) * shard.dim);
      y[b] = shard.labels[i];
    }
    const float loss = model->LossAndGradient(params, x.data(), y.data(),
                                              static_cast<size_t>(o.batch), absl::MakeSpan(grad));
    const double compute = absl::ToDoubleSeconds(absl::Now() - t0);

    TERN_ASSIGN_OR_RETURN(v1::TensorBundle gb, FlatToBundle(layout, grad));
    gb.set_round(static_cast<uint64_t>(step));
    TERN_ASSIGN_OR_RETURN(std::vector<v1::BundleChunk> chunks,
                          ChunkBundle(gb, static_cast<uint64_t>(step)));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + o.step_timeout));
    auto stream = stub->Step(&ctx);
    for (size_t c = 0; c < chunks.size(); ++c) {
      v1::StepRequest req;
      if (c == 0) {
        v1::StepInfo* info = req.mutable_info();
        info->set_step(static_cast<uint64_t>(step));
        info->set_loss(loss);
        info->set_compute_seconds(compute);
      }
      *req.mutable_chunk() = std::move(chunks[c]);
      if (!stream->Write(req)) break;
    }
    stream->WritesDone();
    v1::StepReply first;
    absl::StatusOr<v1::TensorBundle> pb = ReadChunkedBundle(stream.get(), &first);
    TERN_RETURN_IF_ERROR(FromGrpcStatus(stream->Finish()));
    TERN_RETURN_IF_ERROR(pb.status());
    TERN_RETURN_IF_ERROR(BundleToFlat(*pb, layout, *codecs, absl::MakeSpan(params)));
  }
  return absl::OkStatus();
}

}  // namespace tern

#include "clients/cpp/aggregator_client.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/chunking.h"
#include "common/crc32.h"
#include "common/status_macros.h"
#include "core/federated/protocol.h"
#include "core/model/bundle.h"
#include "core/rpc/channel.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/status.h"
#include "kernels/builtin.h"
#include "kernels/wire.h"
#include "spdlog/spdlog.h"

namespace tern {

// The client's memory between rounds around its update codec (Task.memory): error feedback's
// residual or DGC's per-tensor memories.
class UpdateEncoder {
 public:
  absl::StatusOr<v1::TensorBundle> Encode(const v1::Task& task,
                                          const std::vector<ParamTensor>& layout,
                                          absl::Span<const float> update, double epoch,
                                          const EncodeOptions& eo, const CodecRegistry& codecs) {
    const std::string& mem = task.memory();
    if (mem.rfind("dgc", 0) == 0) return EncodeDgc(task, layout, update, epoch, eo);
    const bool ef = task.error_feedback() || mem == "ef";
    if (ef && residual_.size() != update.size()) residual_.assign(update.size(), 0.0f);
    if (tensor_codecs_ == nullptr) tensor_codecs_ = std::make_unique<TensorCodecs>(&codecs);
    TERN_RETURN_IF_ERROR(tensor_codecs_->Use(task.update_codec(), layout.size()));
    return EncodeFlatToBundle(layout, update, *tensor_codecs_, eo, ef ? &residual_ : nullptr);
  }

 private:
  absl::StatusOr<v1::TensorBundle> EncodeDgc(const v1::Task& task,
                                             const std::vector<ParamTensor>& layout,
                                             absl::Span<const float> update, double epoch,
                                             const EncodeOptions& eo) {
    if (dgc_.size() != layout.size()) {
      TERN_ASSIGN_OR_RETURN(DgcOptions opts,
                            ParseDgcMemory(task.memory(), static_cast<int>(std::max<uint32_t>(
                                                              1, task.round_clients()))));
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

  std::vector<float> residual_;  // error feedback
  // Kept across rounds: PowerSGD's warm start is per tensor.
  std::unique_ptr<TensorCodecs> tensor_codecs_;
  std::vector<std::unique_ptr<DgcMemory>> dgc_;
};

namespace {

bool Retryable(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

}  // namespace

AggregatorClient::AggregatorClient(AggregatorClientOptions options, Participant* participant,
                                   std::unique_ptr<v1::Aggregator::StubInterface> stub,
                                   Clock* clock)
    : options_(std::move(options)),
      participant_(participant),
      stub_(std::move(stub)),
      clock_(clock),
      codecs_(NewBuiltinCodecRegistry()),
      encoder_(std::make_unique<UpdateEncoder>()) {}

// The copy starts as the initial model every participant makes: the server's round 0 when one
// of them gave it the model, which the CRC confirms (else the server sends the model).
absl::Status AggregatorClient::StartFromInitialModel() {
  if (initialized_) return absl::OkStatus();
  global_.assign(LayoutNumel(participant_->Layout()), 0.0f);
  TERN_RETURN_IF_ERROR(participant_->InitialModel(absl::MakeSpan(global_)));
  have_crc_ = Crc32(global_.data(), 4 * global_.size());
  initialized_ = true;
  return absl::OkStatus();
}

AggregatorClient::~AggregatorClient() = default;

void AggregatorClient::SetDeadline(grpc::ClientContext* ctx, absl::Duration extra) const {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout + extra));
}

absl::Status AggregatorClient::Retry(const absl::Status& s) {
  if (!Retryable(s)) return s;
  const absl::Time now = clock_->Now();
  if (unreachable_since_ == absl::InfiniteFuture()) unreachable_since_ = now;
  const std::string server = options_.server.empty() ? "the server" : options_.server;
  if (now - unreachable_since_ > options_.give_up_after) {
    spdlog::error("{}: cannot reach {} ({}); gave up after {}", options_.name, server,
                  std::string(s.message()), absl::FormatDuration(options_.give_up_after));
    return s;
  }
  if (now - last_said_ >= absl::Seconds(5)) {
    spdlog::warn("{}: cannot reach {} ({}), retrying for up to {}", options_.name, server,
                 std::string(s.message()),
                 absl::FormatDuration(options_.give_up_after - (now - unreachable_since_)));
    last_said_ = now;
  }
  clock_->SleepFor(absl::Milliseconds(200));
  return absl::OkStatus();
}

absl::Status AggregatorClient::Join() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::JoinRequest req;
  req.set_run_id(options_.run_id);
  req.set_name(options_.name);
  req.set_num_samples(participant_->NumExamples());
  req.set_client_id(id_);  // after a server restart, the old id is asked back
  v1::JoinReply reply;
  TERN_RETURN_IF_ERROR(FromGrpcStatus(stub_->Join(&ctx, req, &reply)));
  unreachable_since_ = absl::InfiniteFuture();
  id_ = reply.client_id();
  return reply.model_needed() ? SendInitialModel() : absl::OkStatus();
}

absl::Status AggregatorClient::SendInitialModel() {
  std::vector<float> x(LayoutNumel(participant_->Layout()));
  TERN_RETURN_IF_ERROR(participant_->InitialModel(absl::MakeSpan(x)));
  TERN_ASSIGN_OR_RETURN(v1::TensorBundle b, FlatToBundle(participant_->Layout(), x));
  TERN_ASSIGN_OR_RETURN(std::vector<v1::BundleChunk> chunks, ChunkBundle(b, 0));
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::InitModelReply reply;
  auto writer = stub_->InitModel(&ctx, &reply);
  WriteChunks<v1::InitModelRequest>(writer.get(), std::move(chunks), [&](v1::InitModelRequest& r) {
    r.set_client_id(static_cast<uint32_t>(id_));
  });
  writer->WritesDone();
  return FromGrpcStatus(writer->Finish());
}

absl::StatusOr<AggregatorClient::Fetched> AggregatorClient::Fetch() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.fetch_wait);  // a long poll
  v1::FetchRequest req;
  req.set_client_id(static_cast<uint32_t>(id_));
  req.set_max_wait_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.fetch_wait)));
  req.set_have_round(have_round_);
  req.set_have_crc32(have_crc_);
  req.set_have_optimizer_state(have_adam_);
  auto reader = stub_->Fetch(&ctx, req);
  v1::FetchReply first;
  if (!reader->Read(&first)) {
    const absl::Status s = FromGrpcStatus(reader->Finish());
    return s.ok() ? absl::UnavailableError("the server ended a Fetch without a task") : s;
  }
  Fetched f;
  f.task = first.task();
  if (f.task.kind() != v1::Task::TRAIN) {
    v1::FetchReply rest;
    while (reader->Read(&rest)) {
    }
    TERN_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
    return f;
  }
  // The first message may carry the first chunk: assemble from it, then the rest.
  BundleAssembler assembler(uint64_t{1} << 31);
  absl::Status as = assembler.Add(first.chunk());
  v1::FetchReply more;
  while (as.ok() && !assembler.complete() && reader->Read(&more)) as = assembler.Add(more.chunk());
  if (!as.ok()) {
    while (reader->Read(&more)) {
    }
  }
  TERN_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  TERN_RETURN_IF_ERROR(as);
  if (!assembler.complete()) return absl::DataLossError("the model stream ended early");
  TERN_ASSIGN_OR_RETURN(f.payload, assembler.Finish());
  return f;
}

absl::StatusOr<bool> AggregatorClient::UpdateGlobal(const v1::Task& task,
                                                    v1::TensorBundle payload) {
  const std::vector<ParamTensor>& layout = participant_->Layout();
  const bool onebit = InOnebitPhase(task);
  if (task.payload() == v1::Task::DELTAS) {
    if (task.delta_from() != have_round_ || have_round_ < 0) {
      spdlog::warn(
          "{}: round {}: updates from round {} for a copy of round {}; asking for the "
          "model",
          options_.name, task.round(), task.delta_from(), have_round_);
      have_round_ = -1;
      return false;
    }
    if (onebit) {
      if (!have_adam_) return absl::DataLossError("1-bit updates without the optimizer state");
      TERN_RETURN_IF_ERROR(
          ApplyOnebitDeltas(payload, layout, *codecs_, task, &adam_, absl::MakeSpan(global_)));
    } else {
      TERN_RETURN_IF_ERROR(ApplyDeltas(payload, layout, *codecs_, absl::MakeSpan(global_)));
    }
  } else {
    TERN_ASSIGN_OR_RETURN(have_adam_, TakeOptimizerState(layout, *codecs_, &payload, &adam_));
    TERN_RETURN_IF_ERROR(BundleToFlat(payload, layout, *codecs_, absl::MakeSpan(global_)));
  }
  if (onebit && !have_adam_) {
    return absl::DataLossError("the server sent no optimizer state for 1-bit Adam");
  }
  have_round_ = -1;                          // unless the copy is known to be exact
  if (task.model_crc32() == 0) return true;  // a lossy model: nothing to check
  have_crc_ = Crc32(global_.data(), 4 * global_.size());
  if (have_crc_ != task.model_crc32()) {
    spdlog::warn("{}: model copy for round {} fails its CRC; asking for the model next time",
                 options_.name, task.round());
    return false;
  }
  have_round_ = static_cast<int64_t>(task.round()) - 1;
  return true;
}

absl::Status AggregatorClient::Train(const v1::Task& task) {
  v1::Evaluation eval;
  bool evaluated = false;
  if (task.evaluate()) {
    TERN_ASSIGN_OR_RETURN(evaluated, participant_->Evaluate(global_, &eval));
    // The server refuses an update with an evaluation it cannot use: keep the update.
    if (evaluated) {
      if (absl::Status s = CheckEvaluation(eval); !s.ok()) {
        spdlog::warn("{}: round {}: {}; sent without it", options_.name, task.round(),
                     std::string(s.message()));
        evaluated = false;
      }
    }
  }
  WorkContext context;
  context.client_id = id_;
  context.adam = have_adam_ ? &adam_ : nullptr;
  context.encode_seed = task.seed() ^ (task.round() << 24) ^ (static_cast<uint64_t>(id_) << 48);
  TERN_ASSIGN_OR_RETURN(WorkResult work, participant_->Work(task, global_, context));
  const std::vector<ParamTensor>& layout = participant_->Layout();
  if (work.update.size() != global_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the participant's update has ",
                                                   work.update.size(), " values; the model has ",
                                                   global_.size()));
  }
  stats_.train_seconds += work.seconds;
  ++stats_.rounds_trained;
  EncodeOptions eo;
  eo.seed = context.encode_seed;
  // Epochs of this client's data seen before this round (DGC's warm-up schedule).
  const uint64_t examples = participant_->NumExamples();
  const double epoch = examples == 0 ? 0.0
                                     : static_cast<double>(task.round() - 1) *
                                           std::max<uint32_t>(1, TaskBatch(task)) /
                                           static_cast<double>(examples);
  TERN_ASSIGN_OR_RETURN(v1::TensorBundle update,
                        encoder_->Encode(task, layout, work.update, epoch, eo, *codecs_));
  update.set_run_id(options_.run_id);
  update.set_round(task.round());
  update.set_sender(options_.name);
  return Push(task, work, update, evaluated ? &eval : nullptr);
}

absl::Status AggregatorClient::Push(const v1::Task& task, const WorkResult& work,
                                    const v1::TensorBundle& update, const v1::Evaluation* eval) {
  TERN_ASSIGN_OR_RETURN(std::vector<v1::BundleChunk> chunks, ChunkBundle(update, task.round()));
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::UpdateReply reply;
  auto writer = stub_->Push(&ctx, &reply);
  WriteChunks<v1::UpdateRequest>(writer.get(), std::move(chunks), [&](v1::UpdateRequest& r) {
    v1::UpdateInfo* info = r.mutable_info();
    info->set_client_id(static_cast<uint32_t>(id_));
    info->set_round(task.round());
    info->set_weight(static_cast<double>(participant_->NumExamples()));
    info->set_loss(static_cast<float>(work.loss));
    info->set_train_seconds(work.seconds);
    info->set_batch(work.batch);
    if (eval != nullptr) *info->mutable_eval() = *eval;
  });
  writer->WritesDone();
  const absl::Status s = FromGrpcStatus(writer->Finish());
  if (s.ok() && reply.verdict() != v1::UpdateReply::DROPPED) {
    ++stats_.updates_accepted;
    return absl::OkStatus();
  }
  // A refused or late update is the server's call, not the client's failure: go on.
  ++stats_.updates_refused;
  spdlog::warn("{}: update for round {} not used: {}", options_.name, task.round(),
               s.ok() ? std::string("dropped as late") : std::string(s.message()));
  if (Retryable(s)) unreachable_since_ = clock_->Now();  // rejoin before the next fetch
  return absl::OkStatus();
}

absl::StatusOr<FedClientStats> AggregatorClient::Run(const std::atomic<bool>& stop) {
  TERN_RETURN_IF_ERROR(StartFromInitialModel());
  const absl::Time started = clock_->Now();
  while (!stop.load()) {
    if (id_ < 0 || unreachable_since_ != absl::InfiniteFuture()) {
      if (absl::Status s = Join(); !s.ok()) {
        TERN_RETURN_IF_ERROR(Retry(s));
        continue;
      }
    }
    absl::StatusOr<Fetched> f = Fetch();
    if (absl::IsNotFound(f.status())) {
      id_ = -1;  // the server does not know us (a fresh server): join again
      continue;
    }
    if (!f.ok()) {
      TERN_RETURN_IF_ERROR(Retry(f.status()));
      continue;
    }
    if (f->task.kind() == v1::Task::DONE) break;
    if (f->task.kind() != v1::Task::TRAIN) continue;
    TERN_ASSIGN_OR_RETURN(bool usable, UpdateGlobal(f->task, std::move(f->payload)));
    if (!usable) continue;
    TERN_RETURN_IF_ERROR(Train(f->task));
  }
  stats_.wall_seconds = absl::ToDoubleSeconds(clock_->Now() - started);
  spdlog::info("{}: {} rounds; {:.1f} s of local work in {:.1f} s ({:.0f} % busy)", options_.name,
               stats_.rounds_trained, stats_.train_seconds, stats_.wall_seconds,
               stats_.wall_seconds > 0 ? 100 * stats_.train_seconds / stats_.wall_seconds : 0.0);
  return stats_;
}

absl::StatusOr<FedClientStats> RunAggregatorClient(const std::string& address, const TlsFiles& tls,
                                                   const AggregatorClientOptions& options,
                                                   Participant* participant,
                                                   const std::atomic<bool>& stop) {
  TERN_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                        ChannelCredentialsFor(tls));
  RealClock clock;
  AggregatorClientOptions o = options;
  if (o.server.empty()) o.server = address;
  AggregatorClient client(
      std::move(o), participant,
      v1::Aggregator::NewStub(MakeChannel(address, ChannelKind::kDefault, std::move(credentials))),
      &clock);
  return client.Run(stop);
}

}  // namespace tern

#include "clients/cpp/aggregator_client.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/chunking.h"
#include "common/status_macros.h"
#include "core/federated/protocol.h"
#include "core/model/bundle.h"
#include "core/rpc/channel.h"
#include "core/rpc/chunk_stream.h"
#include "core/rpc/status.h"
#include "spdlog/spdlog.h"

namespace tern {

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
      id_(options_.client_id) {}

absl::Status AggregatorClient::StartFromInitialModel() {
  if (model_ != nullptr) return absl::OkStatus();
  std::vector<float> x(LayoutNumel(participant_->Layout()));
  TERN_RETURN_IF_ERROR(participant_->InitialModel(absl::MakeSpan(x)));
  TERN_ASSIGN_OR_RETURN(std::unique_ptr<ClientModel> m,
                        ClientModel::Create(participant_->Layout(), std::move(x)));
  TERN_RETURN_IF_ERROR(m->SetExactTensors(participant_->ExactTensors()));
  model_ = std::move(m);
  return absl::OkStatus();
}

AggregatorClient::~AggregatorClient() = default;

absl::Span<const float> AggregatorClient::global() const {
  if (model_ == nullptr) return {};
  return model_->values();
}

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
  req.set_have_round(model_->have_round());
  req.set_have_crc32(model_->have_crc32());
  req.set_have_optimizer_state(model_->have_optimizer_state());
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
  // The first message carries the first chunk: assemble from it, then the rest.
  absl::StatusOr<v1::TensorBundle> model = ReadChunkedBundleFrom(reader.get(), std::move(first));
  TERN_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  TERN_ASSIGN_OR_RETURN(f.payload, std::move(model));
  return f;
}

absl::StatusOr<bool> AggregatorClient::UpdateGlobal(const v1::Task& task,
                                                    v1::TensorBundle payload) {
  TERN_ASSIGN_OR_RETURN(bool usable, model_->Update(task, std::move(payload)));
  if (!usable) {
    spdlog::warn("{}: round {}: {}; asking for the model", options_.name, task.round(),
                 model_->why_not());
  }
  return usable;
}

absl::Status AggregatorClient::Train(const v1::Task& task) {
  v1::Evaluation eval;
  bool evaluated = false;
  if (task.evaluate()) {
    TERN_ASSIGN_OR_RETURN(evaluated, participant_->Evaluate(model_->values(), &eval));
    // The server refuses an update with an evaluation it cannot use: keep the update.
    if (evaluated) {
      if (absl::Status s = CheckEvaluation(eval); !s.ok()) {
        spdlog::warn("{}: round {}: {}; sent without it", options_.name, task.round(),
                     std::string(s.message()));
        evaluated = false;
      }
    }
  }
  // A secure round's keys and shares go first: the masks need the neighbours' shares.
  std::optional<SecAggClient> secure;
  v1::SecAggSharesReply shares;
  if (task.has_secagg()) {
    absl::StatusOr<SecAggClient> c =
        SecAggClient::Start(task.secagg(), static_cast<uint32_t>(id_), task.round());
    TERN_RETURN_IF_ERROR(c.status());
    secure.emplace(*std::move(c));
    absl::StatusOr<v1::SecAggSharesReply> got = SecAggSetup(task, &*secure);
    if (!got.ok()) {
      // The round's secure aggregation went on without this client (a stage closed first, the
      // server restarted): the next task is another round's.
      spdlog::warn("{}: round {}: left out of secure aggregation: {}", options_.name, task.round(),
                   got.status().ToString());
      if (Retryable(got.status())) unreachable_since_ = clock_->Now();
      return absl::OkStatus();
    }
    shares = *std::move(got);
  }
  WorkContext context;
  context.client_id = id_;
  context.adam = model_->optimizer_state();
  context.encode_seed = ClientModel::EncodeSeed(task, id_);
  TERN_ASSIGN_OR_RETURN(WorkResult work, participant_->Work(task, model_->values(), context));
  v1::TensorBundle update;
  if (secure.has_value()) {
    // DP-FedAvg under secure aggregation: the clip is the client's alone to make (the server
    // never sees the update), and the noise its share of the round's (SecAggParams.noise_sd).
    absl::Span<const float> clear = work.update;
    std::vector<float> clipped;
    DpClip(task, &clear, &clipped);
    absl::StatusOr<std::string> masked = secure->Mask(shares, clear);
    if (!masked.ok()) {
      spdlog::warn("{}: round {}: cannot mask the update: {}", options_.name, task.round(),
                   masked.status().ToString());
      return absl::OkStatus();
    }
    v1::NamedTensor* t = update.add_tensors();
    t->set_name("secagg");
    t->mutable_tensor()->set_codec("secagg");
    t->mutable_tensor()->set_numel(work.update.size());
    t->mutable_tensor()->set_payload(*std::move(masked));
  } else {
    TERN_ASSIGN_OR_RETURN(
        update, model_->EncodeUpdate(task, id_, participant_->NumExamples(), work.update));
  }
  stats_.train_seconds += work.seconds;
  ++stats_.rounds_trained;
  update.set_run_id(options_.run_id);
  update.set_round(task.round());
  update.set_sender(options_.name);
  TERN_ASSIGN_OR_RETURN(bool accepted, Push(task, work, update, evaluated ? &eval : nullptr));
  if (!secure.has_value() || !accepted) return absl::OkStatus();
  if (absl::Status s = SecAggReveal(task, &*secure); !s.ok()) {
    spdlog::warn("{}: round {}: did not reveal its shares: {}", options_.name, task.round(),
                 s.ToString());
    if (Retryable(s)) unreachable_since_ = clock_->Now();
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::SecAggReply> AggregatorClient::SecAggStage(v1::SecAggRequest request) {
  request.set_client_id(static_cast<uint32_t>(id_));
  // The server holds a pending answer up to this long (a long poll, as Fetch's).
  request.set_max_wait_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.fetch_wait)));
  const absl::Time until = clock_->Now() + options_.secagg_wait;
  // Between long polls (a server that answers "not yet" at once, as an old one would), backing
  // off from secagg_poll to 8x it.
  absl::Duration poll = options_.secagg_poll;
  for (;;) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, options_.fetch_wait);
    v1::SecAggReply reply;
    TERN_RETURN_IF_ERROR(FromGrpcStatus(stub_->SecAgg(&ctx, request, &reply)));
    if (!reply.pending()) return reply;
    if (clock_->Now() >= until) {
      return absl::DeadlineExceededError(absl::StrCat(
          "round ", request.round(), "'s stage ", v1::SecAggRequest::Want_Name(request.want()),
          " did not close in ", absl::FormatDuration(options_.secagg_wait)));
    }
    request.clear_message();  // sent: from now on, only asked after
    clock_->SleepFor(poll);
    poll = std::min(poll * 2, options_.secagg_poll * 8);
  }
}

absl::StatusOr<v1::SecAggSharesReply> AggregatorClient::SecAggSetup(const v1::Task& task,
                                                                    SecAggClient* secure) {
  v1::SecAggRequest keys;
  keys.set_round(task.round());
  *keys.mutable_keys() = secure->Keys();
  keys.set_want(v1::SecAggRequest::NEIGHBOURS);
  TERN_ASSIGN_OR_RETURN(v1::SecAggReply neighbours, SecAggStage(std::move(keys)));
  TERN_ASSIGN_OR_RETURN(v1::SecAggShares mine, secure->Share(neighbours.neighbours()));
  v1::SecAggRequest shares;
  shares.set_round(task.round());
  *shares.mutable_shares() = std::move(mine);
  shares.set_want(v1::SecAggRequest::SHARES);
  TERN_ASSIGN_OR_RETURN(v1::SecAggReply theirs, SecAggStage(std::move(shares)));
  return theirs.shares();
}

absl::Status AggregatorClient::SecAggReveal(const v1::Task& task, SecAggClient* secure) {
  v1::SecAggRequest ask;
  ask.set_round(task.round());
  ask.set_want(v1::SecAggRequest::UNMASK);
  TERN_ASSIGN_OR_RETURN(v1::SecAggReply survivors, SecAggStage(std::move(ask)));
  TERN_ASSIGN_OR_RETURN(v1::SecAggReveal reveal, secure->Reveal(survivors.unmask()));
  v1::SecAggRequest send;
  send.set_round(task.round());
  *send.mutable_reveal() = std::move(reveal);
  return SecAggStage(std::move(send)).status();
}

absl::StatusOr<bool> AggregatorClient::Push(const v1::Task& task, const WorkResult& work,
                                            const v1::TensorBundle& update,
                                            const v1::Evaluation* eval) {
  TERN_ASSIGN_OR_RETURN(std::vector<v1::BundleChunk> chunks, ChunkBundle(update, task.round()));
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::UpdateReply reply;
  auto writer = stub_->Push(&ctx, &reply);
  WriteChunks<v1::UpdateRequest>(writer.get(), std::move(chunks), [&](v1::UpdateRequest& r) {
    v1::UpdateInfo* info = r.mutable_info();
    info->set_client_id(static_cast<uint32_t>(id_));
    info->set_round(task.round());
    info->set_weight(work.weight > 0 ? work.weight
                                     : static_cast<double>(participant_->NumExamples()));
    info->set_loss(static_cast<float>(work.loss));
    info->set_train_seconds(work.seconds);
    info->set_batch(work.batch);
    if (eval != nullptr) *info->mutable_eval() = *eval;
  });
  writer->WritesDone();
  const absl::Status s = FromGrpcStatus(writer->Finish());
  const bool accepted = s.ok() && reply.verdict() != v1::UpdateReply::DROPPED;
  if (options_.on_traffic) options_.on_traffic(update.ByteSizeLong(), 0, accepted);
  if (accepted) {
    ++stats_.updates_accepted;
    return true;
  }
  // A refused or late update is the server's call, not the client's failure: go on.
  ++stats_.updates_refused;
  spdlog::warn("{}: update for round {} not used: {}", options_.name, task.round(),
               s.ok() ? std::string("dropped as late") : std::string(s.message()));
  if (Retryable(s)) unreachable_since_ = clock_->Now();  // rejoin before the next fetch
  return false;
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
    if (options_.on_traffic) options_.on_traffic(0, f->payload.ByteSizeLong(), false);
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

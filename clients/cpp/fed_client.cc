#include "clients/cpp/fed_client.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "core/rpc/channel.h"
#include "core/workload/partition.h"

namespace tern {

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

// The built-in model on partition options.index, trained as each task's LocalWork says.
class FedClient::BuiltinParticipant final : public Participant {
 public:
  BuiltinParticipant(const FedClientOptions& options, const FedClientData* shared, Clock* clock)
      : options_(options),
        clock_(clock),
        shared_(*shared),
        part_(options.index >= 0 && static_cast<size_t>(options.index) < shared->parts.size()
                  ? &shared->parts[static_cast<size_t>(options.index)]
                  : nullptr),
        name_(options.name.empty() ? absl::StrCat("client-", options.index) : options.name) {}

  const std::string& name() const { return name_; }
  absl::Status CheckPartition() const {
    if (part_ != nullptr) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("client index ", options_.index, " outside the ",
                                                   shared_.parts.size(), " partitions"));
  }

  const std::vector<ParamTensor>& Layout() const override { return shared_.model->Layout(); }
  absl::Status InitialModel(absl::Span<float> x) override {
    shared_.model->Init(options_.seed, x);
    return absl::OkStatus();
  }
  uint64_t NumExamples() const override { return part_ == nullptr ? 0 : part_->size(); }

  absl::StatusOr<WorkResult> Work(const v1::Task& task, const std::vector<float>& global,
                                  const WorkContext& context) override {
    if (work_ == nullptr || !work_->Serves(task)) {
      TERN_ASSIGN_OR_RETURN(
          work_, NewLocalWork(task, {shared_.model.get(), &shared_.data.train, part_}, name_));
    }
    const uint64_t data_seed = options_.seed * 1000003 +
                               static_cast<uint64_t>(options_.index) * 7919 + task.round() +
                               (static_cast<uint64_t>(task.attempt()) << 40);
    TERN_ASSIGN_OR_RETURN(WorkResult work, work_->Run(task, global, data_seed, context.adam));
    ApplyAttack(options_.attack, context.encode_seed, absl::MakeSpan(work.update));
    if (options_.delay > absl::ZeroDuration()) clock_->SleepFor(options_.delay);
    return work;
  }

  // On this client's share of the test set: every (number of partitions)-th example from its
  // index, the held-out data of a simulated client.
  absl::StatusOr<bool> Evaluate(const std::vector<float>& global, v1::Evaluation* eval) override {
    const Dataset& test = shared_.data.test;
    const size_t n = std::max<size_t>(1, shared_.parts.size());
    if (test_y_.empty()) {
      for (size_t i = static_cast<size_t>(options_.index); i < test.size(); i += n) {
        test_x_.insert(test_x_.end(), test.row(i), test.row(i) + test.dim);
        test_y_.push_back(test.labels[i]);
      }
    }
    if (test_y_.empty()) return false;
    const EvalResult r =
        shared_.model->Evaluate(global, test_x_.data(), test_y_.data(), test_y_.size());
    eval->set_examples(static_cast<double>(test_y_.size()));
    eval->set_loss(r.loss);
    eval->set_accuracy(r.accuracy);
    return true;
  }

 private:
  const FedClientOptions options_;
  Clock* const clock_;
  const FedClientData& shared_;
  const std::vector<uint32_t>* const part_;  // null when options.index has no partition
  const std::string name_;
  std::unique_ptr<LocalWork> work_;  // the task's kind of work, with its state
  std::vector<float> test_x_;        // this client's test examples, copied once
  std::vector<uint8_t> test_y_;
};

namespace {

AggregatorClientOptions ClientOptions(const FedClientOptions& o, const std::string& name) {
  AggregatorClientOptions c;
  c.run_id = o.run_id;
  c.name = name;
  c.server = o.server;
  c.call_timeout = o.call_timeout;
  c.fetch_wait = o.fetch_wait;
  c.give_up_after = o.give_up_after;
  return c;
}

}  // namespace

FedClient::FedClient(FedClientOptions options, const FedClientData* shared,
                     std::unique_ptr<v1::Aggregator::StubInterface> stub, Clock* clock)
    : participant_(std::make_unique<BuiltinParticipant>(options, shared, clock)),
      client_(ClientOptions(options, participant_->name()), participant_.get(), std::move(stub),
              clock) {}

FedClient::~FedClient() = default;

absl::StatusOr<FedClientStats> FedClient::Run(const std::atomic<bool>& stop) {
  TERN_RETURN_IF_ERROR(participant_->CheckPartition());
  return client_.Run(stop);
}

absl::StatusOr<FedClientStats> RunFederatedClient(const std::shared_ptr<grpc::Channel>& channel,
                                                  const FedClientOptions& options,
                                                  const FedClientData& shared,
                                                  const std::atomic<bool>& stop) {
  RealClock clock;
  FedClient client(options, &shared, v1::Aggregator::NewStub(channel), &clock);
  return client.Run(stop);
}

absl::StatusOr<absl::Duration> ClientDelay(absl::string_view spec, int index, int clients) {
  if (spec.empty()) return absl::ZeroDuration();
  const std::vector<absl::string_view> parts = absl::StrSplit(spec, ':');
  double lo = 0, hi = 0;
  const bool ok = parts.size() <= 2 && absl::SimpleAtod(parts[0], &lo) &&
                  absl::SimpleAtod(parts.back(), &hi) && lo >= 0 && hi >= 0 && lo <= 3600 &&
                  hi <= 3600;
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("--client_delay_s=", spec,
                     ": seconds S, or LO:HI spread over the clients, each in [0, 3600]"));
  }
  const double at = clients > 1 ? static_cast<double>(index) / (clients - 1) : 0.0;
  return absl::Seconds(lo + (hi - lo) * at);
}

}  // namespace tern

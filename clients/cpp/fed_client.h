// The built-in client of an aggregator (`tern client`): joins, sends the initial model when the
// server has none, then loops Fetch -> the task's local work on its data partition
// (clients/cpp/local_work.h) -> Push of the encoded update (with the codec and memory the task
// names) until the server says DONE. It keeps its copy of the global model in step with the
// server's (delta catch-up, checked by CRC), rejoins a server that forgot it, and retries a
// server it cannot reach, backing off, until options.give_up_after. One process can host many
// simulated clients, one thread each, over one shared copy of the data.
//
// Thread-safety: a FedClient belongs to the thread that calls Run (which blocks it); `stop` may
// be set from any thread; FedClientData is immutable and shared.
#ifndef TERN_CLIENTS_CPP_FED_CLIENT_H_
#define TERN_CLIENTS_CPP_FED_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "clients/cpp/attack.h"
#include "clients/cpp/local_work.h"
#include "common/clock.h"
#include "core/model/adam.h"
#include "core/workload/builtin_model.h"
#include "core/workload/dataset.h"
#include "grpcpp/grpcpp.h"
#include "kernels/dgc_memory.h"
#include "kernels/registry.h"
#include "tern/v1/server.grpc.pb.h"
#include "tern/v1/server.pb.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

// The data and model every simulated client of a process shares.
struct FedClientData {
  TrainTest data;
  std::vector<std::vector<uint32_t>> parts;  // example indices per partition
  std::unique_ptr<Model> model;
};

// Loads the training data, splits it into `num_partitions` (partition spec as in
// core/workload/partition.h) and builds the model.
absl::StatusOr<std::unique_ptr<FedClientData>> LoadFedClientData(const std::string& data_dir,
                                                                 const std::string& partition,
                                                                 int num_partitions,
                                                                 const std::string& model,
                                                                 uint64_t seed);

struct FedClientOptions {
  std::string run_id = "tern";
  std::string name;    // default "client-<index>"
  std::string server;  // the aggregator's address, for messages
  int index = 0;       // the data partition this client trains on
  uint64_t seed = 1;   // initial model (same on every client) and data order
  absl::Duration call_timeout = absl::Seconds(60);
  // How long the server may hold a Fetch open when there is no task.
  absl::Duration fetch_wait = absl::Seconds(5);
  // Give up after the server has been unreachable this long.
  absl::Duration give_up_after = absl::Minutes(5);
  // An experiment's malicious client: its honest update replaced before encoding (attack.h).
  Attack attack;
};

class UpdateEncoder;

struct FedClientStats {
  int64_t rounds_trained = 0;
  int64_t updates_accepted = 0;
  int64_t updates_refused = 0;
  double train_seconds = 0;  // local work (in the background with Overlap-Local-SGD)
  double wall_seconds = 0;
};

class FedClient {
 public:
  // `shared` and `clock` must outlive the client. The clock times back-off and giving up; gRPC
  // deadlines (options.call_timeout) are on the system clock.
  FedClient(FedClientOptions options, const FedClientData* shared,
            std::unique_ptr<v1::Aggregator::StubInterface> stub, Clock* clock);
  ~FedClient();

  // Runs until the server says DONE (OK), `stop` is set (OK), or an error that retrying cannot
  // mend: a refusal other than UNAVAILABLE / DEADLINE_EXCEEDED, or the server unreachable for
  // longer than options.give_up_after.
  absl::StatusOr<FedClientStats> Run(const std::atomic<bool>& stop);

 private:
  struct Fetched {
    v1::Task task;
    v1::TensorBundle payload;  // TRAIN only
  };

  // One attempt each; a gRPC failure comes back as its status (see Retry).
  absl::Status Join();
  absl::Status SendInitialModel();
  absl::StatusOr<Fetched> Fetch();
  // Brings the copy of the global model to the task's round from its payload; false when the
  // copy cannot be trusted (a CRC mismatch, a gap in the updates): the model is asked for next.
  absl::StatusOr<bool> UpdateGlobal(const v1::Task& task, v1::TensorBundle payload);
  absl::Status Train(const v1::Task& task);
  absl::Status Push(const v1::Task& task, const WorkResult& work, const v1::TensorBundle& update);
  // After a failed call: OK once it is worth trying again (having backed off), else the error
  // to give up with.
  absl::Status Retry(const absl::Status& s);
  void SetDeadline(grpc::ClientContext* ctx, absl::Duration extra = absl::ZeroDuration()) const;

  const FedClientOptions options_;
  const FedClientData& shared_;
  const std::vector<uint32_t>* const part_;  // null when options.index has no partition
  const std::string name_;
  const std::unique_ptr<v1::Aggregator::StubInterface> stub_;
  Clock* const clock_;
  const std::unique_ptr<CodecRegistry> codecs_;
  FedClientStats stats_;
  int64_t id_ = -1;
  std::unique_ptr<UpdateEncoder> encoder_;  // error feedback / DGC memory between rounds
  std::unique_ptr<LocalWork> work_;         // the task's kind of work, with its state
  AdamState adam_;                          // 1-bit Adam / LAMB: momentum, frozen variance
  bool have_adam_ = false;
  // The global model as of have_round_ (-1: not known to be exact) and its CRC-32.
  std::vector<float> global_;
  int64_t have_round_ = 0;
  uint32_t have_crc_ = 0;
  absl::Time unreachable_since_ = absl::InfiniteFuture();
  absl::Time last_said_ = absl::InfinitePast();
};

// A FedClient over `channel` on the system clock.
absl::StatusOr<FedClientStats> RunFederatedClient(const std::shared_ptr<grpc::Channel>& channel,
                                                  const FedClientOptions& options,
                                                  const FedClientData& shared,
                                                  const std::atomic<bool>& stop);

}  // namespace tern

#endif  // TERN_CLIENTS_CPP_FED_CLIENT_H_

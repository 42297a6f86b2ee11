// The built-in client of an aggregator (`tern client`): the C++ client library's
// AggregatorClient (aggregator_client.h: join, fetch, delta catch-up, encode, push, retries)
// with the built-in model as its Participant, whose work is the task's local work on its data
// partition (clients/cpp/local_work.h). One process can host many simulated clients, one thread
// each, over one shared copy of the data.
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
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "clients/cpp/aggregator_client.h"
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
  // An experiment's slower device: waits this long (on the client's clock) after each task's
  // work, before its update goes.
  absl::Duration delay = absl::ZeroDuration();
};

// `--client_delay_s`: "" (none), "S" seconds for every client, or "LO:HI" spread evenly over the
// clients by partition index (client i of n waits LO + (HI - LO) * i / (n - 1) seconds).
// InvalidArgument for anything else, a negative or one over an hour.
absl::StatusOr<absl::Duration> ClientDelay(absl::string_view spec, int index, int clients);

// `tern client`: an AggregatorClient whose participant is the built-in model on one partition.
class FedClient {
 public:
  // `shared` and `clock` must outlive the client.
  FedClient(FedClientOptions options, const FedClientData* shared,
            std::unique_ptr<v1::Aggregator::StubInterface> stub, Clock* clock);
  ~FedClient();

  // AggregatorClient::Run; InvalidArgument when options.index names no partition.
  absl::StatusOr<FedClientStats> Run(const std::atomic<bool>& stop);

 private:
  class BuiltinParticipant;
  const std::unique_ptr<BuiltinParticipant> participant_;
  AggregatorClient client_;
};

// A FedClient over `channel` on the system clock.
absl::StatusOr<FedClientStats> RunFederatedClient(const std::shared_ptr<grpc::Channel>& channel,
                                                  const FedClientOptions& options,
                                                  const FedClientData& shared,
                                                  const std::atomic<bool>& stop);

}  // namespace tern

#endif  // TERN_CLIENTS_CPP_FED_CLIENT_H_

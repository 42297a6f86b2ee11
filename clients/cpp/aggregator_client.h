// tern's C++ client of an aggregator (`tern server`), for your own model: the protocol side of
// federated, local-SGD and parameter-server rounds. You supply a Participant (the model's layout,
// its initial values, one round's local work); AggregatorClient joins, sends the initial model
// when the server has none, long-polls for tasks, keeps its copy of the global model in step
// with the server's (delta catch-up checked by CRC, the model asked for again when a check
// fails), encodes each update with the codec and memory the task names (error feedback, DGC,
// PowerSGD's per-tensor state), pushes it, rejoins a server that forgot it, and retries an
// unreachable server with back-off until options.give_up_after. `tern client` is this class
// with the built-in model as its Participant (fed_client.h). docs/cpp-client.md shows a
// complete program.
//
// Thread-safety: an AggregatorClient belongs to the thread that calls Run (which blocks it);
// `stop` may be set from any thread. The Participant is called from that thread only.
#ifndef TERN_CLIENTS_CPP_AGGREGATOR_CLIENT_H_
#define TERN_CLIENTS_CPP_AGGREGATOR_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "core/federated/client_model.h"
#include "core/federated/secagg.h"
#include "core/model/adam.h"
#include "core/model/layout.h"
#include "core/rpc/security.h"
#include "grpcpp/grpcpp.h"
#include "kernels/registry.h"
#include "tern/v1/server.grpc.pb.h"
#include "tern/v1/server.pb.h"

namespace tern {

// One round's work, in the model's layout order.
struct WorkResult {
  // federated / local-sgd: the change the local steps made (new - global); ps: the gradient.
  std::vector<float> update;
  double loss = 0;     // mean minibatch loss
  double seconds = 0;  // time of the local work
  uint32_t batch = 0;  // the minibatch size used (reported to the server)
  // The update's weight in the server's mean; 0: NumExamples(). An edge aggregator's varies
  // with the clients whose updates its rounds accepted.
  double weight = 0;
};

// What the client knows about the round when it asks for its work.
struct WorkContext {
  int64_t client_id = -1;
  // 1-bit Adam / LAMB runs: the optimizer state the server sent (null otherwise).
  const AdamState* adam = nullptr;
  // The seed the update will be encoded with (stochastic codecs); deterministic per round.
  uint64_t encode_seed = 0;
};

// Your side of the rounds. Called from Run's thread only.
class Participant {
 public:
  virtual ~Participant() = default;
  // The model's tensors: names, shapes and offsets into one flat fp32 vector. Must not change.
  virtual const std::vector<ParamTensor>& Layout() const = 0;
  // Fills `x` (Layout's size) with the initial model: the run's starting point when the server
  // has none yet. Every participant of a run should give the same values.
  virtual absl::Status InitialModel(absl::Span<float> x) = 0;
  // One flag per Layout tensor, true for state training sets rather than descends (BatchNorm's
  // running statistics): its change goes exactly, outside the task's codec and error feedback,
  // which would overshoot a pull towards a target. Empty (the default): none.
  virtual std::vector<bool> ExactTensors() const { return {}; }
  // Examples this participant trains on: its weight in the server's averages.
  virtual uint64_t NumExamples() const = 0;
  // The work of `task` from the round's global model: task.local() (federated, local-sgd: the
  // local steps; the update is the change they made) or task.gradient() (ps: one minibatch's
  // gradient at `global`).
  virtual absl::StatusOr<WorkResult> Work(const v1::Task& task, const std::vector<float>& global,
                                          const WorkContext& context) = 0;
  // Federated evaluation (Task.evaluate, tern server --eval_every): the round's model `global`
  // on this participant's held-out data, before Work trains from it. Returns false when there
  // is nothing to evaluate on (the default); the report goes with the round's update.
  virtual absl::StatusOr<bool> Evaluate(const std::vector<float>& global, v1::Evaluation* eval) {
    return false;
  }
};

struct AggregatorClientOptions {
  std::string run_id = "tern";
  std::string name = "client";  // how the server's log names this client
  std::string server;           // the aggregator's address, for messages
  absl::Duration call_timeout = absl::Seconds(60);
  // How long the server may hold a Fetch open when there is no task.
  absl::Duration fetch_wait = absl::Seconds(5);
  // Give up after the server has been unreachable this long.
  absl::Duration give_up_after = absl::Minutes(5);
  // An id this participant had at the server, asked back at the first join (an edge aggregator
  // restarted mid-task: the parent's round counts on that id); -1: a new one.
  int64_t client_id = -1;
  // Called (on Run's thread, after each call) with the serialized bytes of each update pushed
  // and model received, and whether the update was accepted.
  std::function<void(uint64_t bytes_up, uint64_t bytes_down, bool accepted)> on_traffic;
  // Secure aggregation: how long a stage's answer is waited for (the unmasking waits for the
  // round's other clients, up to the round's deadline), and how often it is asked.
  absl::Duration secagg_wait = absl::Minutes(10);
  absl::Duration secagg_poll = absl::Milliseconds(20);
};

struct FedClientStats {
  int64_t rounds_trained = 0;
  int64_t updates_accepted = 0;
  int64_t updates_refused = 0;
  double train_seconds = 0;  // the participant's work
  double wall_seconds = 0;
};

class AggregatorClient {
 public:
  // `participant` and `clock` must outlive the client. The clock times back-off and giving up;
  // gRPC deadlines (options.call_timeout) are on the system clock.
  AggregatorClient(AggregatorClientOptions options, Participant* participant,
                   std::unique_ptr<v1::Aggregator::StubInterface> stub, Clock* clock);
  ~AggregatorClient();

  // Runs until the server says DONE (OK), `stop` is set (OK), or an error that retrying cannot
  // mend: a refusal other than UNAVAILABLE / DEADLINE_EXCEEDED, a participant's error, or the
  // server unreachable for longer than options.give_up_after.
  absl::StatusOr<FedClientStats> Run(const std::atomic<bool>& stop);

  // The client's copy of the global model (the last round it trained from), in Layout order;
  // empty before Run.
  absl::Span<const float> global() const;

 private:
  struct Fetched {
    v1::Task task;
    v1::TensorBundle payload;  // TRAIN only
  };

  // global_ := the participant's initial model, once.
  absl::Status StartFromInitialModel();
  // One attempt each; a gRPC failure comes back as its status (see Retry).
  absl::Status Join();
  absl::Status SendInitialModel();
  absl::StatusOr<Fetched> Fetch();
  // Brings the copy of the global model to the task's round from its payload; false when the
  // copy cannot be trusted (a CRC mismatch, a gap in the updates): the model is asked for next.
  absl::StatusOr<bool> UpdateGlobal(const v1::Task& task, v1::TensorBundle payload);
  absl::Status Train(const v1::Task& task);
  // Whether the server took the update (a refusal is its call, not the client's failure).
  absl::StatusOr<bool> Push(const v1::Task& task, const WorkResult& work,
                            const v1::TensorBundle& update, const v1::Evaluation* eval);
  // A securely aggregated round (Task.secagg, docs/server.md "Secure aggregation"): one
  // stage's message, then its answer polled until the stage closes (options.secagg_wait).
  absl::StatusOr<v1::SecAggReply> SecAggStage(v1::SecAggRequest request);
  // The keys and shares stages: the shares addressed to this client, or why the round goes on
  // without it.
  absl::StatusOr<v1::SecAggSharesReply> SecAggSetup(const v1::Task& task, SecAggClient* secure);
  // After the masked update was taken: the reveal stage.
  absl::Status SecAggReveal(const v1::Task& task, SecAggClient* secure);
  // After a failed call: OK once it is worth trying again (having backed off), else the error
  // to give up with.
  absl::Status Retry(const absl::Status& s);
  void SetDeadline(grpc::ClientContext* ctx, absl::Duration extra = absl::ZeroDuration()) const;

  const AggregatorClientOptions options_;
  Participant* const participant_;
  const std::unique_ptr<v1::Aggregator::StubInterface> stub_;
  Clock* const clock_;
  FedClientStats stats_;
  int64_t id_ = -1;
  // The copy of the global model and the update codec's memory; made by Run.
  std::unique_ptr<ClientModel> model_;
  absl::Time unreachable_since_ = absl::InfiniteFuture();
  absl::Time last_said_ = absl::InfinitePast();
};

// Runs `participant` against the aggregator at `address` (TLS and tokens as `tls` says, the
// daemons' --tls_* flags) on the system clock until the run is over or `stop` is set.
absl::StatusOr<FedClientStats> RunAggregatorClient(const std::string& address, const TlsFiles& tls,
                                                   const AggregatorClientOptions& options,
                                                   Participant* participant,
                                                   const std::atomic<bool>& stop);

}  // namespace tern

#endif  // TERN_CLIENTS_CPP_AGGREGATOR_CLIENT_H_

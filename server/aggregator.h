// The aggregator's state machine, independent of gRPC and of the clock: clients join and fetch
// tasks, rounds open over the available clients (server/rounds.h: synchronous rounds, or FedBuff's
// buffered versions), updates are checked and decoded
// into the round's sum as they arrive, and a round's close applies the aggregate to the global
// model (with optional server learning rate and outer momentum: FedAvg, local SGD, SlowMo).
// Its rooms: the clients (client_book.h), the published models (model_history.h), and the
// durable state (state_store.h): a snapshot, written atomically when the model arrives and
// whenever a round opens or closes, and an update log (server/update_log.h) that every accepted
// update is appended to before it is acknowledged, so a restarted server resumes the round it
// was in without losing an update it acknowledged. server/service.h puts it behind
// tern.v1.Aggregator.
//
// Thread-safety: thread-safe. Every public method takes the internal mutex briefly; a Push
// decodes, checks and accumulates its update and appends it to the log outside it, so pushes
// from many clients proceed in parallel. Snapshots are written outside it, in order.
#ifndef TERN_SERVER_AGGREGATOR_H_
#define TERN_SERVER_AGGREGATOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/model/layout.h"
#include "core/model/lr_schedule.h"
#include "core/model/norm_guard.h"
#include "core/model/outer.h"
#include "kernels/registry.h"
#include "server/accumulator.h"
#include "server/aggregation.h"
#include "server/client_book.h"
#include "server/downstream.h"
#include "server/edge.h"
#include "server/model_history.h"
#include "server/privacy.h"
#include "server/rounds.h"
#include "server/secure_rounds.h"
#include "server/server_step.h"
#include "server/state_store.h"
#include "tern/internal/checkpoint.pb.h"
#include "tern/v1/server.pb.h"

namespace tern {

struct AggregatorOptions {
  std::string run_id = "tern";
  // "federated": K of the available clients per round. "local-sgd": every available client,
  // each round closing when all replied (or at the deadline). "ps": local-sgd with one local
  // step a round (a synchronous parameter server). "fedbuff": no rounds; up to
  // policy.concurrency clients train at once and every policy.buffer updates, each scaled by
  // its staleness, make one server step (server/buffered_rounds.h).
  std::string mode = "federated";
  // > 0: an edge aggregator (tern server --parent, server/edge.h): one client of a parent
  // aggregator, whose rounds open only for a parent task (Rebase), this many to a task;
  // total_rounds is the parent's then. federated or local-sgd, model downstream.
  int edge_rounds = 0;
  int min_clients = 1;  // the first round waits until this many clients are available
  int64_t total_rounds = 50;
  RoundPolicy policy;  // K, min replies, grace, deadline, staleness, sampling
  // fedbuff: s(tau), parsed into policy.staleness (server/rounds.h: poly:a=A, hinge, const).
  std::string staleness = "poly:a=0.5";
  std::string rule = "fedavg";   // aggregation rule spec (server/aggregation.h)
  double server_lr = 1.0;        // x += server_lr * m
  double server_momentum = 0.0;  // m = momentum * m + mean update (0: plain averaging)
  // The outer optimizer's spec (core/model/outer.h: average, heavy-ball, nesterov, sparseloco)
  // for federated and local-sgd runs; "" is heavy-ball with server_lr and server_momentum, which
  // must then be left at their defaults. One whose senders decay their residual (sparseloco)
  // turns the clients' error feedback on (Task.residual_decay).
  std::string outer;
  // Downstream: "model" sends the global model (encoded with downstream_codec) each round;
  // "delta" (STC federated) sends each round's global update encoded with downstream_codec and
  // a server residual, and a client that missed rounds catches up from the kept updates, or gets
  // the exact model when that is cheaper.
  std::string downstream = "model";
  std::string downstream_codec = "none";
  int keep_deltas = 2000;  // downstream updates kept for catch-up
  // ps mode's optimizer is task.gradient().optimizer (core/model/adam.h): "sgd" (with
  // server_momentum), "adam" / "lamb", or "onebit-adam" / "onebit-lamb" (dense for the warm-up
  // rounds, then the clients' momenta encoded with task.update_codec both ways, "sign" when that
  // is "none").
  float beta2 = 0.999f;
  // The learning rate round by round (core/model/lr_schedule.h: constant, cosine[:min=M],
  // step:every=N[,gamma=G], each with [,warmup=W]), over total_rounds from the task's rate:
  // ps: the server's step (lr of sgd, adam, lamb); federated, local-sgd and fedbuff: the
  // clients' local rate (Task.local.lr of each round's task).
  std::string lr_schedule = "constant";
  // Settings handed to clients (kind, round, total_rounds filled in). Its work matches the
  // mode: task.gradient for ps, task.local for federated and local-sgd.
  v1::Task task;
  absl::Duration client_timeout = absl::Seconds(30);  // no Fetch for this long: not available
  // A client that left, or has been silent this long, is forgotten when the next round opens
  // (it joins again as a new client if it comes back).
  absl::Duration forget_clients_after = absl::Hours(1);
  std::string checkpoint_path;  // "" = no checkpoint
  // A damaged checkpoint (or one missing its snapshot or its log) is an error at start; with
  // this, its files are moved aside and a new run starts.
  bool fresh_start_if_damaged = false;
  uint64_t max_params = uint64_t{1} << 28;
  int keep_models = 8;  // global models kept for GetModel
  // Federated evaluation: every eval_every-th round (and the last) asks its clients to
  // evaluate the model they train from (Task.evaluate); the round's close sets the
  // examples-weighted mean in the status (eval_*). 0: never.
  int eval_every = 0;
  // Refuses an update whose L2 norm is over factor × the median of the last accepted ones
  // (after 3 were accepted); factor 0 turns it off. One blown-up client cannot wreck FedAvg.
  NormGuardOptions norm_guard{.factor = 10, .window = 32, .min_samples = 3, .flag = "--norm_guard"};
  // DP-FedAvg (server/privacy.h): dp.clip > 0 turns it on (federated or local-sgd, fedavg,
  // no client memory): clients clip to it, updates over it are refused, each is weighted 1,
  // and the round's sum gets Gaussian noise before the mean over the sampled clients.
  DpOptions dp;
  // SecAgg+ (server/secure_rounds.h): secagg.enabled turns it on (federated or local-sgd,
  // fedavg, codec none, no client memory, no DP): each round's sampled clients mask their
  // updates and the server learns only their unweighted mean.
  SecAggOptions secagg;
};

// Checks options and fills mode presets (K and min replies for local-sgd / ps).
absl::StatusOr<AggregatorOptions> NormalizeAggregatorOptions(AggregatorOptions options,
                                                             const CodecRegistry& codecs);

struct FetchResult {
  v1::Task task;
  // For TRAIN: the round's model, chunked once per round and shared by every client's call.
  std::shared_ptr<const std::vector<v1::BundleChunk>> chunks;
};

// The registries an aggregator builds its codecs, aggregation rule and outer optimizer from,
// created once by the caller (tern server, tests) and passed in.
struct ServerRegistries {
  std::unique_ptr<CodecRegistry> codecs;
  std::unique_ptr<AggregationRuleRegistry> rules;
  std::unique_ptr<OuterOptimizerRegistry> outer;
};
ServerRegistries NewBuiltinServerRegistries();

class Aggregator {
 public:
  // Resumes from options.checkpoint_path when that file exists (a corrupt or foreign checkpoint
  // is an error, never silently replaced). `registries` must outlive the aggregator.
  static absl::StatusOr<std::unique_ptr<Aggregator>> Create(AggregatorOptions options,
                                                            const ServerRegistries* registries,
                                                            absl::Time now);

  // `principal`: who the call was authenticated as (core/rpc/auth.h); the client id is bound to
  // it, and taking an id back (request.client_id) is refused to anyone else.
  v1::JoinReply Join(const v1::JoinRequest& request, absl::Time now, absl::Status* status,
                     const std::string& principal = "");
  // OK when `client` joined as `principal`: PERMISSION_DENIED when someone else did, NOT_FOUND
  // when nobody did. The services call it before acting in a client's name.
  absl::Status CheckCaller(uint32_t client, const std::string& principal) const;
  // The initial model; returns whether this bundle was adopted.
  absl::StatusOr<bool> InitModel(uint32_t client, const v1::TensorBundle& bundle);
  // `have_round` / `have_crc32`: the model the client holds (FetchRequest); -1 for none.
  // `have_state`: the client holds the 1-bit optimizer state that goes with that model.
  absl::StatusOr<FetchResult> Fetch(uint32_t client, absl::Time now, int64_t have_round = -1,
                                    uint32_t have_crc32 = 0, bool have_state = false);
  // An update: checked (client, round, layout, every tensor decodes), accumulated and logged
  // before the reply; a refused update changes nothing. `wire_bytes`: what its chunks took.
  absl::StatusOr<v1::UpdateReply> Push(const v1::UpdateInfo& info, const v1::TensorBundle& update,
                                       uint64_t wire_bytes, absl::Time now);
  absl::Status Leave(uint32_t client);
  // Secure aggregation's stage messages and polls (Aggregator.SecAgg); FailedPrecondition in a
  // run without it. The caller ticks after a message, so that the last one closes its stage.
  absl::StatusOr<v1::SecAggReply> SecAgg(const v1::SecAggRequest& request, absl::Time now);
  // Closes a round that is due and opens the next when clients are there; call periodically.
  // Returns the error of a failed checkpoint write (the state in memory goes on).
  absl::Status Tick(absl::Time now);

  // The global model after `round` (0 = latest), kept for the last keep_models rounds, with
  // the counters as they were when that round closed.
  using KeptModel = tern::KeptModel;
  absl::StatusOr<KeptModel> Model(int64_t round) const;
  v1::ServerStatus Status(absl::Time now) const;
  // The counters alone (clients_alive as of the last round opened): O(1) in the clients.
  v1::ServerStatus Counters() const;
  bool done() const;
  // Refused updates by reason (the status code's name, e.g. "FAILED_PRECONDITION").
  std::map<std::string, uint64_t> RefusalsByReason() const;
  // When the checkpoint was last written (InfinitePast: never).
  absl::Time LastCheckpoint() const;
  // Counts the events a waiting Fetch (or SecAgg poll) may be waiting for: the model published
  // (the initial one or a round's close, which may end the run), a round opened, a secure
  // round's stage closed.
  uint64_t events() const;
  // The clients whose waiting Fetch may have another answer after an event (the open round's
  // sample; nullopt: every client).
  std::optional<std::vector<int>> ClientsToWake() const;
  // The layout, once a model is known.
  std::vector<ParamTensor> layout() const;
  // The model as it is now (empty before there is one): an edge's initial model for its parent.
  std::vector<float> model() const;

  // An edge aggregator's side of its parent (options.edge_rounds > 0; FailedPrecondition on
  // another). Rebase takes a parent task: `global`, the parent's model after `parent_round`,
  // becomes the model the edge's next edge_rounds rounds train from (published at once, and
  // made durable before it returns); a round still open, trained from an older parent model, is
  // closed unused and its updates counted dropped. The edge's clients train at `parent_lr`, the
  // parent task's local rate (the parent's --lr_schedule reaches them); 0: the edge's own.
  absl::Status Rebase(int64_t parent_round, int64_t parent_client, uint64_t parent_total_rounds,
                      absl::Span<const float> global, float parent_lr = 0);
  struct EdgeProgress {
    bool active = false;  // a parent task was taken (and not a stale one)
    int64_t parent_round = -1;
    int64_t parent_client = -1;  // the edge's id at the parent, as of the last task
    uint32_t base_crc = 0;       // CRC-32 of the parent model the task started from
    bool ready = false;          // the task's rounds closed with updates in them
    // With `with_update` when ready: the edge's model minus the base, the accepted updates'
    // total weight, their mean loss and minibatch.
    std::vector<float> update;
    double weight = 0;
    double loss = 0;
    double batch = 0;
  };
  EdgeProgress Edge(bool with_update) const;
  // The edge's traffic with its parent: bytes up (its updates) and down (the parent's models),
  // and whether an update was accepted (ServerStatus.parent_*).
  void CountParentTraffic(uint64_t bytes_up, uint64_t bytes_down, bool accepted);
  // The parent said the run is over: it is over here too (clients hear DONE).
  absl::Status Finish();
  // The largest serialized update a client may stream: twice the model as fp32 plus 1 MiB
  // (no codec's update is larger than raw fp32), or 1 MiB before there is a model.
  uint64_t MaxUpdateBytes() const;

 private:
  // `outer`: null in runs whose server step is Adam's.
  Aggregator(AggregatorOptions options, const CodecRegistry* codecs,
             std::unique_ptr<AggregationRule> rule, std::unique_ptr<OuterOptimizer> outer);
  // The aggregator `options` (normalized) describe, before any checkpoint is read.
  static absl::StatusOr<std::unique_ptr<Aggregator>> Build(AggregatorOptions options,
                                                           const ServerRegistries& registries);

  absl::Status Restore(const internal::AggregatorCheckpoint& ckpt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AdoptModel(const v1::TensorBundle& bundle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes model_ as the global model after `round`.
  void PublishModel(int64_t round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<ChunkedPayload> DownstreamChunks(int64_t from) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The round a client holding (have_round, have_crc32) catches up from, or -1 for the model.
  int64_t CatchUpFrom(int64_t have_round, uint32_t have_crc32, bool have_state) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `secure`: a securely aggregated round's result, which replaces the accumulator's.
  absl::Status CloseRound(absl::Time now, const SecAggServerRound::Result* secure = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tick's part for secure aggregation: moves the open round's stages on and closes the round
  // when they end (or at once when its state is gone: a restarted server). Whether it closed it.
  absl::StatusOr<bool> TickSecure(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Push's path for a masked update (secure aggregation).
  absl::StatusOr<v1::UpdateReply> PushMasked(const v1::UpdateInfo& info,
                                             const v1::TensorBundle& update, uint64_t wire_bytes,
                                             absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DP-FedAvg: ends the run (done, with the reason) when the next round, sampling at rate `q`
  // (Rounds::NextRoundClients over those available), would take epsilon past the budget;
  // returns whether it did.
  bool StopForBudget(double q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes the round just opened's deadline (status, metric) and logs a learned one's move.
  void NoteDeadline() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Push's first look, before decoding: the client, the model, the run, the round, the weight.
  absl::Status Admit(const v1::UpdateInfo& info, const v1::TensorBundle& update, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Push's verdict on a decoded update of L2 norm `norm`: the norm guard, the round's rules,
  // the counters. When it is to be accumulated, reserves its place in accumulator_ and fills
  // `record` (all but the update itself) for the log.
  absl::StatusOr<v1::UpdateReply> Decide(const v1::UpdateInfo& info, const v1::TensorBundle& update,
                                         uint64_t wire_bytes, double norm, absl::Time now,
                                         internal::LoggedUpdate* record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes back what Decide counted of an update the log could not take (`why`), and returns the
  // error the client hears.
  absl::Status Unlogged(const v1::UpdateInfo& info, const internal::LoggedUpdate& record,
                        const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  // Accumulates and counts a logged update again (restore).
  // Tells the downstream which tensors `update` sent exactly in a run whose update codec is
  // lossy (see the .cc).
  void NoteExactTensors(const v1::TensorBundle& update) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Replay(const internal::LoggedUpdate& u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Restores the snapshot at options_.checkpoint_path and the log beside it, if any.
  absl::Status Resume(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether round `round`'s clients are asked to evaluate (options_.eval_every).
  bool Evaluates(int64_t round) const;
  // Adds one client's evaluation to the open round's (round_eval_).
  // `times` -1 takes it back (an update the log could not take).
  void AddEval(const v1::Evaluation& e, int times = 1) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a refused update; returns `s`.
  absl::Status Refuse(absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same for an update refused for what it held, which spends its client's turn in the
  // round (Rounds::Spend).
  absl::Status RefuseContent(const v1::UpdateInfo& info, absl::Status s)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An update's bytes (as sent, and dense), and its acceptance (Push and the log's replay).
  void CountBytesUp(uint64_t payload_bytes, uint64_t wire_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountAccepted(bool stale, int64_t staleness, int times = 1)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checkpoint as of now, tagged with a sequence number; written by WriteCheckpoint after
  // the lock is released (only if nothing newer was written meanwhile).
  std::shared_ptr<internal::AggregatorCheckpoint> SnapshotState()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteCheckpoint(std::shared_ptr<internal::AggregatorCheckpoint> ckpt, uint64_t seq)
      ABSL_LOCKS_EXCLUDED(mu_);

  const AggregatorOptions options_;
  const CodecRegistry* const codecs_;
  const std::unique_ptr<AggregationRule> rule_;
  // The rate round by round (options_.lr_schedule; constant: the task's): ps's server step
  // takes it (step_), the other modes hand it to the clients in each round's task.
  const LrSchedule round_lr_;
  // Round `round`'s rate: an edge's parent's task's, else round_lr_'s.
  double RoundLr(int64_t round) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable absl::Mutex mu_;
  // The strategies, chosen once from the options: how the model goes down, what a round's
  // close does with the aggregate (step_ may point into downstream_).
  const std::unique_ptr<Downstream> downstream_ ABSL_PT_GUARDED_BY(mu_);
  const std::unique_ptr<ServerStep> step_ ABSL_PT_GUARDED_BY(mu_);
  double logged_deadline_s_ ABSL_GUARDED_BY(mu_) = 0;  // the last learned deadline logged
  const std::unique_ptr<Rounds> rounds_ ABSL_PT_GUARDED_BY(mu_);
  // An edge's side of its parent; null unless options_.edge_rounds > 0.
  const std::unique_ptr<EdgeTier> edge_ ABSL_PT_GUARDED_BY(mu_);
  // DP-FedAvg's mechanism and accountant; null unless options_.dp.clip > 0.
  const std::unique_ptr<DpFedAvg> dp_ ABSL_PT_GUARDED_BY(mu_);
  double dp_round_q_ ABSL_GUARDED_BY(mu_) = 0;  // the open round's sampling rate
  // SecAgg+'s rounds; null unless options_.secagg.enabled. With the open round's reported
  // training losses (the masked updates' UpdateInfo), for its train_loss.
  const std::unique_ptr<SecureRounds> secure_ ABSL_PT_GUARDED_BY(mu_);
  double secure_loss_sum_ ABSL_GUARDED_BY(mu_) = 0;
  double secure_batch_sum_ ABSL_GUARDED_BY(mu_) = 0;
  ClientBook clients_ ABSL_GUARDED_BY(mu_);
  bool have_model_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<ParamTensor> layout_ ABSL_GUARDED_BY(mu_);
  std::vector<float> model_ ABSL_GUARDED_BY(mu_);
  NormGuard norm_guard_ ABSL_GUARDED_BY(mu_);
  // The open round's accepted updates (made with the model). Made once with the model, then
  // thread-safe itself: pushes add to it outside mu_.
  std::unique_ptr<RoundAccumulator> accumulator_ ABSL_GUARDED_BY(mu_);
  // Global models by round (and their CRC-32s), and the open round's downstream chunks.
  ModelHistory history_ ABSL_GUARDED_BY(mu_);
  v1::ServerStatus counters_ ABSL_GUARDED_BY(mu_);
  internal::RoundEval round_eval_ ABSL_GUARDED_BY(mu_);  // the open round's evaluations
  std::map<std::string, uint64_t> refusals_ ABSL_GUARDED_BY(mu_);
  uint64_t state_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t events_ ABSL_GUARDED_BY(mu_) = 0;

  // The snapshot and update log on disk; null without a checkpoint path. Thread-safe itself:
  // written and appended to outside mu_.
  const std::unique_ptr<StateStore> store_;
};

}  // namespace tern

#endif  // TERN_SERVER_AGGREGATOR_H_

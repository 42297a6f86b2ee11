// Secure aggregation's side of the aggregator's rounds (tern server --secagg): each round's
// SecAgg+ stages (core/federated/secagg.h) between the clients the round sampled, timed. A
// round's keys and shares stages close when every client still in them has sent its message or
// at --secagg_stage_timeout; its masked vectors come in as the round's pushes, until every
// masking client's is in or the round's own policy closes it (replies + grace, deadline); then
// the survivors reveal their shares (another stage timeout at most) and the round's result is
// the mean of the updates that came in, which the aggregator's step applies as any round's.
//
// Thread-safety: thread-compatible; the aggregator calls it under its mutex.
#ifndef TERN_SERVER_SECURE_ROUNDS_H_
#define TERN_SERVER_SECURE_ROUNDS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/federated/secagg.h"
#include "tern/v1/secagg.pb.h"

namespace tern {

struct SecAggOptions {
  bool enabled = false;
  uint32_t neighbours = 16;  // k (rounded up to even; every other client when fewer)
  uint32_t threshold = 0;    // t; 0: more than half of each client's neighbours
  uint32_t bits = 32;        // b
  uint32_t levels = 0;       // Q; 0: the most that K clients' sum fits in b bits
  double range = 1.0;        // r
  double noise_sd = 0;       // DP-FedAvg's distributed noise: each client's sd (SecAggParams)
  // Random-k (--update_codec=randomk:ratio=R): the share of the model's values each round
  // masks (SecAggParams.keep: ceil(R d)), and whether its mean is scaled by d / keep. 0: all.
  double keep_ratio = 0;
  bool keep_unbiased = false;
  absl::Duration stage_timeout = absl::Seconds(30);
};

// The options' own checks (a round's size is checked as it opens).
absl::Status CheckSecAggOptions(const SecAggOptions& o);

class SecureRounds {
 public:
  explicit SecureRounds(SecAggOptions options) : options_(options) {}

  // Round `round` opened at `now` with `sampled` clients; the model has `dim` coordinates. A
  // round too small for the options gets no secure aggregation (active() false) and `why`.
  void Open(int64_t round, const std::vector<int>& sampled, size_t dim, uint64_t seed,
            absl::Time now, std::string* why);
  // Whether the open round's secure aggregation is under way.
  bool active() const { return round_ != nullptr; }
  // The open round's stage (kDone when none is under way): a change is an event for the calls
  // waiting on a stage's answer.
  SecAggServerRound::Stage stage() const {
    return round_ != nullptr ? round_->stage() : SecAggServerRound::Stage::kDone;
  }
  int64_t round() const { return number_; }
  // The open round's parameters (Task.secagg).
  const v1::SecAggParams& params() const { return params_; }
  // Whether `client` may still take the open round's task: only while the key stage is open
  // and before it sent keys (a client that fetches again later has no place in the stages).
  bool Admits(uint32_t client) const;

  // A client's stage message or poll. Refusals: a round that is not the open one or a client it
  // did not sample (FailedPrecondition / PermissionDenied), and whatever the stage refuses.
  absl::StatusOr<v1::SecAggReply> Handle(const v1::SecAggRequest& request);
  // A masked update of the open round (Push), already admitted by the round's rules.
  absl::Status AddMasked(uint32_t client, int64_t round, std::string_view masked);
  // Whether a push for `round` would be taken now (the masked stage of that round is open).
  absl::Status TakesMasked(uint32_t client, int64_t round) const;

  // Moves the stages on at `now`; `replies_in`: the round's policy would close it now. Returns
  // the round's end once there is one: its result, or why there is none (the round closes
  // without an update).
  std::optional<absl::StatusOr<SecAggServerRound::Result>> Advance(absl::Time now, bool replies_in);
  // Drops the open round's state (the run ended, or the round is closed another way).
  void Abandon() { round_.reset(); }

 private:
  absl::Status CloseStage();

  const SecAggOptions options_;
  v1::SecAggParams params_;
  int64_t number_ = -1;
  std::set<uint32_t> sampled_;
  std::unique_ptr<SecAggServerRound> round_;
  size_t dim_ = 0;  // the model's values (the round masks SecAggMaskedDim of them)
  absl::Time stage_since_;
  std::set<uint32_t> revealed_;
};

}  // namespace tern

#endif  // TERN_SERVER_SECURE_ROUNDS_H_

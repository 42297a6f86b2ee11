// The state a diloco group shares (its outer model θ and outer momentum), handed to a worker that
// rejoins a running run: as a bundle on the wire (Gossip.State), and the offer a worker keeps of
// it. The round loop publishes a copy only when a peer asks, at the end of the first step at or
// past the step asked for with no exchange in flight, so a worker nobody asks copies nothing.
//
// Thread-safety: StateShare is thread-safe; the functions are plain functions of their arguments.
#ifndef TERN_WORKER_STATE_SHARE_H_
#define TERN_WORKER_STATE_SHARE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/registry.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

struct GroupState {
  int64_t step = 0;             // the state stands after this step (the next one is step + 1)
  std::vector<float> theta;     // the group's model, the whole flat vector
  std::vector<float> momentum;  // the outer momentum, as long, or empty (none kept)
};

// `state` as Gossip.State sends it: round = step, parts "theta" and (when kept) "momentum".
absl::StatusOr<v1::TensorBundle> GroupStateToBundle(const GroupState& state,
                                                    const std::string& run_id, int sender);
// The reverse for a peer's (untrusted) bundle: the run's, a model of `num_params` values, the
// parts above and nothing else, every value finite. Any error leaves nothing half-read.
absl::StatusOr<GroupState> GroupStateFromBundle(const v1::TensorBundle& bundle,
                                                const std::string& run_id, uint64_t num_params,
                                                const CodecRegistry& codecs);

// Whether `s` is StateShare::Get's answer for a state not published yet (ask again later), as
// against a failure to reach the worker that would publish it.
bool StateNotYet(const absl::Status& s);

class StateShare {
 public:
  // The newest state published, when it stands after `min_step` or later; else Unavailable, and
  // the round loop is asked to publish one (Wanted).
  absl::StatusOr<std::shared_ptr<const v1::TensorBundle>> Get(int64_t min_step)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the state after `step` is asked for and not yet published.
  bool Wanted(int64_t step) const ABSL_LOCKS_EXCLUDED(mu_);
  // The state after step bundle->round(); answers every ask it meets.
  void Publish(std::shared_ptr<const v1::TensorBundle> bundle) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::optional<int64_t> wanted_ ABSL_GUARDED_BY(mu_);  // the least step asked for, unanswered
  std::shared_ptr<const v1::TensorBundle> published_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tern

#endif  // TERN_WORKER_STATE_SHARE_H_

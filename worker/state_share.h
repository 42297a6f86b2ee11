// The state a diloco group shares (its outer model θ and outer momentum), handed to a worker that
// rejoins a running run: as bundles on the wire (Gossip.State; whole, or in slices that a joiner
// takes from several peers at once), and the offer a worker keeps of it. The round loop publishes a
// copy only when a peer asks, at the end of the first step at or past the step asked for with no
// exchange in flight, so a worker nobody asks copies nothing.
//
// Thread-safety: StateShare is thread-safe; the functions are plain functions of their arguments.
#ifndef TERN_WORKER_STATE_SHARE_H_
#define TERN_WORKER_STATE_SHARE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/registry.h"
#include "tern/v1/tensor.pb.h"
#include "worker/step_schedule.h"

namespace tern {

struct GroupState {
  int64_t step = 0;             // the state stands after this step (the next one is step + 1)
  std::vector<float> theta;     // the group's model, the whole flat vector
  std::vector<float> momentum;  // the outer momentum, as long, or empty (none kept)
  // Each lane's exchange schedule where H moves (--local_steps_max), or empty.
  std::vector<StepSchedule> schedules;
};

// The most lanes a state's schedules name.
inline constexpr int kMaxStateSchedules = 1 << 16;

// The CRC-32 of `state`: θ's fp32 bytes, then the momentum's, then each schedule's period and
// start (int64 each).
uint32_t GroupStateCrc(const GroupState& state);

// A state as a worker hands it out: with its CRC, computed once when it is published.
struct PublishedState {
  GroupState state;
  uint32_t crc = 0;
};

// The most slices a state is cut into (StateRequest.slices).
inline constexpr uint32_t kMaxStateSlices = 64;

// Slice `slice` of `slices` of a flat vector of n values: [n * slice / slices, n * (slice + 1) /
// slices), so the slices cover it in order whatever n.
struct SliceRange {
  uint64_t begin = 0;
  uint64_t end = 0;
};
SliceRange StateSliceRange(uint64_t n, uint32_t slice, uint32_t slices);

// Slice `slice` of `slices` of `published` as Gossip.State sends it: round = step, parts "theta"
// and (when kept) "momentum" with that slice's values, bucket / buckets = slice / slices (0 / 0
// for the whole state), state_crc = its CRC. InvalidArgument for a slice that is not one.
absl::StatusOr<v1::TensorBundle> GroupStateToBundle(const PublishedState& published,
                                                    const std::string& run_id, int sender,
                                                    uint32_t slice = 0, uint32_t slices = 1);

// One slice of a peer's state (the whole of it when slices is 1).
struct StateSlice {
  int64_t step = 0;
  uint32_t slice = 0;
  uint32_t slices = 1;
  std::optional<uint32_t> crc;          // the whole state's, as its sender says
  std::vector<float> theta;             // the slice's values (StateSliceRange)
  std::vector<float> momentum;          // as many, or empty
  std::vector<StepSchedule> schedules;  // the whole state's (every slice carries them)
};

// The reverse for a peer's (untrusted) bundle answering a request for slice `slice` of
// `slices`: the run's, of a model of `num_params` values, that slice, the parts above and
// nothing else, every value finite. Any error leaves nothing half-read.
absl::StatusOr<StateSlice> StateSliceFromBundle(const v1::TensorBundle& bundle,
                                                const std::string& run_id, uint64_t num_params,
                                                uint32_t slice, uint32_t slices,
                                                const CodecRegistry& codecs);

// The state the slices make, one of each index 0..slices-1 in any order, of a model of
// `num_params` values. With `one_state` (a state the group shares: every slice must be of the
// same one), they must all say the same CRC, and the whole must have it (DataLoss if not); the
// step is the latest any says (the same bytes stand after each). Without, the slices may come
// from different workers' models (a gossip joiner's: a mosaic of its peers').
absl::StatusOr<GroupState> JoinStateSlices(std::vector<StateSlice> slices, uint64_t num_params,
                                           bool one_state);

// Whether `s` is StateShare::Get's answer for a state not published yet (ask again later), as
// against a failure to reach the worker that would publish it.
bool StateNotYet(const absl::Status& s);

// The θ most of a round's workers held, when it is not this one's: its CRC's holders (by id),
// how many, and how many held this worker's.
struct GroupMajority {
  std::vector<int> holders;
  int count = 0;
  int ours = 0;
};
// Worker `me` held θ of CRC `mine` in a round whose messages said `theirs` (sender -> CRC). The
// CRC most of them, `me` among them, held; between as many, the one the lowest id held. nullopt
// when that is `mine`: every worker that heard the same messages settles on the same θ, and only
// the others take it again.
std::optional<GroupMajority> MajorityElsewhere(int me, uint32_t mine,
                                               const std::map<int, uint32_t>& theirs);

class StateShare {
 public:
  // The newest state published, when it stands after `min_step` or later; else Unavailable, and
  // the round loop is asked to publish one (Wanted).
  absl::StatusOr<std::shared_ptr<const PublishedState>> Get(int64_t min_step)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the state after `step` is asked for and not yet published.
  bool Wanted(int64_t step) const ABSL_LOCKS_EXCLUDED(mu_);
  // The state after step state->state.step; answers every ask it meets.
  void Publish(std::shared_ptr<const PublishedState> state) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::optional<int64_t> wanted_ ABSL_GUARDED_BY(mu_);  // the least step asked for, unanswered
  std::shared_ptr<const PublishedState> published_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tern

#endif  // TERN_WORKER_STATE_SHARE_H_

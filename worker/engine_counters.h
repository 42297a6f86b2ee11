// What a worker's round engine counts: its WorkerStats (steps, bytes, seconds), each peer's
// traffic, refused messages by reason, and the neighbours up in the last round. The round loop
// and the gossip service add to it; the Trainer service's Stats and the metrics endpoint read it.
//
// Thread-safety: thread-safe (one mutex, held only to copy or add numbers).
#ifndef TERN_WORKER_ENGINE_COUNTERS_H_
#define TERN_WORKER_ENGINE_COUNTERS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tern/v1/worker.pb.h"
#include "worker/lane.h"

namespace tern {

// after - before, counter by counter (worker_id kept).
v1::WorkerStats StatsDelta(const v1::WorkerStats& after, const v1::WorkerStats& before);

class EngineCounters {
 public:
  // Each peer's traffic with this worker (by worker id), for the metrics endpoint.
  struct PeerTraffic {
    uint64_t messages_sent = 0, wire_bytes_sent = 0;          // pushes it accepted
    uint64_t messages_received = 0, wire_bytes_received = 0;  // its messages accepted here
  };
  using Seconds = double (v1::WorkerStats::*)() const;
  using SetSeconds = void (v1::WorkerStats::*)(double);

  explicit EngineCounters(int worker_id);

  // Adds `seconds` to the counter `get`/`set` (encode_seconds, combine_seconds, ...) and
  // `decode` to decode_seconds.
  void AddSeconds(Seconds get, SetSeconds set, double seconds, double decode = 0)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Round `r` finished as `report` says, with `peers_up` = (neighbours up, neighbours).
  void CountRound(const InFlight& r, const RoundReport& report, std::pair<int, int> peers_up)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A message accepted from `sender` (< 0: counted in the totals only, as a swap's reply is).
  void CountReceived(int sender, uint64_t payload, uint64_t wire) ABSL_LOCKS_EXCLUDED(mu_);
  // A message sent outside a round (SwarmSGD's swaps and their answers).
  void CountSent(uint64_t payload, uint64_t wire, uint64_t dense) ABSL_LOCKS_EXCLUDED(mu_);
  void CountDropped() ABSL_LOCKS_EXCLUDED(mu_);
  // The algorithms' count of clipped contributions (Algorithm::contributions_clipped), all lanes.
  void SetClipped(uint64_t total) ABSL_LOCKS_EXCLUDED(mu_);
  // The algorithms' count of neighbours' copies taken whole (Algorithm::copies_resynced).
  void SetCopiesResynced(uint64_t total) ABSL_LOCKS_EXCLUDED(mu_);
  // diloco's H (and fragment count, 0 where fixed) where the group moves them: where they start,
  // and each move (the new ones).
  void SetSchedule(int64_t h, int64_t fragments) ABSL_LOCKS_EXCLUDED(mu_);
  void CountScheduleChange(int64_t h, int64_t fragments) ABSL_LOCKS_EXCLUDED(mu_);
  // Neighbours of a round whose group model θ was not this worker's (diloco).
  void CountGroupMismatches(uint64_t n) ABSL_LOCKS_EXCLUDED(mu_);
  // A lane's group model taken again from its peers (diloco: RoundEngine's repair of a split).
  void CountGroupRepair() ABSL_LOCKS_EXCLUDED(mu_);
  // A refused incoming message, by `why`'s code.
  void CountRefused(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  // A step ended: counts it (and its round, when it had one), its loss and the trainer's time,
  // and the time since the previous step ended. Returns what the step added to every counter.
  v1::WorkerStats EndStep(bool communicated, float loss, double compute_seconds, double io_seconds)
      ABSL_LOCKS_EXCLUDED(mu_);

  v1::WorkerStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);
  std::map<int, PeerTraffic> PeerStats() const ABSL_LOCKS_EXCLUDED(mu_);
  // Refused incoming messages by reason (the status code's name, e.g. "INVALID_ARGUMENT").
  std::map<std::string, uint64_t> RefusalsByReason() const ABSL_LOCKS_EXCLUDED(mu_);
  // Neighbours of the last round believed up (reachable and in step), and how many it had.
  std::pair<int, int> PeersUp() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  v1::WorkerStats stats_ ABSL_GUARDED_BY(mu_);
  v1::WorkerStats last_step_stats_ ABSL_GUARDED_BY(mu_);  // stats_ when the last step ended
  absl::Time last_step_end_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::map<int, PeerTraffic> peer_traffic_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> refusals_ ABSL_GUARDED_BY(mu_);
  std::pair<int, int> peers_up_ ABSL_GUARDED_BY(mu_) = {0, 0};
};

}  // namespace tern

#endif  // TERN_WORKER_ENGINE_COUNTERS_H_

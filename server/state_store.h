// The aggregator's durable state: a snapshot of it (internal::AggregatorCheckpoint, written
// atomically at `path`) and the log of the updates accepted since (server/update_log.h, beside
// it). A restarted aggregator reads both back: the snapshot, then every update logged after it.
//
// Thread-safety: thread-safe. Write keeps snapshots in order (one older than the snapshot on
// disk is dropped); Append may wait for its snapshot's write, so never call it under a lock a
// writer needs.
#ifndef TERN_SERVER_STATE_STORE_H_
#define TERN_SERVER_STATE_STORE_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/update_log.h"
#include "tern/internal/checkpoint.pb.h"

namespace tern {

class StateStore {
 public:
  // Nothing is read or written until asked.
  explicit StateStore(std::string path);

  struct Saved {
    internal::AggregatorCheckpoint snapshot;
    std::vector<internal::LoggedUpdate> updates;  // logged after the snapshot, in order
  };
  // What is on disk; nullopt when there is no snapshot (a new run). DataLoss when the snapshot
  // does not parse.
  absl::StatusOr<std::optional<Saved>> Read() const;

  // Appends an accepted update (its generation: the snapshot it follows) once that snapshot is
  // on disk; returns when the update is durable.
  absl::Status Append(const internal::LoggedUpdate& update);
  // Writes `snapshot`, the state numbered `seq`, unless a newer one is on disk; the updates
  // accepted from here on go to a fresh log.
  absl::Status Write(const internal::AggregatorCheckpoint& snapshot, uint64_t seq)
      ABSL_LOCKS_EXCLUDED(mu_);
  // When a snapshot was last written (InfinitePast: never).
  absl::Time LastWrite() const;

  const std::string& path() const { return path_; }
  std::string log_path() const { return UpdateLog::PathFor(path_); }

 private:
  const std::string path_;
  UpdateLog log_;
  absl::Mutex mu_;
  uint64_t written_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> written_unix_ns_{INT64_MIN};
};

}  // namespace tern

#endif  // TERN_SERVER_STATE_STORE_H_

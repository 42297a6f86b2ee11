// The aggregator's durable state: a snapshot of it (internal::AggregatorCheckpoint, written
// atomically at `path` inside a checksummed frame) and the log of the updates accepted since
// (server/update_log.h, at `path`.log). A restarted aggregator reads both back: the snapshot, then
// every update logged after it. Damage is never read as less state: a snapshot that fails its
// checksum, a log damaged anywhere but an incomplete last write, or one of the two files missing
// where the other exists is DATA_LOSS naming the file, the record and the offset (docs/server.md,
// "Checkpoints and restarts").
//
// Snapshot file: "TERNCKP1" | u64 length | u32 CRC-32 of the message | u32 CRC-32 of the 20 bytes
// before | the message, little-endian. A file without the magic is read as the bare message an
// older tern wrote.
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
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/update_log.h"
#include "tern/internal/checkpoint.pb.h"

namespace tern {

inline constexpr char kSnapshotMagic[] = "TERNCKP1";
inline constexpr size_t kSnapshotHeaderBytes = 24;

class StateStore {
 public:
  // Nothing is read or written until asked.
  explicit StateStore(std::string path);

  struct Saved {
    internal::AggregatorCheckpoint snapshot;
    bool checksummed = true;  // false: a bare message of an older tern, nothing to check it by
    UpdateLog::Contents log;  // log.updates: logged after the snapshot, in order
  };
  // What is on disk; nullopt when there is nothing (a new run), or only an empty log (a server
  // stopped before its first snapshot). DATA_LOSS for damage or a missing part.
  absl::StatusOr<std::optional<Saved>> Read() const;
  // The snapshot message in a snapshot file's bytes (framed or bare); DATA_LOSS when damaged.
  // `checksummed` (may be null) says whether it was framed.
  static absl::StatusOr<internal::AggregatorCheckpoint> ParseSnapshot(absl::string_view bytes,
                                                                      bool* checksummed);
  // A report of `saved` for people (`tern server --verify_checkpoint`).
  std::string Describe(const Saved& saved) const;
  // Moves the files aside (PATH.damaged-UNIXTIME, and the log beside it) so that a new run
  // starts; returns where they went.
  absl::StatusOr<std::string> MoveAside() const;

  // Appends an accepted update (its generation: the snapshot it follows) once that snapshot is
  // on disk; returns when the update is durable.
  absl::Status Append(const internal::LoggedUpdate& update);
  // Writes `snapshot`, the state numbered `seq`, unless a newer one is on disk; the updates
  // accepted from here on go to a fresh log. The first write makes an empty log first, so that a
  // snapshot on disk always has its log beside it.
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
  bool log_made_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> written_unix_ns_{INT64_MIN};
};

}  // namespace tern

#endif  // TERN_SERVER_STATE_STORE_H_

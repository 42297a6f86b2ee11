// The aggregator's update log (proto/tern/internal/checkpoint.proto): accepted updates appended
// between two snapshots, each durable before the client hears "accepted", so a checkpoint costs
// one append per update instead of a copy of every client and the model.
//
// Every record carries the generation of the last snapshot taken before its update was
// accepted. A record is appended only once the snapshot of its generation is on disk (Append
// waits for it), and a newer snapshot on disk already holds it (Append returns at once). After a
// snapshot is written, Rotate starts a fresh log file, so the file on disk only ever holds
// records of the snapshot beside it (or older ones, skipped, if the server died between the
// snapshot and the rotation).
//
// Thread-safety: thread-safe; Append may wait, never under the aggregator's lock.
#ifndef TERN_SERVER_UPDATE_LOG_H_
#define TERN_SERVER_UPDATE_LOG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/record_log.h"
#include "tern/internal/checkpoint.pb.h"

namespace tern {

class UpdateLog {
 public:
  // The log file beside the snapshot at `checkpoint_path`.
  static std::string PathFor(const std::string& checkpoint_path) {
    return checkpoint_path + ".log";
  }
  // What the log beside a snapshot of `generation` holds.
  struct Contents {
    std::vector<internal::LoggedUpdate> updates;  // of `generation`, in order: to replay
    size_t older = 0;                 // of an older generation: in the snapshot already, skipped
    uint64_t torn_bytes = 0;          // an incomplete last write (never acknowledged), dropped
    uint64_t acknowledged_bytes = 0;  // what the log's length file says (0: none)
    bool exists = true;               // false: there is no log file
  };
  // Reads the log beside `checkpoint_path`; DATA_LOSS for damage (common/record_log.h), a record
  // that does not parse, or one of a newer generation than the snapshot's.
  static absl::StatusOr<Contents> Read(const std::string& checkpoint_path, uint64_t generation);

  // No file is touched until the first Rotate.
  explicit UpdateLog(std::string checkpoint_path) : path_(PathFor(checkpoint_path)) {}

  // Appends `update` (its generation set) once the snapshot of that generation is on disk; OK at
  // once when a newer snapshot is. The error of that snapshot's write when it failed.
  absl::Status Append(const internal::LoggedUpdate& update) ABSL_LOCKS_EXCLUDED(mu_);
  // The snapshot of `generation` is on disk: a fresh log takes the records from here on.
  absl::Status Rotate(uint64_t generation) ABSL_LOCKS_EXCLUDED(mu_);
  // The snapshot of `generation` could not be written: its records fail with `why`.
  void Failed(uint64_t generation, const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string path_;
  absl::Mutex mu_;
  absl::CondVar written_;                         // a snapshot was written (or failed)
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // of the snapshot on disk
  uint64_t failed_generation_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  // Shared: an append still running on the old file after a rotation is harmless (the new
  // snapshot holds its update).
  std::shared_ptr<RecordLog> log_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tern

#endif  // TERN_SERVER_UPDATE_LOG_H_

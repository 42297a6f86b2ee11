// An append-only file of records, each durable before Append returns, for state that changes
// too often to rewrite whole (the aggregator's accepted updates between two snapshots).
// Concurrent appends share one fdatasync (group commit): the first waiting appender syncs
// everything written so far, the others wait for it.
//
// Format (docs/server.md, "Checkpoints and restarts"): the 8-byte magic "TERNRLG2", then
// records, each
//   u32 length | u32 CRC-32 of the payload | u32 CRC-32 of the 8 bytes before | payload,
// little-endian. The header's own CRC tells a damaged length from an incomplete write: only an
// incomplete last write (a short header, a payload cut short by the end of the file, or space
// the file system extended with zeros) is a torn tail, which was never acknowledged and is
// dropped. Any other damage, in the last record too, is DATA_LOSS naming the record and its
// offset. Logs of format 1 ("TERNRLG1", no header CRC) are still read, by their old rule: a
// last record that fails its CRC is taken for torn.
//
// A log cut short at a record boundary reads like one whose later appends never happened, so the
// log's acknowledged length lives beside it too: PATH.len, 20 bytes "TERNLEN1" | u64 bytes of
// the log on disk | u32 CRC-32 of the 16 bytes before, rewritten in place and synced after every
// sync of the log, before any append it covers returns. Reading a log whose whole records end
// before that length is DATA_LOSS; bytes past it (an append a crash interrupted) are the only
// torn tail. A log without the file (written before it existed) is read as before.
//
// Thread-safety: RecordLog is thread-safe; ReadRecordLog is a function of the file.
#ifndef TERN_COMMON_RECORD_LOG_H_
#define TERN_COMMON_RECORD_LOG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace tern {

inline constexpr char kRecordLogMagic[] = "TERNRLG2";
inline constexpr char kRecordLogMagicV1[] = "TERNRLG1";
inline constexpr char kLogLengthMagic[] = "TERNLEN1";
inline constexpr size_t kLogLengthFileBytes = 20;
inline constexpr uint32_t kMaxLogRecordBytes = uint32_t{1} << 31;
inline constexpr size_t kRecordHeaderBytes = 12;

struct RecordLogContents {
  std::vector<std::string> records;  // the whole records, in order
  uint64_t torn_bytes = 0;           // an incomplete last write, dropped
  bool exists = true;                // false: no file (ReadRecordLog), read as empty
  uint64_t acknowledged_bytes = 0;   // PATH.len's (ReadRecordLog), 0 without one
};
// The file beside the log at `log_path` that holds its acknowledged length.
std::string LogLengthPath(const std::string& log_path);
// The acknowledged length in a length file's bytes; DATA_LOSS unless they are exactly one
// (kLogLengthFileBytes, its magic, its CRC).
absl::StatusOr<uint64_t> ParseLogLength(absl::string_view bytes);
// The records of the log in `bytes` (the file's contents). DATA_LOSS, naming the record and its
// byte offset, for damage that is not an incomplete last write.
absl::StatusOr<RecordLogContents> ParseRecordLog(absl::string_view bytes);
// Reads and parses the log at `path`; a missing file is an empty log (exists = false).
absl::StatusOr<RecordLogContents> ReadRecordLog(const std::string& path);

class RecordLog {
 public:
  // A fresh, empty log at `path`, replacing any file there atomically (temporary, fsync,
  // rename, directory fsync), so a crash leaves either the old log or the new one. Its length
  // file is reset first: between the two, the old log is longer than it says, never shorter.
  static absl::StatusOr<std::unique_ptr<RecordLog>> Create(const std::string& path);
  ~RecordLog();
  RecordLog(const RecordLog&) = delete;
  RecordLog& operator=(const RecordLog&) = delete;

  // Appends `record` and returns once it is on disk. After a failed write or sync the log
  // refuses every later append (UNAVAILABLE): what is on disk is no longer known.
  absl::Status Append(absl::string_view record) ABSL_LOCKS_EXCLUDED(mu_);
  // Records appended (for tests and stats).
  uint64_t appended() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t syncs() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  RecordLog(std::string path, int fd, int length_fd, uint64_t bytes)
      : path_(std::move(path)), fd_(fd), length_fd_(length_fd), bytes_(bytes) {}
  bool Synced(uint64_t seq) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the frame and record, then waits until a sync covers them (may release mu_ while
  // syncing).
  absl::Status AppendLocked(absl::string_view frame, absl::string_view record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const int fd_;
  const int length_fd_;  // PATH.len
  mutable absl::Mutex mu_;
  uint64_t appended_ ABSL_GUARDED_BY(mu_) = 0;  // records written
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;     // the file's length, with what was written
  uint64_t synced_ ABSL_GUARDED_BY(mu_) = 0;    // records known to be on disk
  bool syncing_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t syncs_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tern

#endif  // TERN_COMMON_RECORD_LOG_H_

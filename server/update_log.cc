#include "server/update_log.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tern {

absl::StatusOr<UpdateLog::Contents> UpdateLog::Read(const std::string& checkpoint_path,
                                                    uint64_t generation) {
  const std::string path = PathFor(checkpoint_path);
  absl::StatusOr<RecordLogContents> log = ReadRecordLog(path);
  if (!log.ok()) return log.status();
  Contents out;
  out.exists = log->exists;
  out.torn_bytes = log->torn_bytes;
  out.acknowledged_bytes = log->acknowledged_bytes;
  for (size_t i = 0; i < log->records.size(); ++i) {
    internal::LoggedUpdate u;
    if (!u.ParseFromString(log->records[i])) {
      return absl::DataLossError(absl::StrCat(path, ": record ", i, " does not parse"));
    }
    if (u.generation() > generation) {
      return absl::DataLossError(absl::StrCat(path, ": record ", i, " is of generation ",
                                              u.generation(), ", after the snapshot's ",
                                              generation));
    }
    // Older records are in the snapshot already (the server stopped before the rotation).
    if (u.generation() == generation) {
      out.updates.push_back(std::move(u));
    } else {
      ++out.older;
    }
  }
  return out;
}

absl::Status UpdateLog::Append(const internal::LoggedUpdate& update) {
  const uint64_t g = update.generation();
  std::shared_ptr<RecordLog> log;
  {
    absl::MutexLock lock(&mu_);
    // The snapshot of g is being written by the thread that took it.
    while (generation_ < g && failed_generation_ < g) written_.Wait(&mu_);
    if (generation_ > g) return absl::OkStatus();  // a newer snapshot holds it
    if (generation_ < g) return failed_;
    log = log_;
  }
  return log->Append(update.SerializeAsString());
}

absl::Status UpdateLog::Rotate(uint64_t generation) {
  {
    absl::MutexLock lock(&mu_);
    if (generation <= generation_) return absl::OkStatus();  // a newer one is on disk
  }
  // Snapshots (and so rotations) are written one at a time, in order (Aggregator's io_mu_).
  absl::StatusOr<std::unique_ptr<RecordLog>> fresh = RecordLog::Create(path_);
  absl::MutexLock lock(&mu_);
  if (!fresh.ok()) {
    // Without a log the updates of this generation cannot be made durable.
    failed_generation_ = std::max(failed_generation_, generation);
    failed_ = fresh.status();
  } else {
    generation_ = generation;
    log_ = *std::move(fresh);
  }
  written_.SignalAll();
  return fresh.status();
}

void UpdateLog::Failed(uint64_t generation, const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  failed_generation_ = std::max(failed_generation_, generation);
  failed_ = why;
  written_.SignalAll();
}

}  // namespace tern

#include "server/state_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace tern {

StateStore::StateStore(std::string path) : path_(std::move(path)), log_(path_) {}

absl::StatusOr<std::optional<StateStore::Saved>> StateStore::Read() const {
  absl::StatusOr<std::string> bytes = ReadFile(path_);
  if (absl::IsNotFound(bytes.status())) return std::nullopt;  // a new run
  if (!bytes.ok()) return bytes.status();
  Saved saved;
  if (!saved.snapshot.ParseFromString(*bytes)) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path_, " does not parse"));
  }
  TERN_ASSIGN_OR_RETURN(saved.updates, UpdateLog::Read(path_, saved.snapshot.generation()));
  return saved;
}

absl::Status StateStore::Append(const internal::LoggedUpdate& update) {
  return log_.Append(update);
}

absl::Status StateStore::Write(const internal::AggregatorCheckpoint& snapshot, uint64_t seq) {
  absl::MutexLock lock(&mu_);
  if (seq <= written_seq_) return absl::OkStatus();  // a newer state is already on disk
  if (absl::Status s = WriteFileAtomically(path_, snapshot.SerializeAsString()); !s.ok()) {
    log_.Failed(seq, s);
    return s;
  }
  written_seq_ = seq;
  written_unix_ns_ = absl::ToUnixNanos(absl::Now());
  return log_.Rotate(seq);
}

absl::Time StateStore::LastWrite() const {
  const int64_t ns = written_unix_ns_.load();
  return ns == INT64_MIN ? absl::InfinitePast() : absl::FromUnixNanos(ns);
}

}  // namespace tern

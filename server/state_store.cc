#include "server/state_store.h"

#include <stdio.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_io.h"
#include "common/crc32.h"
#include "common/file_util.h"
#include "common/record_log.h"
#include "common/status_macros.h"

namespace tern {
namespace {

constexpr size_t kMagicBytes = sizeof(kSnapshotMagic) - 1;

std::string FrameSnapshot(const internal::AggregatorCheckpoint& snapshot) {
  std::string bytes(kSnapshotHeaderBytes, '\0');
  snapshot.AppendToString(&bytes);
  const size_t length = bytes.size() - kSnapshotHeaderBytes;
  std::string header;
  ByteWriter w(&header);
  w.Raw(kSnapshotMagic, kMagicBytes);
  w.U64(length);
  w.U32(Crc32(bytes.data() + kSnapshotHeaderBytes, length));
  w.U32(Crc32(header.data(), header.size()));
  std::memcpy(bytes.data(), header.data(), kSnapshotHeaderBytes);
  return bytes;
}

}  // namespace

StateStore::StateStore(std::string path) : path_(std::move(path)), log_(path_) {}

absl::StatusOr<internal::AggregatorCheckpoint> StateStore::ParseSnapshot(absl::string_view bytes,
                                                                         bool* checksummed) {
  internal::AggregatorCheckpoint snapshot;
  const bool framed = bytes.substr(0, kMagicBytes) == kSnapshotMagic;
  if (checksummed != nullptr) *checksummed = framed;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    // The message's size is an int to protobuf: the cast below would go negative.
    return absl::DataLossError(
        absl::StrCat(bytes.size(), " bytes: over the 2 GiB a snapshot message can hold"));
  }
  if (!framed) {
    if (!snapshot.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return absl::DataLossError("does not parse (no TERNCKP1 header, and not a bare snapshot)");
    }
    return snapshot;
  }
  if (bytes.size() < kSnapshotHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("truncated: ", bytes.size(), " bytes, shorter than its header"));
  }
  ByteReader r(reinterpret_cast<const uint8_t*>(bytes.data()) + kMagicBytes,
               kSnapshotHeaderBytes - kMagicBytes);
  uint64_t length = 0;
  uint32_t crc = 0, header_crc = 0;
  r.U64(&length);
  r.U32(&crc);
  r.U32(&header_crc);
  if (Crc32(bytes.data(), kSnapshotHeaderBytes - 4) != header_crc) {
    return absl::DataLossError("its header fails its CRC");
  }
  if (bytes.size() - kSnapshotHeaderBytes != length) {
    return absl::DataLossError(
        absl::StrCat("truncated or extended: ", bytes.size() - kSnapshotHeaderBytes,
                     " bytes after the header, the header says ", length));
  }
  const absl::string_view payload = bytes.substr(kSnapshotHeaderBytes);
  if (Crc32(payload.data(), payload.size()) != crc) {
    return absl::DataLossError(absl::StrCat("the snapshot (", length, " bytes) fails its CRC"));
  }
  if (!snapshot.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return absl::DataLossError("passes its CRC but does not parse (written by another program?)");
  }
  return snapshot;
}

absl::StatusOr<std::optional<StateStore::Saved>> StateStore::Read() const {
  constexpr char kHow[] =
      " (tern server --checkpoint=F --verify_checkpoint says more; "
      "--fresh_start_if_damaged moves the files aside and starts a new run)";
  absl::StatusOr<std::string> bytes = ReadFile(path_);
  if (absl::IsNotFound(bytes.status())) {
    // No snapshot: a new run, unless a log says updates were acknowledged.
    absl::StatusOr<RecordLogContents> log = ReadRecordLog(log_path());
    if (!log.ok()) return log.status();
    if (!log->records.empty()) {
      return absl::DataLossError(absl::StrCat("the update log ", log_path(), " holds ",
                                              log->records.size(), " records but the snapshot ",
                                              path_, " is missing", kHow));
    }
    return std::nullopt;
  }
  if (!bytes.ok()) return bytes.status();
  Saved saved;
  absl::StatusOr<internal::AggregatorCheckpoint> snapshot =
      ParseSnapshot(*bytes, &saved.checksummed);
  if (!snapshot.ok()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", path_, ": ", snapshot.status().message(), kHow));
  }
  saved.snapshot = *std::move(snapshot);
  absl::StatusOr<UpdateLog::Contents> log = UpdateLog::Read(path_, saved.snapshot.generation());
  if (!log.ok()) {
    return absl::Status(log.status().code(), absl::StrCat(log.status().message(), kHow));
  }
  // Format 2 snapshots had no log; since format 3 a log is made before the first snapshot.
  if (!log->exists && saved.snapshot.format() >= 3) {
    return absl::DataLossError(
        absl::StrCat("the snapshot ", path_, " is there but its update log ", log_path(),
                     " is missing: updates acknowledged after the snapshot would be lost", kHow));
  }
  saved.log = *std::move(log);
  return saved;
}

std::string StateStore::Describe(const Saved& saved) const {
  const internal::AggregatorCheckpoint& s = saved.snapshot;
  std::string out = absl::StrCat(
      "snapshot ", path_, ": format ", s.format(),
      saved.checksummed ? ", checksum good" : ", no checksum (written by an older tern)",
      ", generation ", s.generation(), ", run '", s.run_id(), "', ", s.round(),
      " rounds closed, round ", s.round_open() ? "open" : "closed", ", ", s.clients_size(),
      " clients, a model of ", s.model().tensors_size(), " tensors\n");
  if (!saved.log.exists) {
    absl::StrAppend(&out, "update log ", log_path(), ": none (format ", s.format(), ")\n");
  } else {
    absl::StrAppend(&out, "update log ", log_path(), ": ", saved.log.updates.size(),
                    " updates to replay, ", saved.log.older,
                    " of an older generation (in the snapshot already)");
    if (saved.log.acknowledged_bytes > 0) {
      absl::StrAppend(&out, ", all ", saved.log.acknowledged_bytes, " bytes acknowledged there (",
                      LogLengthPath(log_path()), ")");
    } else {
      absl::StrAppend(&out,
                      ", no length file (written by an older tern: a cut at a record "
                      "boundary would not show)");
    }
    if (saved.log.torn_bytes > 0) {
      absl::StrAppend(&out, ", a torn last write of ", saved.log.torn_bytes,
                      " bytes (never acknowledged; dropped)");
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

absl::StatusOr<std::string> StateStore::MoveAside() const {
  const std::string suffix = absl::StrCat(".damaged-", absl::ToUnixSeconds(absl::Now()));
  for (const std::string& p : {path_, log_path(), LogLengthPath(log_path())}) {
    if (PathExists(p) && ::rename(p.c_str(), (p + suffix).c_str()) != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot move ", p, " aside: ", std::strerror(errno)));
    }
  }
  return path_ + suffix;
}

absl::Status StateStore::Append(const internal::LoggedUpdate& update) {
  return log_.Append(update);
}

absl::Status StateStore::Write(const internal::AggregatorCheckpoint& snapshot, uint64_t seq) {
  absl::MutexLock lock(&mu_);
  if (seq <= written_seq_) return absl::OkStatus();  // a newer state is already on disk
  if (!log_made_) {
    // The first snapshot of this process: a log beside it before it is on disk, so that a crash
    // between the two never leaves a snapshot without its log. One there already (a restart,
    // its records just read) stays until the rotation below replaces it.
    absl::Status made = absl::OkStatus();
    if (!PathExists(log_path())) made = RecordLog::Create(log_path()).status();
    if (!made.ok()) {
      log_.Failed(seq, made);
      return made;
    }
    log_made_ = true;
  }
  if (absl::Status s = WriteFileAtomically(path_, FrameSnapshot(snapshot)); !s.ok()) {
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

#include "common/record_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_io.h"
#include "common/crc32.h"
#include "common/file_util.h"
#include "common/status_macros.h"

namespace tern {
namespace {

constexpr size_t kMagicBytes = sizeof(kRecordLogMagic) - 1;

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

bool WriteAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseRecordLog(absl::string_view bytes) {
  if (bytes.size() < kMagicBytes || bytes.substr(0, kMagicBytes) != kRecordLogMagic) {
    // A crash while the log was being created leaves it short: nothing was ever appended.
    if (bytes.size() < kMagicBytes &&
        absl::string_view(kRecordLogMagic).substr(0, bytes.size()) == bytes) {
      return std::vector<std::string>();
    }
    return absl::DataLossError("not a tern record log (bad magic)");
  }
  ByteReader r(reinterpret_cast<const uint8_t*>(bytes.data()) + kMagicBytes,
               bytes.size() - kMagicBytes);
  std::vector<std::string> records;
  while (r.remaining() > 0) {
    uint32_t length = 0, crc = 0;
    const uint8_t* payload = nullptr;
    if (!r.U32(&length) || !r.U32(&crc) || length > kMaxLogRecordBytes ||
        (payload = r.Take(length)) == nullptr) {
      break;  // torn at the end: never acknowledged
    }
    if (Crc32(payload, length) != crc) {
      if (r.remaining() == 0) break;  // the last record, torn
      return absl::DataLossError(
          absl::StrCat("record ", records.size(), " of the log fails its CRC"));
    }
    records.emplace_back(reinterpret_cast<const char*>(payload), length);
  }
  return records;
}

absl::StatusOr<std::vector<std::string>> ReadRecordLog(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (absl::IsNotFound(bytes.status())) return std::vector<std::string>();
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<std::vector<std::string>> records = ParseRecordLog(*bytes);
  if (!records.ok()) {
    return absl::Status(records.status().code(),
                        absl::StrCat(path, ": ", records.status().message()));
  }
  return records;
}

absl::StatusOr<std::unique_ptr<RecordLog>> RecordLog::Create(const std::string& path) {
  // The magic alone, atomically: a crash leaves either the old log or an empty new one.
  TERN_RETURN_IF_ERROR(WriteFileAtomically(path, absl::string_view(kRecordLogMagic, kMagicBytes)));
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  return std::unique_ptr<RecordLog>(new RecordLog(path, fd));
}

RecordLog::~RecordLog() { ::close(fd_); }

bool RecordLog::Synced(uint64_t seq) const { return synced_ >= seq || !broken_.ok(); }

absl::Status RecordLog::Append(absl::string_view record) {
  if (record.size() > kMaxLogRecordBytes) {
    return absl::InvalidArgumentError("a log record is limited to 2 GiB");
  }
  std::string frame;
  ByteWriter w(&frame);
  w.U32(static_cast<uint32_t>(record.size()));
  w.U32(Crc32(record.data(), record.size()));
  mu_.Lock();
  absl::Status s = AppendLocked(frame, record);
  mu_.Unlock();
  return s;
}

absl::Status RecordLog::AppendLocked(absl::string_view frame, absl::string_view record) {
  if (!broken_.ok()) return broken_;
  if (!WriteAll(fd_, frame) || !WriteAll(fd_, record)) {
    broken_ = Errno("cannot append to", path_);
    return broken_;
  }
  const uint64_t mine = ++appended_;
  while (!Synced(mine)) {
    if (syncing_) {
      // Someone's sync is under way; it may not cover this record, so look again after it.
      mu_.Await(absl::Condition(
          +[](bool* syncing) { return !*syncing; }, &syncing_));
      continue;
    }
    syncing_ = true;
    const uint64_t upto = appended_;
    mu_.Unlock();  // others append while this one syncs; the next sync takes them all
    const bool ok = ::fdatasync(fd_) == 0;
    const int err = errno;
    mu_.Lock();
    syncing_ = false;
    ++syncs_;
    if (!ok) {
      errno = err;
      broken_ = Errno("cannot sync", path_);
    } else {
      synced_ = std::max(synced_, upto);
    }
  }
  return broken_;
}

uint64_t RecordLog::appended() const {
  absl::MutexLock lock(&mu_);
  return appended_;
}

uint64_t RecordLog::syncs() const {
  absl::MutexLock lock(&mu_);
  return syncs_;
}

}  // namespace tern

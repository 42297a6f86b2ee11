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

namespace {

// The file's first bytes hold no magic: a crash while the log was being created leaves it
// short (nothing was ever appended), else it is not a log.
absl::StatusOr<RecordLogContents> NoMagic(absl::string_view bytes) {
  for (const char* magic : {kRecordLogMagic, kRecordLogMagicV1}) {
    if (bytes.size() < kMagicBytes && absl::string_view(magic).substr(0, bytes.size()) == bytes) {
      return RecordLogContents{};
    }
  }
  return absl::DataLossError("not a tern record log (bad magic)");
}

bool AllZero(const uint8_t* p, size_t n) {
  return std::all_of(p, p + n, [](uint8_t b) { return b == 0; });
}

// Format 1: u32 length | u32 CRC-32 of the payload | payload; a last record that fails its CRC
// or runs past the end is taken for torn.
absl::StatusOr<RecordLogContents> ParseV1(ByteReader& r) {
  RecordLogContents out;
  while (r.remaining() > 0) {
    const size_t left = r.remaining();
    uint32_t length = 0, crc = 0;
    const uint8_t* payload = nullptr;
    if (!r.U32(&length) || !r.U32(&crc) || length > kMaxLogRecordBytes ||
        (payload = r.Take(length)) == nullptr) {
      out.torn_bytes = left;
      break;
    }
    if (Crc32(payload, length) != crc) {
      if (r.remaining() == 0) {
        out.torn_bytes = left;
        break;
      }
      return absl::DataLossError(
          absl::StrCat("record ", out.records.size(), " of the log fails its CRC"));
    }
    out.records.emplace_back(reinterpret_cast<const char*>(payload), length);
  }
  return out;
}

}  // namespace

absl::StatusOr<RecordLogContents> ParseRecordLog(absl::string_view bytes) {
  const absl::string_view magic = bytes.substr(0, std::min(bytes.size(), kMagicBytes));
  if (magic != kRecordLogMagic && magic != kRecordLogMagicV1) return NoMagic(bytes);
  const auto* base = reinterpret_cast<const uint8_t*>(bytes.data());
  ByteReader r(base + kMagicBytes, bytes.size() - kMagicBytes);
  if (magic == kRecordLogMagicV1) return ParseV1(r);
  RecordLogContents out;
  while (r.remaining() > 0) {
    const size_t offset = bytes.size() - r.remaining();
    const uint8_t* header = base + offset;
    // Never-written space: a short header, or zeros the file system extended the file with.
    if (r.remaining() < kRecordHeaderBytes || AllZero(header, r.remaining())) {
      out.torn_bytes = r.remaining();
      break;
    }
    uint32_t length = 0, crc = 0, header_crc = 0;
    r.U32(&length);
    r.U32(&crc);
    r.U32(&header_crc);
    if (Crc32(header, 8) != header_crc || length > kMaxLogRecordBytes) {
      return absl::DataLossError(absl::StrCat("record ", out.records.size(), " at byte ", offset,
                                              ": its header fails its CRC"));
    }
    const uint8_t* payload = r.Take(length);
    if (payload == nullptr) {  // the last write, cut short
      out.torn_bytes = bytes.size() - offset;
      break;
    }
    if (Crc32(payload, length) != crc) {
      return absl::DataLossError(absl::StrCat("record ", out.records.size(), " at byte ", offset,
                                              " (", length, " bytes) fails its CRC"));
    }
    out.records.emplace_back(reinterpret_cast<const char*>(payload), length);
  }
  return out;
}

std::string LogLengthPath(const std::string& log_path) { return log_path + ".len"; }

namespace {

std::string LogLengthFile(uint64_t bytes) {
  std::string out(kLogLengthMagic, kMagicBytes);
  ByteWriter w(&out);
  w.U64(bytes);
  w.U32(Crc32(out.data(), out.size()));
  return out;
}

}  // namespace

absl::StatusOr<uint64_t> ParseLogLength(absl::string_view f) {
  ByteReader r(reinterpret_cast<const uint8_t*>(f.data()), f.size());
  const uint8_t* magic = r.Take(kMagicBytes);
  uint64_t bytes = 0;
  uint32_t crc = 0;
  if (f.size() != kLogLengthFileBytes || magic == nullptr ||
      std::memcmp(magic, kLogLengthMagic, kMagicBytes) != 0 || !r.U64(&bytes) || !r.U32(&crc) ||
      Crc32(f.data(), 16) != crc) {
    return absl::DataLossError("damaged (its magic, size or CRC is wrong)");
  }
  return bytes;
}

absl::StatusOr<RecordLogContents> ReadRecordLog(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (absl::IsNotFound(bytes.status())) {
    RecordLogContents none;
    none.exists = false;
    return none;
  }
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<RecordLogContents> contents = ParseRecordLog(*bytes);
  if (!contents.ok()) {
    return absl::Status(contents.status().code(),
                        absl::StrCat(path, ": ", contents.status().message()));
  }
  const std::string length_path = LogLengthPath(path);
  absl::StatusOr<std::string> length_file = ReadFile(length_path);
  if (absl::IsNotFound(length_file.status())) return contents;  // a log from before the file
  if (!length_file.ok()) return length_file.status();
  absl::StatusOr<uint64_t> acknowledged = ParseLogLength(*length_file);
  if (!acknowledged.ok()) {
    return absl::DataLossError(absl::StrCat(length_path, ": ", acknowledged.status().message()));
  }
  const uint64_t whole = bytes->size() - contents->torn_bytes;
  if (*acknowledged > whole) {
    return absl::DataLossError(absl::StrCat(
        path, ": its whole records end at byte ", whole, " but ", *acknowledged,
        " bytes were acknowledged (", length_path, "): the log was cut short or overwritten"));
  }
  contents->acknowledged_bytes = *acknowledged;
  return contents;
}

absl::StatusOr<std::unique_ptr<RecordLog>> RecordLog::Create(const std::string& path) {
  // The length file first: between the two a crash leaves the old log longer than its length
  // file says (read whole), never shorter.
  const std::string length_path = LogLengthPath(path);
  TERN_RETURN_IF_ERROR(WriteFileAtomically(length_path, LogLengthFile(kMagicBytes)));
  // The magic alone, atomically: a crash leaves either the old log or an empty new one.
  TERN_RETURN_IF_ERROR(WriteFileAtomically(path, absl::string_view(kRecordLogMagic, kMagicBytes)));
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path);
  const int length_fd = ::open(length_path.c_str(), O_WRONLY | O_CLOEXEC);
  if (length_fd < 0) {
    ::close(fd);
    return ErrnoError("cannot open", length_path);
  }
  return std::unique_ptr<RecordLog>(new RecordLog(path, fd, length_fd, kMagicBytes));
}

RecordLog::~RecordLog() {
  ::close(fd_);
  ::close(length_fd_);
}

bool RecordLog::Synced(uint64_t seq) const { return synced_ >= seq || !broken_.ok(); }

absl::Status RecordLog::Append(absl::string_view record) {
  if (record.size() > kMaxLogRecordBytes) {
    return absl::InvalidArgumentError("a log record is limited to 2 GiB");
  }
  std::string frame;
  ByteWriter w(&frame);
  w.U32(static_cast<uint32_t>(record.size()));
  w.U32(Crc32(record.data(), record.size()));
  w.U32(Crc32(frame.data(), frame.size()));
  mu_.Lock();
  absl::Status s = AppendLocked(frame, record);
  mu_.Unlock();
  return s;
}

absl::Status RecordLog::AppendLocked(absl::string_view frame, absl::string_view record) {
  if (!broken_.ok()) return broken_;
  if (!WriteAll(fd_, frame) || !WriteAll(fd_, record)) {
    broken_ = ErrnoError("cannot append to", path_);
    return broken_;
  }
  bytes_ += frame.size() + record.size();
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
    const std::string length = LogLengthFile(bytes_);
    mu_.Unlock();  // others append while this one syncs; the next sync takes them all
    // The records, then the length that says they are there (one sector, rewritten in place).
    const char* failed = nullptr;
    if (::fdatasync(fd_) != 0) {
      failed = "cannot sync";
    } else if (::pwrite(length_fd_, length.data(), length.size(), 0) !=
                   static_cast<ssize_t>(length.size()) ||
               ::fdatasync(length_fd_) != 0) {
      failed = "cannot record the length of";
    }
    const int err = errno;
    mu_.Lock();
    syncing_ = false;
    ++syncs_;
    if (failed != nullptr) {
      errno = err;
      broken_ = ErrnoError(failed, path_);
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

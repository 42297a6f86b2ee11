// libFuzzer target for what a restarting aggregator reads from disk: the update log's records
// (common/record_log.h), its length file and the snapshot's frame (server/state_store.h). Any bytes
// must give whole records or DATA_LOSS, never a read past the input, and a snapshot that parses
// must say so consistently.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/record_log.h"
#include "google/protobuf/stubs/logging.h"
#include "server/state_store.h"

// Protobuf logs every string field it finds not UTF-8; the fuzzer makes millions.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto log = tern::ParseRecordLog(bytes);
  if (log.ok()) {
    const size_t header =
        bytes.substr(0, 8) == tern::kRecordLogMagicV1 ? 8 : tern::kRecordHeaderBytes;
    size_t total = 0;
    for (const std::string& r : log->records) total += r.size() + header;
    if (total + log->torn_bytes > size) std::abort();
  } else if (log.status().code() != absl::StatusCode::kDataLoss) {
    std::abort();
  }
  auto length = tern::ParseLogLength(bytes);
  if (!length.ok() && length.status().code() != absl::StatusCode::kDataLoss) std::abort();
  if (length.ok() && size != tern::kLogLengthFileBytes) std::abort();
  bool framed = false;
  auto snapshot = tern::StateStore::ParseSnapshot(bytes, &framed);
  if (!snapshot.ok() && snapshot.status().code() != absl::StatusCode::kDataLoss) std::abort();
  if (framed != (bytes.substr(0, 8) == tern::kSnapshotMagic)) std::abort();
  return 0;
}

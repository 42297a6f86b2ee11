// The global models an aggregator published, by round: the newest few in full (for GetModel and
// the open round's downstream), the CRC-32 of every model a client may still catch up from, and
// the open round's downstream payloads, chunked once and shared by every client's Fetch.
//
// Thread-safety: not thread-safe; the aggregator calls it under its lock.
#ifndef TERN_SERVER_MODEL_HISTORY_H_
#define TERN_SERVER_MODEL_HISTORY_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "tern/v1/server.pb.h"
#include "tern/v1/tensor.pb.h"

namespace tern {

// The global model after `round`, with the counters as they were when that round closed.
struct KeptModel {
  int64_t round = 0;
  std::shared_ptr<const v1::TensorBundle> bundle = nullptr;
  v1::ServerStatus status = {};
};

// A downstream payload chunked for the wire, and what it costs.
struct ChunkedPayload {
  std::shared_ptr<const std::vector<v1::BundleChunk>> chunks = nullptr;
  uint64_t payload_bytes = 0;
  uint64_t wire_bytes = 0;
};

class ModelHistory {
 public:
  // Keeps the newest `keep_models` models (at least 1) and the CRC-32s of the newest
  // `keep_crcs` (at least 1): a client holding an older model gets the whole model anyway.
  ModelHistory(int keep_models, int keep_crcs);

  // The model of `m.round`, whose fp32 values have CRC-32 `crc`; forgets the older ones past
  // the limits and every chunked payload (they were of the previous model).
  void Publish(KeptModel m, uint32_t crc);
  // Forgets everything (a restored run publishes its model again).
  void Clear();

  bool empty() const { return models_.empty(); }
  // The newest model; only when !empty().
  const KeptModel& newest() const { return models_.back(); }
  // The model after `round` (the newest for round <= 0): Unavailable when that round has not
  // closed (or there is no model yet), NotFound when it is no longer kept.
  absl::StatusOr<KeptModel> Find(int64_t round) const;
  // The CRC-32 of the model after `round`, when it is still known.
  std::optional<uint32_t> Crc(int64_t round) const;

  // The open round's payload for clients catching up from `from` (-1: the model itself).
  const ChunkedPayload* Chunks(int64_t from) const;
  void KeepChunks(int64_t from, ChunkedPayload c) { chunks_[from] = std::move(c); }
  // A round opened: the payloads are made again for it.
  void ForgetChunks() { chunks_.clear(); }

  size_t crcs_kept() const { return crcs_.size(); }

 private:
  const size_t keep_models_, keep_crcs_;
  std::deque<KeptModel> models_;
  std::map<int64_t, uint32_t> crcs_;
  std::map<int64_t, ChunkedPayload> chunks_;
};

}  // namespace tern

#endif  // TERN_SERVER_MODEL_HISTORY_H_

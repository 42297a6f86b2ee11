// libFuzzer target for Gossip.Stream's answers as a sender reads them (worker/stream_reply.h):
// any bytes give a verdict or an error, and a verdict read back writes as the same verdict.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "worker/stream_reply.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::Status verdict;
  const absl::Status parsed = tern::ParseStreamReply(
      absl::string_view(reinterpret_cast<const char*>(data), size), &verdict);
  // A verdict's message near the size limit may not fit again with its code around it.
  if (!parsed.ok() || size + 32 > tern::kMaxStreamReplyBytes) return 0;
  absl::Status again;
  if (!tern::ParseStreamReply(tern::StreamReplyMessage(verdict, 0), &again).ok() ||
      again != verdict) {
    std::abort();
  }
  return 0;
}

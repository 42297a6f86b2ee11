// libFuzzer target for the bundle reassembler: the input is a sequence of length-prefixed
// serialized BundleChunk messages. Every path must end in OK or an error status, never a crash or
// an allocation beyond the assembler's limit.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/chunking.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tern::BundleAssembler assembler(/*max_bundle_bytes=*/1 << 20);
  while (size >= 2) {
    uint16_t len;
    std::memcpy(&len, data, 2);
    data += 2;
    size -= 2;
    len = static_cast<uint16_t>(std::min<size_t>(len, size));
    tern::v1::BundleChunk chunk;
    if (chunk.ParseFromArray(data, len)) {
      if (!assembler.Add(chunk).ok()) return 0;
      if (assembler.complete()) {
        (void)assembler.Finish();
        return 0;
      }
    }
    data += len;
    size -= len;
  }
  return 0;
}

// libFuzzer target for the IDX parser the built-in trainer reads datasets with: any bytes must
// give an array whose size matches its dimensions, or an error, and never allocate past the cap.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/workload/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = tern::ParseIdx(absl::string_view(reinterpret_cast<const char*>(data), size),
                               /*max_elements=*/1 << 20);
  if (parsed.ok()) {
    size_t count = 1;
    for (uint32_t d : parsed->dims) count *= d;
    if (count != parsed->data.size()) std::abort();
  }
  return 0;
}

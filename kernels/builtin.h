// Every codec tern ships, registered explicitly (no static self-registration, which a static
// library link can silently drop).
#ifndef TERN_KERNELS_BUILTIN_H_
#define TERN_KERNELS_BUILTIN_H_

#include <memory>

#include "absl/status/status.h"
#include "kernels/registry.h"

namespace tern {

absl::Status RegisterBuiltinCodecs(CodecRegistry* registry);

// A registry holding every built-in codec.
std::unique_ptr<CodecRegistry> NewBuiltinCodecRegistry();

}  // namespace tern

#endif  // TERN_KERNELS_BUILTIN_H_

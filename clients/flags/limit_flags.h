// The flags that bound what a daemon's incoming streams may hold (`tern worker`, `tern server`):
// core/rpc/stream_limits.h, docs/robustness.md.
#ifndef TERN_CLIENTS_FLAGS_LIMIT_FLAGS_H_
#define TERN_CLIENTS_FLAGS_LIMIT_FLAGS_H_

#include "core/rpc/stream_limits.h"

namespace tern {

// `defaults` with every limit flag that was given (0 keeps the daemon's default).
StreamLimitOptions StreamLimitsFromFlags(StreamLimitOptions defaults);

}  // namespace tern

#endif  // TERN_CLIENTS_FLAGS_LIMIT_FLAGS_H_

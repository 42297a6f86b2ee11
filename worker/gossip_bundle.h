// A gossip message (an algorithm's encoded parts) as the tern.v1.TensorBundle that travels in a
// Gossip.Push or Swap, and back.
//
// Thread-safety: plain functions over the caller's values.
#ifndef TERN_WORKER_GOSSIP_BUNDLE_H_
#define TERN_WORKER_GOSSIP_BUNDLE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/bundle_stream.h"
#include "tern/v1/tensor.pb.h"
#include "worker/algorithm.h"

namespace tern {

// The most workers a message's resync list names (TensorBundle.resync).
inline constexpr int kMaxResync = 1 << 16;

// A gossip message as a bundle; its parts become the bundle's tensors, in order.
v1::TensorBundle GossipToBundle(GossipMessage&& msg, const std::string& run_id, int64_t round,
                                int sender);
// The reverse, taking the payloads over (pass an rvalue to avoid copying them); checks only
// structure (names unique, numel == expected_numel, a shape multiplies out to numel, at most
// kMaxResync ids to resync, a proposed H of at most kMaxLocalSteps), not payloads.
absl::StatusOr<GossipMessage> GossipFromBundle(v1::TensorBundle bundle, uint64_t expected_numel);
// The same for a bundle whose large payloads were received in place: they stay there.
absl::StatusOr<GossipMessage> GossipFromBundle(ReceivedBundle received, uint64_t expected_numel);

}  // namespace tern

#endif  // TERN_WORKER_GOSSIP_BUNDLE_H_

// A joining worker's state taken from several peers at once: the state cut into as many slices as
// there are sources (Gossip.State with slices), one asked of each, all in flight together, so the
// transfer is neither one peer's uplink nor one connection's window, and no source sends it all.
//
// Thread-safety: FetchStateSlices may run on any thread; it calls the transport from one thread
// per slice in flight and returns once they are all done.
#ifndef TERN_WORKER_STATE_FETCH_H_
#define TERN_WORKER_STATE_FETCH_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/registry.h"
#include "worker/peer_transport.h"
#include "worker/state_share.h"

namespace tern {

struct StateFetchOptions {
  std::string run_id;
  uint64_t num_params = 0;
  const CodecRegistry* codecs = nullptr;
  // The group shares the state (diloco): every slice must be of one state, the same bytes
  // (JoinStateSlices). Otherwise each source's own model (a gossip joiner's mosaic of them).
  bool one_state = true;
  // How soon a source that has no state after the step yet is asked again.
  absl::Duration poll = absl::Milliseconds(50);
  // A source that has answered "not yet" for this long loses its slices to one that has not (it
  // may be far behind, or stuck waiting out a round deadline).
  absl::Duration straggler = absl::Seconds(2);
  // Asked before each call: true ends the fetch, CANCELLED (the worker is shutting down). Null:
  // never. Called from the slices' threads, with no lock held.
  std::function<bool()> stopped = nullptr;
};

struct FetchedState {
  GroupState state;
  std::vector<int> sources;  // the peer each slice came from, slice by slice
  uint64_t bytes = 0;        // the serialized bundles received
  // From the start of the first call that brought a slice to the end of the last: the time on
  // the wire, without the waits for a source to come to the step.
  absl::Duration transfer;
};

// The members a worker going on in a running run (restarted, or admitted while it runs) takes as
// there from its first round, awaited like any: `members_then` (the scheduler's members in the
// round it is a member from) and the peers whose position says they mixed an exchange, less
// those that answered without one while another had (still taking the state themselves).
// Members it learns of later but not here are newcomers to it, not awaited until they say from
// which round they send. `positions` by worker id; `me` is always there. Sorted.
std::vector<int> MembersAlreadyThere(
    const std::vector<int>& members_then,
    const std::vector<absl::StatusOr<PeerTransport::Position>>& positions, int me);

// The state after step `min_step` or later from `sources` (peer ids, the preferred first; at
// least one): one slice each, at once, each slice asked again a poll later while
// its source has none yet, none waiting for another. A source that refuses (gone, bad bytes)
// loses its slices to another; with one_state, slices of another state than the one most of them
// are of (a peer that handed over after another step) are asked again of the sources that sent
// that one. Unavailable (the last source's refusal) when every source failed, so
// the caller can find others; FailedPrecondition, OutOfRange and the like from a source as they are
// (every source would say the same); DeadlineExceeded at `deadline`; Cancelled once
// `options.stopped` says so (a call under way ends first).
absl::StatusOr<FetchedState> FetchStateSlices(PeerTransport& transport,
                                              const StateFetchOptions& options,
                                              std::vector<int> sources, int64_t min_step,
                                              absl::Time deadline);

}  // namespace tern

#endif  // TERN_WORKER_STATE_FETCH_H_

// What a neighbour's message must pass before the engine takes it (RoundEngine::Deliver for a
// round's push, HandleSwap and RunSwap for SwarmSGD's exchanges): it is of this run, from another
// worker that is this worker's neighbour in the message's round, with exactly the parts the
// algorithm sends (and any of those it may send besides), each of which its codec would decode
// (checked without decoding, or by the scan made as it arrived); and, with the norm guard on, each
// part's norm within the guard's factor of what this worker's own messages of that part measured.
// The round window is the inbox's. diloco's warm-up exchanges (rounds before sync_steps) move the
// model by one step, its outer rounds by H steps: the guard keeps a reference for each, so the
// first outer round is not judged by the warm-up's norms (it is judged once this worker's own outer
// rounds give a reference).
//
// Thread-safety: thread-safe. Check is called from gRPC's threads and the round loop at once;
// ObserveOwn from the round loop. The norm guards are under their own lock; the topology and
// codecs given must outlive the check.
#ifndef TERN_WORKER_ARRIVAL_CHECK_H_
#define TERN_WORKER_ARRIVAL_CHECK_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/model/norm_guard.h"
#include "core/topology/topology.h"
#include "kernels/payload_scans.h"
#include "kernels/registry.h"
#include "tern/v1/tensor.pb.h"
#include "worker/algorithm.h"

namespace tern {

struct ArrivalCheckOptions {
  std::string run_id;
  int worker_id = 0;
  int num_workers = 1;
  NormGuardOptions norm_guard;
  int64_t sync_steps = 0;  // diloco's warm-up rounds (AlgorithmOptions::sync_steps)
};

class ArrivalCheck {
 public:
  // `parts`: the part names every message must carry (the algorithm's MessageParts);
  // `optional_parts`: those it may carry besides (OptionalParts), checked alike when there.
  ArrivalCheck(ArrivalCheckOptions options, const Topology* topology, const CodecRegistry* codecs,
               std::vector<std::string> parts, std::vector<std::string> optional_parts = {})
      : options_(std::move(options)),
        topology_(topology),
        codecs_(codecs),
        parts_(std::move(parts)),
        optional_parts_(std::move(optional_parts)) {}

  // The sender of a message of this run (another worker's id), or InvalidArgument.
  absl::StatusOr<int> SenderOf(const v1::TensorBundle& bundle) const;
  // Checks a peer's bundle for `bucket` of a model of `num_params` values (Unavailable while
  // there is no model); returns the sender and the message, marked checked.
  absl::StatusOr<std::pair<int, GossipMessage>> Check(ReceivedBundle received, int bucket,
                                                      uint64_t num_params,
                                                      PayloadScans* scans = nullptr) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Records the norms of this worker's own message of round `round`'s parts: the guard's
  // reference.
  void ObserveOwn(int bucket, int64_t round, const GossipMessage& msg) ABSL_LOCKS_EXCLUDED(mu_);
  // diloco's H moved f times as long (or short) for a bucket: its outer rounds' references
  // scale with it, so the first updates over the new H are judged by what they may be.
  void ScaleOuterReference(int bucket, double f) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Validates part `name` of a peer's message and, with the guard on, checks its norm; by
  // `scan` (may be null), the part's check made as it arrived, where there is one.
  absl::Status CheckPart(const std::string& name, int bucket, int64_t round, int sender,
                         const EncodedTensor& t, PayloadScan* scan) const ABSL_LOCKS_EXCLUDED(mu_);
  // The norm guard of a part of a bucket's messages of round `round`'s kind.
  std::string GuardKey(const std::string& part, int bucket, int64_t round) const;

  const ArrivalCheckOptions options_;
  const Topology* const topology_;
  const CodecRegistry* const codecs_;
  const std::vector<std::string> parts_;
  const std::vector<std::string> optional_parts_;
  mutable absl::Mutex mu_;
  std::map<std::string, NormGuard> guards_ ABSL_GUARDED_BY(mu_);  // by GuardKey
};

}  // namespace tern

#endif  // TERN_WORKER_ARRIVAL_CHECK_H_

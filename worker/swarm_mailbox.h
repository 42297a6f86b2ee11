// SwarmSGD's meeting point in a worker: its model as neighbours get it (published after each
// step), and the models neighbours swapped in, waiting to be averaged in at its next step. The
// gossip service's Swap calls Exchange; the round loop publishes and takes.
//
// Thread-safety: thread-safe.
#ifndef TERN_WORKER_SWARM_MAILBOX_H_
#define TERN_WORKER_SWARM_MAILBOX_H_

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "tern/v1/tensor.pb.h"
#include "worker/algorithm.h"

namespace tern {

class SwarmMailbox {
 public:
  // At most `max_waiting` neighbours' models wait at once: a flood of swaps cannot grow memory
  // without limit.
  explicit SwarmMailbox(size_t max_waiting) : max_waiting_(max_waiting) {}

  void Publish(std::shared_ptr<const v1::TensorBundle> ours) ABSL_LOCKS_EXCLUDED(mu_);
  // Leaves `theirs` (sender, model) to be averaged in and answers with our published model.
  // Unavailable before the first Publish and after Close; ResourceExhausted when full.
  absl::StatusOr<std::shared_ptr<const v1::TensorBundle>> Exchange(
      std::pair<int, GossipMessage> theirs) ABSL_LOCKS_EXCLUDED(mu_);
  // The models waiting, oldest first; the mailbox is empty after.
  std::vector<std::pair<int, GossipMessage>> Take() ABSL_LOCKS_EXCLUDED(mu_);
  // Refuses every later Exchange.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t max_waiting_;
  absl::Mutex mu_;
  std::shared_ptr<const v1::TensorBundle> published_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int, GossipMessage>> waiting_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tern

#endif  // TERN_WORKER_SWARM_MAILBOX_H_

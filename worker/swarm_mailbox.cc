#include "worker/swarm_mailbox.h"

namespace tern {

void SwarmMailbox::Publish(std::shared_ptr<const v1::TensorBundle> ours) {
  absl::MutexLock lock(&mu_);
  published_ = std::move(ours);
}

absl::StatusOr<std::shared_ptr<const v1::TensorBundle>> SwarmMailbox::Exchange(
    std::pair<int, GossipMessage> theirs) {
  absl::MutexLock lock(&mu_);
  if (published_ == nullptr) return absl::UnavailableError("no model published yet");
  if (closed_) return absl::UnavailableError("worker is shutting down");
  if (waiting_.size() >= max_waiting_) {
    return absl::ResourceExhaustedError("too many averages pending; retry later");
  }
  waiting_.push_back(std::move(theirs));
  return published_;
}

std::vector<std::pair<int, GossipMessage>> SwarmMailbox::Take() {
  std::vector<std::pair<int, GossipMessage>> taken;
  absl::MutexLock lock(&mu_);
  taken.swap(waiting_);
  return taken;
}

void SwarmMailbox::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

}  // namespace tern

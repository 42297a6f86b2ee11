// Long-polling Fetch calls wait here for the event that changes their answer (their client
// sampled in a round that opened, the run done, the server stopping) instead of re-checking on a
// timer: each waiting call parks a grpc::Alarm set to the end of its long poll under its client's
// id, and Wake cancels the parked alarms of the given clients (WakeAll: of every client), so each
// such call's alarm callback runs at once and the call asks the aggregator again. A round that
// opens wakes only the clients it sampled: the other clients' answer is still WAIT.
//
// A call reads generation() before it asks the aggregator and parks with that number: Park
// refuses (the call asks again at once) when an event came in between, so no wake-up is lost.
//
// Thread-safety: thread-safe. Alarms are cancelled outside the internal lock.
#ifndef TERN_SERVER_FETCH_WAITERS_H_
#define TERN_SERVER_FETCH_WAITERS_H_

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/alarm.h"

namespace tern {

class FetchWaiters {
 public:
  // One parked wait: its alarm is set by the caller before Park and lives as long as either the
  // caller or a pending WakeAll holds it.
  struct Waiter {
    grpc::Alarm alarm;
  };

  uint64_t generation() const;
  // Registers `waiter` (its alarm already set) for `client` unless an event came after `seen`;
  // false then, and the caller cancels its own alarm.
  bool Park(uint32_t client, const std::shared_ptr<Waiter>& waiter, uint64_t seen);
  // An event: bumps the generation and cancels the alarms of the parked waiters of `clients`
  // (WakeAll: of all) still alive.
  void Wake(const std::vector<int>& clients);
  void WakeAll();
  // Parked waiters not yet woken or gone (for tests).
  size_t parked() const;

 private:
  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Weak: a call that ended (its alarm fired at the end of the poll) is dropped when its client
  // parks again or is woken.
  std::unordered_map<uint32_t, std::vector<std::weak_ptr<Waiter>>> parked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tern

#endif  // TERN_SERVER_FETCH_WAITERS_H_

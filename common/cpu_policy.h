// How the kernel schedules a daemon's threads against the other processes on its host. A worker
// usually shares its cores with the trainer it serves: its network threads wake for every few
// packets of an exchange, and under the normal policy each wake-up may preempt the trainer
// (a reschedule interrupt and a context switch mid-computation). Under SCHED_BATCH a waking
// thread does not preempt; it runs at the next tick or when a core goes idle, so the packets
// that arrived meanwhile are read at once. A core with nothing else to do runs it at once as
// before (docs/worker.md, "Sharing cores with the trainer").
//
// Thread-safety: SetThreadCpuPolicy changes the calling thread only; call it before starting
// the threads that should inherit it.
#ifndef TERN_COMMON_CPU_POLICY_H_
#define TERN_COMMON_CPU_POLICY_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tern {

enum class CpuPolicy {
  kNormal,  // SCHED_OTHER: a waking thread may preempt the running one
  kBatch,   // SCHED_BATCH: it waits for the tick or an idle core
};

// "normal" or "batch".
absl::StatusOr<CpuPolicy> ParseCpuPolicy(absl::string_view name);
absl::string_view CpuPolicyName(CpuPolicy policy);

// Sets the calling thread's policy (nice value unchanged); threads it starts afterwards
// inherit it. Fails with the kernel's reason (e.g. a seccomp filter that forbids it).
absl::Status SetThreadCpuPolicy(CpuPolicy policy);
// The calling thread's policy; kNormal for any policy other than SCHED_BATCH.
CpuPolicy ThreadCpuPolicy();

}  // namespace tern

#endif  // TERN_COMMON_CPU_POLICY_H_

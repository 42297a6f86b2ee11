#include "common/cpu_policy.h"

#include <sched.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tern {

absl::StatusOr<CpuPolicy> ParseCpuPolicy(absl::string_view name) {
  if (name == "normal") return CpuPolicy::kNormal;
  if (name == "batch") return CpuPolicy::kBatch;
  return absl::InvalidArgumentError(
      absl::StrCat("cpu policy '", name, "': expected 'normal' or 'batch'"));
}

absl::string_view CpuPolicyName(CpuPolicy policy) {
  return policy == CpuPolicy::kBatch ? "batch" : "normal";
}

absl::Status SetThreadCpuPolicy(CpuPolicy policy) {
  const sched_param param{.sched_priority = 0};
  // pid 0: the calling thread (Linux schedules threads, not processes).
  if (sched_setscheduler(0, policy == CpuPolicy::kBatch ? SCHED_BATCH : SCHED_OTHER, &param) != 0) {
    const int err = errno;
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot set the cpu policy to ", CpuPolicyName(policy), ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

CpuPolicy ThreadCpuPolicy() {
  return sched_getscheduler(0) == SCHED_BATCH ? CpuPolicy::kBatch : CpuPolicy::kNormal;
}

}  // namespace tern

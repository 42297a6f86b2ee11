#include "core/workload/blas_core.h"

#include <unistd.h>

#include <cstdlib>

#include "cblas.h"

namespace tern {

CpuVectorUnits DetectCpuVectorUnits() {
  // libgcc's checks include the OS's XSAVE support for the wider registers.
  __builtin_cpu_init();
  CpuVectorUnits u;
  u.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  u.avx512 = u.avx2_fma && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return u;
}

std::string BetterBlasCore(absl::string_view chosen, const CpuVectorUnits& units) {
  // OpenBLAS 0.3.21 names its x86-64 fallback Prescott; a CPU it knows keeps its own choice.
  if (chosen != "Prescott") return "";
  if (units.avx512) return "SkylakeX";
  if (units.avx2_fma) return "Haswell";
  return "";
}

std::string BlasCoreName() {
  const char* name = openblas_get_corename();
  return name == nullptr ? "" : name;
}

void ChooseBlasCoreOrReexec(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // the user's, or ours after exec
  const std::string core = BetterBlasCore(BlasCoreName(), DetectCpuVectorUnits());
  if (core.empty()) return;
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  execv("/proc/self/exe", argv);  // returns only on failure: run on with the generic kernels
}

}  // namespace tern

// Which OpenBLAS kernels the built-in models run on. OpenBLAS picks its kernels by CPU model when
// it loads; a model newer than the library (Debian 12 ships 0.3.21, which predates Emerald
// Rapids, model 207) gets its generic x86-64 kernels, "Prescott", 3-5x slower than the AVX2 or
// AVX-512 ones the CPU can run. OpenBLAS takes OPENBLAS_CORETYPE, read only as it loads, so the
// tern binary sets it and starts itself again (ChooseBlasCoreOrReexec).
//
// Thread-safety: the functions read process state; call ChooseBlasCoreOrReexec first thing in
// main, before any thread starts.
#ifndef TERN_CORE_WORKLOAD_BLAS_CORE_H_
#define TERN_CORE_WORKLOAD_BLAS_CORE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace tern {

struct CpuVectorUnits {
  bool avx2_fma = false;  // AVX2 and FMA, with the OS saving their registers
  bool avx512 = false;    // AVX-512 F, CD, BW, DQ and VL (OpenBLAS's SkylakeX kernels' needs)
};

// What this CPU (and its OS) supports.
CpuVectorUnits DetectCpuVectorUnits();

// The core OpenBLAS should be told to use when it chose `chosen` on a CPU with `units`: the
// best the CPU runs when OpenBLAS fell back to its generic kernels ("Prescott"), else empty (its
// own choice stands).
std::string BetterBlasCore(absl::string_view chosen, const CpuVectorUnits& units);

// The kernels the loaded OpenBLAS runs ("SkylakeX", "Haswell", "Prescott", ...).
std::string BlasCoreName();

// When OPENBLAS_CORETYPE is unset and BetterBlasCore names a core, sets the variable and
// re-executes /proc/self/exe with `argv` (returns only if that fails, leaving the variable
// set). Call first in main().
void ChooseBlasCoreOrReexec(char** argv);

}  // namespace tern

#endif  // TERN_CORE_WORKLOAD_BLAS_CORE_H_

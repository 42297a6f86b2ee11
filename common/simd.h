// TERN_MULTIVERSION marks a hot loop to be compiled twice, for AVX2 and for baseline x86-64, with
// the choice made once at load time (GCC/Clang target_clones + ifunc). Binaries stay portable while
// the loops run vectorised on the machines we train on. Results do not depend on the version taken:
// the project builds with -ffp-contract=off semantics (ISO C++), so no FMA contraction sneaks in.
#ifndef TERN_COMMON_SIMD_H_
#define TERN_COMMON_SIMD_H_

#if defined(__x86_64__) && defined(__GNUC__) && !defined(TERN_NO_MULTIVERSION) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__clang__)
#define TERN_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define TERN_MULTIVERSION
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#define TERN_X86_DISPATCH 1
#include <cpuid.h>
#endif

namespace tern {

// The widest hand-written SIMD level to use: the CPU's, capped by the environment variable
// TERN_SIMD=avx512|avx2|none (read once). Every level gives byte-identical payloads; the cap lets
// tests run each code path on one machine and users rule a path out when debugging.
enum class SimdLevel { kNone = 0, kAvx2 = 1, kAvx512 = 2 };
SimdLevel SimdCap();

// True when the CPU has AVX2 and F16C (checked once), for loops written with intrinsics.
inline bool CpuHasAvx2F16c() {
#if defined(TERN_X86_DISPATCH)
  static const bool has = [] {
    unsigned a, b, c, d;
    // F16C is CPUID.1:ECX bit 29 (clang 14's __builtin_cpu_supports does not know "f16c").
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) &&
           SimdCap() >= SimdLevel::kAvx2;
  }();
  return has;
#else
  return false;
#endif
}

// True when the CPU has AVX-512 F/BW/DQ/VL and BMI2 (Skylake-SP, Ice Lake, Sapphire Rapids, Zen 4),
// for loops written with AVX-512 intrinsics.
inline bool CpuHasAvx512() {
#if defined(TERN_X86_DISPATCH)
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("bmi2") &&
                          SimdCap() >= SimdLevel::kAvx512;
  return has;
#else
  return false;
#endif
}

// CpuHasAvx512() plus AVX512-VBMI (byte permutes across registers: Ice Lake, Sapphire Rapids,
// Zen 4).
inline bool CpuHasAvx512Vbmi() {
#if defined(TERN_X86_DISPATCH)
  static const bool has = CpuHasAvx512() && __builtin_cpu_supports("avx512vbmi");
  return has;
#else
  return false;
#endif
}

}  // namespace tern

#endif  // TERN_COMMON_SIMD_H_

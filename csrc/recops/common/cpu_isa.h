// Run-time choice of the CPU instruction set for hot kernels. The build stays portable (no
// -march=native): a family compiles its hot kernels several times, once per instruction set, each
// copy in its own namespace between RECOPS_TARGET_<ISA>_BEGIN / RECOPS_TARGET_END, and calls the
// best copy the CPU supports. RECOPS_CPU_ISA=baseline|avx2|avx512|amx caps the choice (for tests
// and comparisons); it never raises it above what the CPU supports. kAmx is AVX-512 with
// AVX512_BF16 and the AMX-BF16 tiles, which kernels drive themselves (attention/kernels/
// native_bf16.h) where the OS grants them.
//
// A variant translation unit must include every external header before RECOPS_TARGET_*_BEGIN, so
// that only its own (namespaced) code is compiled for the wider instruction set; inline functions
// from shared headers would otherwise be emitted with different code in different objects.
#pragma once

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#define RECOPS_X86_VARIANTS 1
// Each _Pragma needs one unbroken string literal.
// clang-format off
// AVX2 + FMA + F16C (Haswell, Zen 1 and later).
#define RECOPS_TARGET_AVX2_BEGIN \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,f16c,bmi,bmi2,popcnt\")")
// AVX-512 F/BW/VL/DQ with 512-bit vectors preferred (Skylake-SP, Zen 4 and later).
#define RECOPS_TARGET_AVX512_BEGIN \
  _Pragma("GCC push_options") \
  _Pragma("GCC target(\"avx2,fma,f16c,bmi,bmi2,popcnt,avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512\")")
// AVX-512 with AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4 and later), and the AMX tile
// instructions, which the compiler emits only for their intrinsics: code without them runs on
// AVX512_BF16 CPUs that lack AMX.
#define RECOPS_TARGET_AVX512_BF16_AMX_BEGIN \
  _Pragma("GCC push_options") \
  _Pragma("GCC target(\"avx2,fma,f16c,bmi,bmi2,popcnt,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,prefer-vector-width=512\")")
// clang-format on
#define RECOPS_TARGET_END _Pragma("GCC pop_options")
#else
#define RECOPS_X86_VARIANTS 0
#endif

// Forces a generic body (shared header, compiled for the baseline instruction set) into each
// instruction-set variant that calls it: an out-of-line copy would run the baseline code.
#if defined(__GNUC__)
#define RECOPS_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define RECOPS_ALWAYS_INLINE inline
#endif

// A family's per-variant table: RECOPS_DECLARE_VARIANT_TABLE(Type, name) declares the `name` each
// of its variant_<isa>.cpp defines in namespace baseline / avx2 / avx512 (inside the family's
// kernels namespace), and RECOPS_VARIANT_TABLE(isa, name) is the one of the widest variant `isa`
// allows.
#if RECOPS_X86_VARIANTS
#define RECOPS_DECLARE_VARIANT_TABLE(Type, name) \
  namespace baseline {                           \
  extern const Type name;                        \
  }                                              \
  namespace avx2 {                               \
  extern const Type name;                        \
  }                                              \
  namespace avx512 {                             \
  extern const Type name;                        \
  }
#define RECOPS_VARIANT_TABLE(isa, name)              \
  ((isa) >= ::recops::CpuIsa::kAvx512 ? avx512::name \
   : (isa) == ::recops::CpuIsa::kAvx2 ? avx2::name   \
                                      : baseline::name)
#else
#define RECOPS_DECLARE_VARIANT_TABLE(Type, name) \
  namespace baseline {                           \
  extern const Type name;                        \
  }
#define RECOPS_VARIANT_TABLE(isa, name) (static_cast<void>(isa), baseline::name)
#endif

namespace recops {

enum class CpuIsa { kBaseline = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };

// Whether the CPU has AVX512_BF16 (bf16 dot products and fp32 -> bf16 conversion instructions).
inline bool cpu_has_avx512_bf16() {
#if RECOPS_X86_VARIANTS
  static const bool has = (__builtin_cpu_init(), __builtin_cpu_supports("avx512bf16"));
  return has;
#else
  return false;
#endif
}

// The widest instruction set this CPU runs, ignoring RECOPS_CPU_ISA.
inline CpuIsa probe_cpu_isa() {
#if RECOPS_X86_VARIANTS
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq");
  if (!avx512) return avx2 ? CpuIsa::kAvx2 : CpuIsa::kBaseline;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;  // CPUID 7.0 EDX: bit 22 AMX-BF16, 24 AMX-TILE
  const bool amx = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0 && ((edx >> 22) & 1u) &&
                   ((edx >> 24) & 1u) && cpu_has_avx512_bf16();
  return amx ? CpuIsa::kAmx : CpuIsa::kAvx512;
#else
  return CpuIsa::kBaseline;
#endif
}

inline CpuIsa supported_cpu_isa() {
  static const CpuIsa supported = probe_cpu_isa();
  return supported;
}

// The instruction set kernels use: the supported one, capped by RECOPS_CPU_ISA (read per call so
// tests can switch it).
inline CpuIsa cpu_isa() {
  const CpuIsa supported = supported_cpu_isa();
  const char* cap = std::getenv("RECOPS_CPU_ISA");
  if (cap == nullptr) return supported;
  CpuIsa requested = supported;
  if (std::strcmp(cap, "baseline") == 0) requested = CpuIsa::kBaseline;
  if (std::strcmp(cap, "avx2") == 0) requested = CpuIsa::kAvx2;
  if (std::strcmp(cap, "avx512") == 0) requested = CpuIsa::kAvx512;
  return static_cast<int>(requested) < static_cast<int>(supported) ? requested : supported;
}

}  // namespace recops

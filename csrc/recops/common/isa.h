// RECOPS_ISA_CLONES compiles a hot element-wise function once per x86-64 level (AVX-512, AVX2+FMA,
// baseline) and lets the loader pick the best for the running CPU, so builds stay portable (no
// -march=native) while inner loops use the widest vectors available.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#define RECOPS_ISA_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define RECOPS_ISA_CLONES
#endif

// Forces a generic body into each ISA clone of its caller (an out-of-line copy would be compiled
// for the baseline ISA only).
#if defined(__GNUC__)
#define RECOPS_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define RECOPS_ALWAYS_INLINE inline
#endif

// invert_permute's kernel: inverse[permute[i]] = i, validating that permute is a permutation of
// [0, n) as it inverts.
//
// The scatter is the whole cost, and where its stores land decides it: threads that each scatter
// a slice of the entries all store into every cache line of `inverse`, which then bounces between
// their caches. On cores in different core complexes two threads ran 2x slower than one (0.35
// vs 0.17 ms at 409600 entries; within one complex, which shares its cache, they take 0.10). So
// each thread instead owns a slice of the *destination*: it scans all of permute, keeps the
// entries that land in its slice, and writes only there (0.16 ms either way). On AVX-512 CPUs the
// scan is a vector compare-and-compress (invert_avx512.cpp) and costs little next to the stores;
// elsewhere the per-entry "is it mine" branch would mispredict half the time, so the portable
// kernel partitions the entries instead and accepts the sharing.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "recops/common/cpu_isa.h"
#include "recops/common/parallel.h"

namespace recops::sparse::kernels {

// Entries of permute at or above this many per thread before a second thread is used: each thread
// scans all n entries, so a slice must hold enough stores to pay for the scan and the fork.
constexpr int64_t kMinEntriesPerOwner = 16 * 1024;

// AVX-512 (invert_avx512.cpp): inverse[p - lo] = i for every entry p = permute[i] in [lo, hi),
// with inverse pointing at slot lo.
void scatter_owned_avx512(const int32_t* permute, int64_t n, int64_t lo, int64_t hi,
                          int32_t* inverse_slice);
void scatter_owned_avx512(const int64_t* permute, int64_t n, int64_t lo, int64_t hi,
                          int64_t* inverse_slice);

// inverse[permute[i]] = i for i in [begin, end) whose entry is in [0, n). (Pointers by value:
// captured by reference in a parallel lambda, they and n would be reloaded from memory on every
// iteration, as any store might alias them. That reload made the scatter 1.6x slower than
// FBGEMM's.)
template <typename perm_t>
void scatter_inverse(const perm_t* permute, int64_t begin, int64_t end, int64_t n,
                     perm_t* inverse) {
  for (int64_t i = begin; i < end; ++i) {
    const perm_t p = permute[i];
    if (static_cast<uint64_t>(p) < static_cast<uint64_t>(n)) inverse[p] = static_cast<perm_t>(i);
  }
}

// Whether any of inverse[begin, end) is still negative: the OR of the values has the sign bit
// set. (GCC vectorises this integer OR; the loop of bool ORs it left scalar took 2x the scatter's
// share of the time.)
template <typename perm_t>
bool any_unstored(const perm_t* inverse, int64_t begin, int64_t end) {
  perm_t bits = 0;
  for (int64_t j = begin; j < end; ++j) bits |= inverse[j];
  return bits < 0;
}

// Portable kernel: fill, scatter and check as three phases of one parallel region over slices of
// the entries (fill and check are sequential and cost little next to the scattered stores).
template <typename perm_t>
bool invert_by_entry_slices(const perm_t* permute, int64_t n, perm_t* inverse) {
  constexpr int64_t kGrain = 32 * 1024;
  enum Pass { kFill, kScatter, kCheck };
  std::atomic<bool> ok{true};
  parallel_phases<3>(n, kGrain, [&](int pass, int64_t begin, int64_t end) {
    if (pass == kFill) {
      std::fill(inverse + begin, inverse + end, perm_t{-1});
    } else if (pass == kScatter) {
      scatter_inverse(permute, begin, end, n, inverse);
    } else if (any_unstored(inverse, begin, end)) {
      ok = false;
    }
  });
  return ok;
}

// AVX-512 kernel: every thread fills, scatters into and checks only its own slice of inverse, so
// the three passes need no barrier between them and the slice stays in the thread's cache.
template <typename perm_t>
bool invert_by_owned_slices(const perm_t* permute, int64_t n, perm_t* inverse) {
  const int64_t owners = std::clamp<int64_t>(n / kMinEntriesPerOwner, 1, max_threads());
  std::atomic<bool> ok{true};
  parallel_for(0, owners, 1, [&](int64_t o0, int64_t o1) {
    for (int64_t owner = o0; owner < o1; ++owner) {
      const int64_t lo = n * owner / owners, hi = n * (owner + 1) / owners;
      std::fill(inverse + lo, inverse + hi, perm_t{-1});
      scatter_owned_avx512(permute, n, lo, hi, inverse + lo);
      if (any_unstored(inverse, lo, hi)) ok = false;
    }
  });
  return ok;
}

// inverse[permute[i]] = i. Returns false, leaving `inverse` unspecified, unless permute is a
// permutation of [0, n). Every slot starts at -1 and entries outside [0, n) are skipped: n entries
// store into all n slots iff every one is in range and none repeats, so one pass for a slot still
// at -1 finds both faults (the caller then names the offending entry).
template <typename perm_t>
bool invert_permutation(const perm_t* permute, int64_t n, perm_t* inverse) {
  if (n <= 0) return true;
#if RECOPS_X86_VARIANTS
  if (cpu_isa() >= CpuIsa::kAvx512) return invert_by_owned_slices(permute, n, inverse);
#endif
  return invert_by_entry_slices(permute, n, inverse);
}

// The first position i whose entry permute[i] appeared before it, or -1; every entry is in
// [0, n). Names the fault once invert_permutation has refused permute (entries out of range are
// the other fault, found by first_out_of_range).
template <typename perm_t>
int64_t first_repeated_entry(const perm_t* permute, int64_t n) {
  std::vector<bool> seen(n, false);
  for (int64_t i = 0; i < n; ++i) {
    if (seen[permute[i]]) return i;
    seen[permute[i]] = true;
  }
  return -1;
}

}  // namespace recops::sparse::kernels

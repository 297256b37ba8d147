// Helpers shared by the kernel tests: a scoped thread count (so multi-chunk paths run whatever
// the machine's core count), the instruction sets this CPU runs, and deterministic test data.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "recops/common/cpu_isa.h"

namespace recops::test {

// Runs the parallel backend with `threads` threads while alive (OpenMP runs more threads than
// cores if asked, so chunked and owner-computes paths are reached on any machine).
class ScopedThreads {
 public:
  explicit ScopedThreads(int threads) : previous_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
  }
  ~ScopedThreads() { omp_set_num_threads(previous_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int previous_;
};

inline bool cpu_runs(CpuIsa isa) {
  return static_cast<int>(isa) <= static_cast<int>(probe_cpu_isa());
}

inline const char* isa_name(CpuIsa isa) {
  return isa == CpuIsa::kAmx      ? "amx"
         : isa == CpuIsa::kAvx512 ? "avx512"
         : isa == CpuIsa::kAvx2   ? "avx2"
                                  : "baseline";
}

// Skips the calling test (GTEST_SKIP returns from it) where the CPU lacks `isa`.
#define RECOPS_SKIP_UNLESS_CPU_RUNS(isa)                                                    \
  do {                                                                                      \
    if (!::recops::test::cpu_runs(isa)) {                                                   \
      GTEST_SKIP() << "this CPU does not run " << ::recops::test::isa_name(isa) << " code"; \
    }                                                                                       \
  } while (0)

// n values drawn uniformly from [lo, hi] (integers) with a fixed seed.
template <typename T>
std::vector<T> random_integers(int64_t n, int64_t lo, int64_t hi, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  std::vector<T> out(n);
  for (auto& x : out) x = static_cast<T>(dist(rng));
  return out;
}

// n floats drawn uniformly from [-1, 1] with a fixed seed.
inline std::vector<float> random_floats(int64_t n, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> out(n);
  for (auto& x : out) x = dist(rng);
  return out;
}

// Offsets [0, l0, l0 + l1, ...] of the given lengths.
template <typename T>
std::vector<T> offsets_of(const std::vector<T>& lengths) {
  std::vector<T> offsets(lengths.size() + 1, 0);
  for (size_t i = 0; i < lengths.size(); ++i) offsets[i + 1] = offsets[i] + lengths[i];
  return offsets;
}

// Sums per-chunk / per-thread partials [parts, n] into [n].
template <typename T>
std::vector<T> sum_parts(const std::vector<T>& parts, size_t n) {
  std::vector<T> out(n, T(0));
  for (size_t p = 0; p < parts.size() / n; ++p) {
    for (size_t i = 0; i < n; ++i) out[i] += parts[p * n + i];
  }
  return out;
}

// Every element of got within tol * (1 + |want|) of want's.
inline void expect_near_all(const std::vector<double>& got, const std::vector<double>& want,
                            double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " at " << i;
  }
}

}  // namespace recops::test

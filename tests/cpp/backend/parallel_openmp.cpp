// The C++ tests' parallel backend (csrc/recops/common/parallel.h) on OpenMP, with
// at::parallel_for's OpenMP contract: at most one chunk per thread, each of at least `grain`
// items, and a range that fits one grain, a single thread or a call from inside a parallel region
// runs inline, its body then counting as inside a region.
#include <omp.h>

#include <algorithm>

#include "recops/common/parallel.h"

namespace recops {
namespace {

thread_local bool t_in_parallel_region = false;

class ParallelRegionGuard {
 public:
  ParallelRegionGuard() : previous_(t_in_parallel_region) { t_in_parallel_region = true; }
  ~ParallelRegionGuard() { t_in_parallel_region = previous_; }

 private:
  bool previous_;
};

}  // namespace

int max_threads() {
  return omp_get_max_threads();
}

bool in_parallel_region() {
  return t_in_parallel_region;
}

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  FunctionRef<void(int64_t, int64_t)> body) {
  if (begin >= end) return;
  const int64_t n = end - begin;
  grain = std::max<int64_t>(grain, 1);
  if (n <= grain || t_in_parallel_region || omp_get_max_threads() == 1) {
    ParallelRegionGuard guard;
    body(begin, end);
    return;
  }
#pragma omp parallel
  {
    const int64_t threads = std::min<int64_t>(omp_get_num_threads(), (n + grain - 1) / grain);
    const int64_t tid = omp_get_thread_num();
    const int64_t chunk = (n + threads - 1) / threads;
    const int64_t chunk_begin = begin + tid * chunk;
    if (tid < threads && chunk_begin < end) {
      ParallelRegionGuard guard;
      body(chunk_begin, std::min(end, chunk_begin + chunk));
    }
  }
}

}  // namespace recops

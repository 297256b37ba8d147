// The extension's parallel backend (common/parallel.h): PyTorch's intra-op thread pool, so that
// recops' kernels follow torch.set_num_threads and nest inside PyTorch's own parallel regions.
#include <ATen/Parallel.h>

#include "recops/common/parallel.h"

namespace recops {

int max_threads() {
  return at::get_num_threads();
}

bool in_parallel_region() {
  return at::in_parallel_region();
}

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  FunctionRef<void(int64_t, int64_t)> body) {
  at::parallel_for(begin, end, grain,
                   [&](int64_t chunk_begin, int64_t chunk_end) { body(chunk_begin, chunk_end); });
}

}  // namespace recops

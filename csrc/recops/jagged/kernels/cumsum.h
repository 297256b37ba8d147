// Row-wise complete cumsum (FBGEMM's asynchronous_complete_cumsum of a 2-D input); the 1-D scans
// are common/prefix_sum.h's.
#pragma once

#include <algorithm>
#include <cstdint>

#include "recops/common/parallel.h"
#include "recops/common/prefix_sum.h"

namespace recops::jagged::kernels {

// Row-wise complete cumsum of a [rows, n] matrix into [rows, n + 1] (first column 0).
template <typename acc_t, typename scalar_t>
void complete_cumsum_rows(const scalar_t* in, scalar_t* out, int64_t rows, int64_t n) {
  if (rows == 1) {
    out[0] = scalar_t(0);
    prefix_sum<true, acc_t>(in, out + 1, n);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kParallelScanMinLength / std::max<int64_t>(1, n));
  parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      scalar_t* row_out = out + r * (n + 1);
      row_out[0] = scalar_t(0);
      prefix_sum_serial<true>(in + r * n, row_out + 1, n, acc_t{0});
    }
  });
}

}  // namespace recops::jagged::kernels

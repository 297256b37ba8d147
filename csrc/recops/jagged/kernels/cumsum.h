// Prefix sums. Long 1-D scans are split into one chunk per thread: each chunk's total is computed
// in parallel, the totals are scanned serially, then every chunk is scanned from its carry-in.
// Accumulation happens in acc_t (fp32 for half/bf16), rounding once per output element.
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>
#include <type_traits>
#include <vector>

namespace recops::jagged::kernels {

constexpr int64_t kParallelScanMinLength = 1 << 16;

template <typename acc_t, typename scalar_t>
acc_t sum_serial(const scalar_t* in, int64_t n) {
  acc_t total = 0;
  for (int64_t i = 0; i < n; ++i) total += static_cast<acc_t>(in[i]);
  return total;
}

// out[i] = carry + in[0] + ... + in[i] (inclusive) or + in[i-1] (exclusive).
template <bool kInclusive, typename acc_t, typename scalar_t>
void scan_serial(const scalar_t* in, scalar_t* out, int64_t n, acc_t carry) {
  int64_t i = 0;
  if constexpr (std::is_integral_v<acc_t> && !std::is_same_v<acc_t, bool>) {
    // Integer sums come out the same in any order (computed unsigned, so they wrap by definition
    // as the sequential loop's do): prefix sums inside a block are formed independently of the
    // carry, leaving one loop-carried add per block instead of one per element.
    using uacc_t = std::make_unsigned_t<acc_t>;
    constexpr int kBlock = 8;
    uacc_t running = static_cast<uacc_t>(carry);
    for (; i + kBlock <= n; i += kBlock) {
      uacc_t local[kBlock + 1];
      local[0] = 0;
      for (int k = 0; k < kBlock; ++k) {
        local[k + 1] = static_cast<uacc_t>(local[k] + static_cast<uacc_t>(in[i + k]));
      }
      for (int k = 0; k < kBlock; ++k) {
        out[i + k] =
            static_cast<scalar_t>(static_cast<uacc_t>(running + local[kInclusive ? k + 1 : k]));
      }
      running = static_cast<uacc_t>(running + local[kBlock]);
    }
    carry = static_cast<acc_t>(running);
  }
  for (; i < n; ++i) {
    const acc_t next = carry + static_cast<acc_t>(in[i]);
    out[i] = static_cast<scalar_t>(kInclusive ? next : carry);
    carry = next;
  }
}

template <bool kInclusive, typename acc_t, typename scalar_t>
void scan(const scalar_t* in, scalar_t* out, int64_t n) {
  const int64_t num_chunks = std::min<int64_t>(at::get_num_threads(), n / kParallelScanMinLength);
  if (num_chunks <= 1 || at::in_parallel_region()) {
    scan_serial<kInclusive>(in, out, n, acc_t{0});
    return;
  }
  const int64_t chunk = (n + num_chunks - 1) / num_chunks;
  std::vector<acc_t> carry(num_chunks, acc_t{0});
  at::parallel_for(0, num_chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t begin = c * chunk;
      carry[c] = sum_serial<acc_t>(in + begin, std::min(n, begin + chunk) - begin);
    }
  });
  acc_t running = 0;
  for (auto& c : carry) {
    const acc_t total = c;
    c = running;
    running += total;
  }
  at::parallel_for(0, num_chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t begin = c * chunk;
      scan_serial<kInclusive>(in + begin, out + begin, std::min(n, begin + chunk) - begin,
                              carry[c]);
    }
  });
}

// Row-wise complete cumsum of a [rows, n] matrix into [rows, n + 1] (first column 0).
template <typename acc_t, typename scalar_t>
void complete_cumsum_rows(const scalar_t* in, scalar_t* out, int64_t rows, int64_t n) {
  if (rows == 1) {
    out[0] = scalar_t(0);
    scan<true, acc_t>(in, out + 1, n);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kParallelScanMinLength / std::max<int64_t>(1, n));
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      scalar_t* row_out = out + r * (n + 1);
      row_out[0] = scalar_t(0);
      scan_serial<true>(in + r * n, row_out + 1, n, acc_t{0});
    }
  });
}

}  // namespace recops::jagged::kernels

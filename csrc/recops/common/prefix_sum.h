// Prefix sums of a 1-D array, in acc_t (fp32 for half/bf16 inputs, int64 for the offsets of int32
// lengths), rounding once per output element. Shared by the cumsum ops and by every op that
// turns lengths into offsets.
//
// A long scan runs on T threads reading the input 1.4 times (T = 2), not twice: while thread 0
// scans the head of the input, which needs no carry-in, the others sum the pieces that follow
// it; then every thread scans one piece from its now known carry-in. A head half as long as the
// other pieces balances the two phases (a scan reads and writes, a sum only reads).
// Reduce-then-scan, which reads everything twice, was 1.3x slower at 2 threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "recops/common/parallel.h"

namespace recops {

constexpr int64_t kParallelScanMinLength = 1 << 16;

template <typename acc_t, typename in_t>
acc_t sum_serial(const in_t* in, int64_t n) {
  acc_t total = 0;
  for (int64_t i = 0; i < n; ++i) total += static_cast<acc_t>(in[i]);
  return total;
}

// out[i] = carry + in[0] + ... + in[i] (inclusive) or + in[i-1] (exclusive); returns carry plus
// the sum of all n.
template <bool kInclusive, typename acc_t, typename in_t, typename out_t>
acc_t prefix_sum_serial(const in_t* in, out_t* out, int64_t n, acc_t carry) {
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
            static_cast<out_t>(static_cast<uacc_t>(running + local[kInclusive ? k + 1 : k]));
      }
      running = static_cast<uacc_t>(running + local[kBlock]);
    }
    carry = static_cast<acc_t>(running);
  }
  for (; i < n; ++i) {
    const acc_t next = carry + static_cast<acc_t>(in[i]);
    out[i] = static_cast<out_t>(kInclusive ? next : carry);
    carry = next;
  }
  return carry;
}

template <bool kInclusive, typename acc_t, typename in_t, typename out_t>
void prefix_sum(const in_t* in, out_t* out, int64_t n) {
  const int64_t threads = std::min<int64_t>(max_threads(), n / kParallelScanMinLength);
  if (threads <= 1 || in_parallel_region()) {
    prefix_sum_serial<kInclusive>(in, out, n, acc_t{0});
    return;
  }
  // Piece 0 is the head, pieces 1 .. threads-1 are summed in the first phase, the last piece
  // (the rest) is only scanned.
  std::vector<int64_t> bounds(threads + 2, n);
  const int64_t head = n / (2 * threads + 1);
  for (int64_t piece = 0; piece < threads; ++piece) bounds[piece + 1] = head + 2 * head * piece;
  bounds[0] = 0;
  std::vector<acc_t> totals(threads);  // of the head and of every summed piece
  parallel_phases<2>(threads, 1, [&](int phase, int64_t task, int64_t) {
    if (phase == 0) {
      const int64_t begin = bounds[task], size = bounds[task + 1] - begin;
      totals[task] = task == 0 ? prefix_sum_serial<kInclusive>(in, out, size, acc_t{0})
                               : sum_serial<acc_t>(in + begin, size);
      return;
    }
    const int64_t piece = task + 1;
    acc_t carry = 0;
    for (int64_t before = 0; before < piece; ++before) carry += totals[before];
    prefix_sum_serial<kInclusive>(in + bounds[piece], out + bounds[piece],
                                  bounds[piece + 1] - bounds[piece], carry);
  });
}

}  // namespace recops

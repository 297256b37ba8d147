// Rank-1 gather y[i] = x[index[i]] and its backward, the scatter-add out[k] = sum of grad[i] over
// index[i] == k, on raw pointers. Both validate each index right before using it (one compare
// and a never-taken branch), so a bad index is reported by position and never dereferenced.
//
// The backward never lets two threads write one slot (no atomics, no locks):
//  * partial histograms: each chunk of the index accumulates into its own table of n entries
//    (interleaved copies when n is small, see common/histogram.h), then the tables are summed
//    slot by slot. Extra traffic is chunks * copies * n entries, negligible while n * chunks
//    is small against the index count (HSTU's time-bias table: n = 129, millions of indices).
//  * owner-computes, when chunks * n tables would cost more than the index itself (large x): the
//    slots are split into one power-of-two range per chunk, the (index, grad) pairs are bucketed
//    by range with a counting sort (two passes over the index), then each range is accumulated by
//    a single thread. Extra traffic is one copy of the pairs, independent of n.
// Either way each slot's sum is formed in a fixed order for a given thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "recops/common/histogram.h"
#include "recops/common/parallel.h"

namespace recops::gather::kernels {

// Partial histograms are used while chunks * n * kPartialRatio <= number of indices.
constexpr int64_t kPartialRatio = 4;

// The first reported position of per-chunk results (chunks cover increasing positions), or -1.
inline int64_t first_reported(const std::vector<int64_t>& per_chunk) {
  for (int64_t bad : per_chunk) {
    if (bad >= 0) return bad;
  }
  return -1;
}

// Serial loops take their pointers by value: inside a parallel lambda, pointers captured by
// reference would be reloaded on every iteration.

// y[i] = x[index[i]] for i in [begin, end). Returns the first invalid position (the copy stops
// there) or -1.
template <typename value_t, typename index_t>
int64_t gather_range(const value_t* x, int64_t n, const index_t* index, int64_t begin, int64_t end,
                     value_t* y) {
  for (int64_t i = begin; i < end; ++i) {
    const index_t k = index[i];
    if (!in_range(k, n)) return i;
    y[i] = x[k];
  }
  return -1;
}

// y[i] = x[index[i]] for i < num_indices. Returns the first position whose index is outside
// [0, n) (y is then incomplete), or -1.
template <typename value_t, typename index_t>
int64_t gather(const value_t* x, int64_t n, const index_t* index, int64_t num_indices, value_t* y) {
  const int64_t chunks =
      num_chunks(num_indices, grain_for_bytes(sizeof(index_t) + sizeof(value_t)));
  std::vector<int64_t> bad(chunks, -1);
  for_each_chunk(num_indices, chunks, [&](int64_t c, int64_t begin, int64_t end) {
    bad[c] = gather_range(x, n, index, begin, end, y);
  });
  return first_reported(bad);
}

template <int kLanes, typename acc_t, typename scalar_t, typename index_t>
int64_t scatter_add_partials(const scalar_t* grad, const index_t* index, int64_t num_indices,
                             int64_t n, int64_t chunks, scalar_t* out) {
  const int64_t table = kLanes * n;
  const int64_t stride = chunk_table_stride<acc_t>(table);
  std::unique_ptr<acc_t[]> partials(new acc_t[chunks * stride]);
  std::vector<int64_t> bad(chunks, -1);
  for_each_chunk(num_indices, chunks, [&](int64_t c, int64_t begin, int64_t end) {
    acc_t* hist = partials.get() + c * stride;
    std::fill(hist, hist + table, acc_t(0));
    const int64_t bad_offset =
        histogram_add<kLanes>(grad + begin, index + begin, end - begin, n, hist);
    bad[c] = bad_offset < 0 ? -1 : begin + bad_offset;
  });
  const int64_t first_bad = first_reported(bad);
  if (first_bad >= 0) return first_bad;
  parallel_for(0, n, grain_for_bytes(chunks * kLanes * sizeof(acc_t)), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      acc_t sum = 0;
      for (int64_t c = 0; c < chunks; ++c) {
        sum += sum_lanes<kLanes>(partials.get() + c * stride, k);
      }
      out[k] = static_cast<scalar_t>(sum);
    }
  });
  return -1;
}

// count[index[i] >> shift] += 1 for i in [begin, end). Returns the first invalid position or -1.
// counts[c * ranges + r] (chunk c's entries in range r) become the position where chunk c's
// first entry of range r goes, with ranges laid out one after another and, within a range, chunks
// in order. Returns each range's first position, and the total last.
inline std::vector<int64_t> counts_to_cursors(std::vector<int64_t>& counts, int64_t chunks,
                                              int64_t ranges) {
  std::vector<int64_t> range_begin(ranges + 1, 0);
  int64_t cursor = 0;
  for (int64_t r = 0; r < ranges; ++r) {
    range_begin[r] = cursor;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t count = counts[c * ranges + r];
      counts[c * ranges + r] = cursor;
      cursor += count;
    }
  }
  range_begin[ranges] = cursor;
  return range_begin;
}

template <typename index_t>
int64_t count_ranges(const index_t* index, int64_t begin, int64_t end, int64_t n, int shift,
                     int64_t* count) {
  for (int64_t i = begin; i < end; ++i) {
    const index_t k = index[i];
    if (!in_range(k, n)) return i;
    ++count[static_cast<int64_t>(k) >> shift];
  }
  return -1;
}

// Appends (index[i], grad[i]) for i in [begin, end) at next[index[i] >> shift]++.
template <typename scalar_t, typename index_t>
void bucket_pairs(const scalar_t* grad, const index_t* index, int64_t begin, int64_t end, int shift,
                  int64_t* next, index_t* sorted_index, scalar_t* sorted_grad) {
  for (int64_t i = begin; i < end; ++i) {
    const int64_t p = next[static_cast<int64_t>(index[i]) >> shift]++;
    sorted_index[p] = index[i];
    sorted_grad[p] = grad[i];
  }
}

// out[k] = sum of grad[p] over p in [begin, end) with index[p] == k, for k in [lo, hi).
template <typename acc_t, typename scalar_t, typename index_t>
void sum_range(const scalar_t* grad, const index_t* index, int64_t begin, int64_t end, int64_t lo,
               int64_t hi, acc_t* acc, scalar_t* out) {
  std::fill(acc, acc + (hi - lo), acc_t(0));
  for (int64_t p = begin; p < end; ++p) acc[index[p] - lo] += static_cast<acc_t>(grad[p]);
  for (int64_t k = lo; k < hi; ++k) out[k] = static_cast<scalar_t>(acc[k - lo]);
}

template <typename acc_t, typename scalar_t, typename index_t>
int64_t scatter_add_owned_ranges(const scalar_t* grad, const index_t* index, int64_t num_indices,
                                 int64_t n, int64_t chunks, scalar_t* out) {
  // Ranges of 2^shift slots, at most `chunks` of them.
  int shift = 0;
  while (((n - 1) >> shift) + 1 > chunks) ++shift;
  const int64_t range_size = int64_t{1} << shift;
  const int64_t ranges = ((n - 1) >> shift) + 1;

  // Pass 1: validate and count each chunk's entries per range.
  std::vector<int64_t> counts(chunks * ranges, 0);
  std::vector<int64_t> bad(chunks, -1);
  for_each_chunk(num_indices, chunks, [&](int64_t c, int64_t begin, int64_t end) {
    bad[c] = count_ranges(index, begin, end, n, shift, counts.data() + c * ranges);
  });
  const int64_t first_bad = first_reported(bad);
  if (first_bad >= 0) return first_bad;

  // Range r's entries are contiguous, ordered by chunk then position: counts become cursors.
  const std::vector<int64_t> range_begin = counts_to_cursors(counts, chunks, ranges);

  // Pass 2: bucket the (index, grad) pairs by range.
  std::unique_ptr<index_t[]> sorted_index(new index_t[num_indices]);
  std::unique_ptr<scalar_t[]> sorted_grad(new scalar_t[num_indices]);
  for_each_chunk(num_indices, chunks, [&](int64_t c, int64_t begin, int64_t end) {
    bucket_pairs(grad, index, begin, end, shift, counts.data() + c * ranges, sorted_index.get(),
                 sorted_grad.get());
  });

  // Pass 3: each range is summed by one thread, in position order.
  parallel_for(0, ranges, 1, [&](int64_t r0, int64_t r1) {
    std::vector<acc_t> acc(range_size);
    for (int64_t r = r0; r < r1; ++r) {
      sum_range(sorted_grad.get(), sorted_index.get(), range_begin[r], range_begin[r + 1],
                r * range_size, std::min(n, (r + 1) * range_size), acc.data(), out);
    }
  });
  return -1;
}

// out[k] = sum of grad[i] over i < num_indices with index[i] == k, for k < n, accumulated in acc_t.
// Returns the first position whose index is outside [0, n) (out is then undefined), or -1.
template <typename acc_t, typename scalar_t, typename index_t>
int64_t scatter_add(const scalar_t* grad, const index_t* index, int64_t num_indices, int64_t n,
                    scalar_t* out) {
  const int64_t chunks =
      num_chunks(num_indices, grain_for_bytes(sizeof(index_t) + sizeof(scalar_t)));
  if (chunks > 1 && chunks * n * kPartialRatio > num_indices) {
    return scatter_add_owned_ranges<acc_t>(grad, index, num_indices, n, chunks, out);
  }
  return dispatch_histogram_lanes<acc_t>(n, [&](auto lanes) {
    return scatter_add_partials<decltype(lanes)::value, acc_t>(grad, index, num_indices, n, chunks,
                                                               out);
  });
}

}  // namespace recops::gather::kernels

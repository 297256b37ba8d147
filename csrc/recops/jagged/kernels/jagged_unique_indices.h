// jagged_unique_indices (FBGEMM's, CUDA-only there): the distinct indices of a keyed jagged tensor
// of T features x B bags, told apart by feature through linearization (feature t's index i is
// hash_size_cumsum[t] + i), with each index's position among the distinct ones, and per bag how
// many distinct indices each group of features (hash_size_offsets) spreads over its bags.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "recops/common/parallel.h"

namespace recops::jagged::kernels {

// The keyed jagged input: bag b (of num_bags = T * B) is feature b / B and holds
// indices[offsets[b], offsets[b + 1]).
template <typename index_t>
struct KeyedIndices {
  const index_t* hash_size_cumsum = nullptr;   // T + 1 entries, non-decreasing from >= 0
  const index_t* hash_size_offsets = nullptr;  // T + 1 entries in [0, T], non-decreasing
  const index_t* offsets = nullptr;            // num_bags + 1 entries, 0 to num_indices
  const index_t* indices = nullptr;
  int64_t num_features = 0;  // T
  int64_t num_bags = 0;
  int64_t num_indices = 0;
};

// linear[i] = hash_size_cumsum[t] + indices[i] for the feature t of i's bag. Every index must be
// >= 0, and below its feature's hash size unless the feature is the last one or has hash size 0
// (a feature merged into the next, as FBGEMM allows). Returns -1, or the first bad position.
template <typename index_t>
int64_t linearize_indices(const KeyedIndices<index_t>& in, int64_t* linear) {
  const int64_t batch = in.num_bags / in.num_features;
  std::atomic<int64_t> first_bad{in.num_indices};
  const int64_t avg = in.num_indices / std::max<int64_t>(1, in.num_bags);
  parallel_for(0, in.num_bags, grain_for_bytes(16 * (avg + 1)), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t t = b / batch;
      const int64_t base = in.hash_size_cumsum[t];
      const int64_t hash_size = in.hash_size_cumsum[t + 1] - base;
      const bool bounded = t + 1 < in.num_features && hash_size > 0;
      for (int64_t i = in.offsets[b]; i < in.offsets[b + 1]; ++i) {
        const int64_t index = in.indices[i];
        // An unbounded feature's index must not overflow its linear value either.
        if (index < 0 || (bounded && index >= hash_size) ||
            index > std::numeric_limits<int64_t>::max() - base) {
          int64_t seen = first_bad.load();
          while (i < seen && !first_bad.compare_exchange_weak(seen, i)) {
          }
          continue;
        }
        linear[i] = base + index;
      }
    }
  });
  const int64_t bad = first_bad.load();
  return bad == in.num_indices ? -1 : bad;
}

// Sorts values packed as (key << 32 | position) by their key, the top `key_bits` bits above bit
// 32, with LSD radix passes: stable, so equal keys keep their positions in order.
inline void radix_sort_packed_keys(std::vector<uint64_t>& packed, int key_bits) {
  constexpr int kDigitBits = 11;
  constexpr uint64_t kDigitMask = (uint64_t{1} << kDigitBits) - 1;
  std::vector<uint64_t> scratch(packed.size());
  std::vector<int64_t> start(kDigitMask + 1);
  for (int shift = 32; shift < 32 + key_bits; shift += kDigitBits) {
    std::fill(start.begin(), start.end(), 0);
    for (const uint64_t x : packed) ++start[(x >> shift) & kDigitMask];
    int64_t sum = 0;
    for (int64_t& s : start) sum += std::exchange(s, sum);
    for (const uint64_t x : packed) scratch[start[(x >> shift) & kDigitMask]++] = x;
    packed.swap(scratch);
  }
}

// The distinct values of linear[0, n) (all >= 0) in increasing order into unique (capacity n), and
// reverse[i] = the position of linear[i] among them. Returns the number of distinct values. A
// dense rank table when the values span little more than n; else a radix sort of (value - min,
// position) packed in 64 bits when both fit in 32, a comparison sort otherwise.
inline int64_t rank_unique(const int64_t* linear, int64_t n, int64_t* reverse, int64_t* unique) {
  if (n == 0) return 0;
  const auto [lo_it, hi_it] = std::minmax_element(linear, linear + n);
  const int64_t lo = *lo_it;
  const int64_t spread = *hi_it - lo;  // values are >= 0: no overflow
  if (spread < 4 * n + 4096) {
    const int64_t span = spread + 1;
    std::vector<int64_t> rank(span, 0);
    for (int64_t i = 0; i < n; ++i) rank[linear[i] - lo] = 1;
    int64_t count = 0;
    for (int64_t v = 0; v < span; ++v) {
      if (rank[v] != 0) {
        unique[count] = lo + v;
        rank[v] = count++;
      }
    }
    parallel_for(0, n, grain_for_bytes(24), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) reverse[i] = rank[linear[i] - lo];
    });
    return count;
  }
  constexpr int64_t kFits32 = int64_t{1} << 32;
  if (spread < kFits32 && n < kFits32) {
    std::vector<uint64_t> packed(n);
    for (int64_t i = 0; i < n; ++i) {
      packed[i] = (static_cast<uint64_t>(linear[i] - lo) << 32) | static_cast<uint64_t>(i);
    }
    int key_bits = 1;
    while (key_bits < 32 && (spread >> key_bits) != 0) ++key_bits;
    radix_sort_packed_keys(packed, key_bits);
    int64_t count = 0;
    for (int64_t k = 0; k < n; ++k) {
      const uint64_t key = packed[k] >> 32;
      if (k == 0 || key != (packed[k - 1] >> 32)) unique[count++] = lo + static_cast<int64_t>(key);
      reverse[packed[k] & 0xFFFFFFFFu] = count - 1;
    }
    return count;
  }
  std::vector<std::pair<int64_t, int64_t>> sorted(n);
  for (int64_t i = 0; i < n; ++i) sorted[i] = {linear[i], i};
  std::sort(sorted.begin(), sorted.end());
  int64_t count = 0;
  for (int64_t k = 0; k < n; ++k) {
    if (k == 0 || sorted[k].first != sorted[k - 1].first) unique[count++] = sorted[k].first;
    reverse[sorted[k].second] = count - 1;
  }
  return count;
}

// unique_indices[r] = the index (as given, not linearized) of the first position i with
// reverse[i] = r.
template <typename index_t>
void first_index_of_each_rank(const index_t* indices, const int64_t* reverse, int64_t n,
                              index_t* unique_indices) {
  for (int64_t i = n - 1; i >= 0; --i) unique_indices[reverse[i]] = indices[i];
}

// lengths[num_bags] (zeroed by the caller): each group g of features [hash_size_offsets[g],
// hash_size_offsets[g + 1]) counts the distinct linear values in its hash range (from its first
// feature's start to its end feature's start; up to the last value for the group that ends at the
// last feature) and spreads that count over its bags, the first bags taking one more when it does
// not divide evenly. A group of features with an empty hash range that is not last counts none.
template <typename index_t>
void unique_lengths(const KeyedIndices<index_t>& in, const int64_t* unique, int64_t num_unique,
                    index_t* lengths) {
  const int64_t batch = in.num_bags / in.num_features;
  parallel_for(0, in.num_features, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t first_feature = in.hash_size_offsets[g];
      const int64_t end_feature = in.hash_size_offsets[g + 1];
      const int64_t num_lengths = (end_feature - first_feature) * batch;
      if (num_lengths <= 0) continue;
      const int64_t low = in.hash_size_cumsum[first_feature];
      const int64_t high = in.hash_size_cumsum[end_feature];
      const bool last = end_feature == in.num_features;
      if (low == high && !last) continue;
      const int64_t lo = std::lower_bound(unique, unique + num_unique, low) - unique;
      const int64_t hi =
          last ? num_unique : std::lower_bound(unique, unique + num_unique, high) - unique;
      const int64_t total = std::max<int64_t>(0, hi - lo);
      const int64_t each = total / num_lengths;
      const int64_t extra = total % num_lengths;
      index_t* group = lengths + first_feature * batch;
      for (int64_t i = 0; i < num_lengths; ++i) {
        group[i] = static_cast<index_t>(i < extra ? each + 1 : each);
      }
    }
  });
}

}  // namespace recops::jagged::kernels

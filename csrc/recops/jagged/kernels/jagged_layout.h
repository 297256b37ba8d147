// Index arithmetic of a jagged tensor with K (1..5) jagged dims and its padded dense view
// [B, max_lengths[0], ..., max_lengths[K-1], D]. Torch-free: raw offsets pointers and extents.
#pragma once

#include <cstdint>

namespace recops::jagged::kernels {

constexpr int kMaxJaggedDims = 5;

template <typename index_t>
struct JaggedLayout {
  int num_jagged_dims = 0;                      // K
  const index_t* offsets[kMaxJaggedDims] = {};  // offsets[d] indexes rows of level d+1
  int64_t max_lengths[kMaxJaggedDims] = {};
  int64_t batch = 0;  // B: offsets[0] has B + 1 entries
  int64_t inner = 1;  // D: elements per values row

  int64_t innermost_max_length() const { return max_lengths[num_jagged_dims - 1]; }

  // The dense view is a sequence of "slabs" [max_lengths[K-1], D]: one per coordinate
  // (b, i_0, ..., i_{K-2}). Each slab corresponds to at most one contiguous run of values rows.
  int64_t num_slabs() const {
    int64_t n = batch;
    for (int d = 0; d + 1 < num_jagged_dims; ++d) n *= max_lengths[d];
    return n;
  }
  int64_t slab_numel() const { return innermost_max_length() * inner; }

  // Resolves slab `slab` to its run of values rows [*begin, *begin + *length). Returns false when
  // one of the outer coordinates lies past its row's length (the slab is all padding).
  bool segment_of_slab(int64_t slab, int64_t* begin, int64_t* length) const {
    const int outer_dims = num_jagged_dims - 1;
    int64_t coords[kMaxJaggedDims];
    int64_t rest = slab;
    for (int d = outer_dims - 1; d >= 0; --d) {
      coords[d] = rest % max_lengths[d];
      rest /= max_lengths[d];
    }
    int64_t row = rest;  // the batch index
    for (int d = 0; d < outer_dims; ++d) {
      const int64_t start = offsets[d][row];
      if (coords[d] >= offsets[d][row + 1] - start) return false;
      row = start + coords[d];
    }
    const index_t* last = offsets[outer_dims];
    *begin = last[row];
    *length = last[row + 1] - last[row];
    return true;
  }
};

}  // namespace recops::jagged::kernels

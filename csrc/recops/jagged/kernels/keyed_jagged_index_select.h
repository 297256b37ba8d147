// keyed_jagged_index_select_dim1 (FBGEMM's): selects the same batch entries `indices` from every
// key of a keyed jagged tensor. The input has num_batches keys of batch_size segments each,
// segment s = key * batch_size + b holding lengths[s] values from offsets[s]; output segment
// k = key * num_indices + j is input segment key * batch_size + indices[j].
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

#include "recops/common/parallel.h"
#include "recops/common/prefix_sum.h"
#include "recops/common/streaming.h"
#include "recops/jagged/kernels/selected_segments.h"

namespace recops::jagged::kernels {

// One selected segment: input segment `segment` of output segment k.
struct KeyedSelection {
  int64_t batch_size = 0;
  int64_t num_indices = 0;

  template <typename index_t>
  int64_t input_segment(const index_t* indices, int64_t k) const {
    return (k / num_indices) * batch_size + static_cast<int64_t>(indices[k % num_indices]);
  }
};

// The first element of input segment s: offsets[s], except segment 0, which starts at 0 (as in
// FBGEMM).
template <typename offset_t>
int64_t keyed_segment_begin(const offset_t* offsets, int64_t segment) {
  return segment == 0 ? 0 : static_cast<int64_t>(offsets[segment]);
}

// out_lengths[k] = lengths[input segment of k] and out_ends its inclusive cumsum, for the
// num_batches * num_indices output segments (indices in [0, batch_size) and lengths >= 0, checked
// by the caller). Returns -1, or the first output segment whose input segment lies outside the
// num_elements input elements (then out_ends is not written).
template <typename length_t, typename offset_t, typename index_t>
int64_t select_keyed_lengths(const KeyedSelection& sel, const length_t* lengths,
                             const offset_t* offsets, const index_t* indices,
                             int64_t num_out_segments, int64_t num_elements, length_t* out_lengths,
                             int64_t* out_ends) {
  std::atomic<int64_t> first_bad{num_out_segments};
  parallel_for(0, num_out_segments, grain_for_bytes(4 * sizeof(length_t)),
               [&](int64_t k0, int64_t k1) {
                 for (int64_t k = k0; k < k1; ++k) {
                   const int64_t segment = sel.input_segment(indices, k);
                   const int64_t length = lengths[segment];
                   const int64_t begin = keyed_segment_begin(offsets, segment);
                   out_lengths[k] = lengths[segment];
                   if (begin < 0 || begin > num_elements - length) {
                     int64_t seen = first_bad.load();
                     while (k < seen && !first_bad.compare_exchange_weak(seen, k)) {
                     }
                   }
                 }
               });
  if (first_bad.load() < num_out_segments) return first_bad.load();
  prefix_sum<true, int64_t>(out_lengths, out_ends, num_out_segments);
  return -1;
}

// A 1-D stream copied by the selection (values, or weights): element_bytes wide elements.
struct ByteStream {
  const char* src = nullptr;
  int64_t src_elements = 0;
  char* dst = nullptr;
  int64_t element_bytes = 0;
};

// Copies the selected segments of `num_streams` streams (values and weights share offsets) into
// their outputs of out_ends[num_out_segments - 1] elements. Input segment s starts at offsets[s],
// except segment 0, which starts at 0 (as in FBGEMM). Returns -1, or the first output segment
// whose input elements lie outside the streams.
template <typename offset_t, typename index_t>
int64_t select_keyed_segments(const KeyedSelection& sel, const offset_t* offsets,
                              const index_t* indices, const int64_t* out_ends,
                              int64_t num_out_segments, const ByteStream* streams,
                              int num_streams) {
  const int64_t total = num_out_segments == 0 ? 0 : out_ends[num_out_segments - 1];
  int64_t bytes_per_element = 0;
  for (int s = 0; s < num_streams; ++s) bytes_per_element += streams[s].element_bytes;
  const auto fill = [&](int64_t k, int64_t rel, int64_t at, int64_t count) {
    const int64_t segment = sel.input_segment(indices, k);
    const int64_t first = keyed_segment_begin(offsets, segment) + rel;
    for (int s = 0; s < num_streams; ++s) {
      const ByteStream& stream = streams[s];
      if (first < 0 || first > stream.src_elements - count) return false;
      copy_bytes(stream.dst + at * stream.element_bytes, stream.src + first * stream.element_bytes,
                 count * stream.element_bytes, /*streaming=*/false);
    }
    return true;
  };
  return fill_selected_segments(out_ends, num_out_segments, total,
                                grain_for_bytes(bytes_per_element), fill);
}

}  // namespace recops::jagged::kernels

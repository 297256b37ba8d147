// Jagged <-> padded dense copies. Each slab of the dense view maps to one contiguous run of
// values rows, so a slab is moved with one memcpy plus one fill; slabs are independent and run in
// parallel. Kernels are instantiated per element width (elem_t = uintN_t), not per dtype.
#pragma once

#include <algorithm>
#include <cstring>

#include "recops/common/parallel.h"
#include "recops/common/streaming.h"
#include "recops/jagged/kernels/jagged_layout.h"

namespace recops::jagged::kernels {

// Fills [out, end) with `value`. When all bytes of `value` are equal (0 and -1 are), memset does
// it (streamed if asked): it uses the widest stores the CPU has, where the compiler's loop in this
// portable build is limited to baseline 16-byte vectors.
template <typename elem_t>
void fill_elements(elem_t* out, elem_t* end, elem_t value, bool streaming) {
  unsigned char bytes[sizeof(elem_t)];
  std::memcpy(bytes, &value, sizeof(elem_t));
  bool uniform = true;
  for (size_t i = 1; i < sizeof(elem_t); ++i) uniform &= bytes[i] == bytes[0];
  if (uniform) {
    if (end > out) set_bytes(out, bytes[0], (end - out) * sizeof(elem_t), streaming);
  } else {
    std::fill(out, end, value);
  }
}

// dense[slab] = values[run] followed by `padding` up to the slab's end.
template <typename elem_t, typename index_t>
void jagged_to_dense(const JaggedLayout<index_t>& layout, const elem_t* values, elem_t padding,
                     elem_t* dense) {
  const int64_t slab_numel = layout.slab_numel();
  const int64_t max_length = layout.innermost_max_length();
  const int64_t inner = layout.inner;
  const bool streaming = should_stream(layout.num_slabs() * slab_numel * sizeof(elem_t));
  parallel_for(0, layout.num_slabs(), grain_for_bytes(slab_numel * sizeof(elem_t)),
               [&](int64_t slab_begin, int64_t slab_end) {
                 for (int64_t slab = slab_begin; slab < slab_end; ++slab) {
                   elem_t* out = dense + slab * slab_numel;
                   int64_t begin = 0, length = 0;
                   const bool present = layout.segment_of_slab(slab, &begin, &length);
                   const int64_t copied = present ? std::min(length, max_length) * inner : 0;
                   copy_bytes(out, values + begin * inner, copied * sizeof(elem_t), streaming);
                   fill_elements(out + copied, out + slab_numel, padding, streaming);
                 }
                 store_fence();
               });
}

// values[run] = dense[slab] for the rows inside the dense extent; rows of a run that the dense
// view truncates are set to zero. Rows reachable from no slab are left untouched (the caller
// zero-initialises `values` when such rows can exist).
template <typename elem_t, typename index_t>
void dense_to_jagged(const JaggedLayout<index_t>& layout, const elem_t* dense, elem_t* values) {
  const int64_t slab_numel = layout.slab_numel();
  const int64_t max_length = layout.innermost_max_length();
  const int64_t inner = layout.inner;
  // The dense input's size stands for the output's: the op's traffic is beyond the cache.
  const bool streaming = should_stream(layout.num_slabs() * slab_numel * sizeof(elem_t));
  parallel_for(0, layout.num_slabs(), grain_for_bytes(slab_numel * sizeof(elem_t)),
               [&](int64_t slab_begin, int64_t slab_end) {
                 for (int64_t slab = slab_begin; slab < slab_end; ++slab) {
                   int64_t begin = 0, length = 0;
                   if (!layout.segment_of_slab(slab, &begin, &length)) continue;
                   const int64_t copied = std::min(length, max_length) * inner;
                   elem_t* out = values + begin * inner;
                   copy_bytes(out, dense + slab * slab_numel, copied * sizeof(elem_t), streaming);
                   fill_elements(out + copied, out + length * inner, elem_t{0}, streaming);
                 }
                 store_fence();
               });
}

}  // namespace recops::jagged::kernels

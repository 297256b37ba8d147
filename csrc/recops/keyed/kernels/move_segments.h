// Column segments moved between row-major matrices that share a row count: the data movement of
// keyed-tensor regrouping (permute_multi_embedding and its backward). Segment s copies columns
// [source_column, source_column + width) of input matrix `source` into columns
// [target_column, target_column + width) of output matrix `target`, in every row; an accumulating
// segment adds into the target instead. Per row, segments apply in their list order, so a later
// segment sees what earlier ones wrote. Rows run in parallel; within a row each segment is one
// contiguous copy (or add). The adapter validates every segment against the matrices' widths.
#pragma once

#include <cstdint>

#include "recops/common/half_bits.h"
#include "recops/common/parallel.h"
#include "recops/common/streaming.h"

namespace recops::keyed::kernels {

struct Segment {
  int64_t source;         // input matrix
  int64_t target;         // output matrix
  int64_t source_column;  // first column read
  int64_t target_column;  // first column written
  int64_t width;          // columns
  bool accumulate;        // add into the target (else overwrite)
};

// A row-major matrix of `columns` elements per row, rows contiguous.
template <typename T>
struct Rows {
  T* data;
  int64_t columns;
};

// out[j] += in[j] for j < n, summed in accumulate_t (float for the 16-bit types), rounded once.
template <typename scalar_t>
void add_into(scalar_t* out, const scalar_t* in, int64_t n) {
  using acc_t = accumulate_t<scalar_t>;
  for (int64_t j = 0; j < n; ++j) {
    out[j] = static_cast<scalar_t>(static_cast<acc_t>(out[j]) + static_cast<acc_t>(in[j]));
  }
}

// Applies `segments` to every one of `rows` rows: inputs[s.source] -> outputs[s.target].
template <typename scalar_t>
void move_segments(int64_t rows, const Rows<const scalar_t>* inputs, const Rows<scalar_t>* outputs,
                   const Segment* segments, int64_t num_segments) {
  int64_t row_bytes = 0;
  for (int64_t s = 0; s < num_segments; ++s) {
    row_bytes += 2 * segments[s].width * static_cast<int64_t>(sizeof(scalar_t));
  }
  parallel_for(0, rows, grain_for_bytes(row_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t s = 0; s < num_segments; ++s) {
        const Segment& seg = segments[s];
        const Rows<const scalar_t>& in = inputs[seg.source];
        const Rows<scalar_t>& out = outputs[seg.target];
        const scalar_t* from = in.data + r * in.columns + seg.source_column;
        scalar_t* to = out.data + r * out.columns + seg.target_column;
        if (seg.accumulate) {
          add_into(to, from, seg.width);
        } else {
          copy_bytes(to, from, seg.width * static_cast<int64_t>(sizeof(scalar_t)),
                     /*streaming=*/false);
        }
      }
    }
  });
}

}  // namespace recops::keyed::kernels

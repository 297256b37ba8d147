// Concatenation of row-major blocks: output row r (of `rows`) is the row r of every part, one
// after another, part p holding part_bytes[p] bytes per row (torch.cat along a dimension, with
// rows = the product of the sizes before it). The output is split into equal byte ranges, one per
// task, so a few long rows (cat along dim 0: one row) balance as well as many short ones. Outputs
// larger than the last-level cache are written with streaming stores.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "recops/common/parallel.h"
#include "recops/common/streaming.h"

namespace recops::keyed::kernels {

// Copies output bytes [begin, end) (offsets into the whole output) from their parts.
inline void concatenate_range(const char* const* parts, const int64_t* part_bytes,
                              const int64_t* part_offsets, int64_t num_parts, int64_t row_bytes,
                              int64_t begin, int64_t end, char* out, bool streaming) {
  int64_t row = begin / row_bytes;
  int64_t column = begin - row * row_bytes;
  // The part holding `column`: the last one starting at or before it with bytes in it.
  int64_t p = std::upper_bound(part_offsets, part_offsets + num_parts, column) - part_offsets - 1;
  for (int64_t at = begin; at < end;) {
    while (column >= part_offsets[p] + part_bytes[p]) ++p;  // skips empty parts too
    const int64_t within = column - part_offsets[p];
    const int64_t bytes = std::min(part_bytes[p] - within, end - at);
    copy_bytes(out + at, parts[p] + row * part_bytes[p] + within, bytes, streaming);
    at += bytes;
    column += bytes;
    if (column == row_bytes) {
      ++row;
      column = 0;
      p = 0;
    }
  }
}

// out = the concatenation, row by row, of `num_parts` parts of `rows` rows each.
inline void concatenate(const char* const* parts, const int64_t* part_bytes, int64_t num_parts,
                        int64_t rows, char* out) {
  std::vector<int64_t> part_offsets(num_parts + 1, 0);
  for (int64_t p = 0; p < num_parts; ++p) part_offsets[p + 1] = part_offsets[p] + part_bytes[p];
  const int64_t row_bytes = part_offsets[num_parts];
  const int64_t total = rows * row_bytes;
  if (total == 0) return;
  const bool streaming = should_stream(total);
  const int64_t chunk = std::max<int64_t>(kTargetBytesPerTask, 4096);
  parallel_for(0, (total + chunk - 1) / chunk, 1, [&](int64_t c0, int64_t c1) {
    concatenate_range(parts, part_bytes, part_offsets.data(), num_parts, row_bytes, c0 * chunk,
                      std::min(total, c1 * chunk), out, streaming);
    if (streaming) store_fence();
  });
}

}  // namespace recops::keyed::kernels

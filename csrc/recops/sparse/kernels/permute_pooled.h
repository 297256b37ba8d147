// Column blocks of a row-major [rows, width] matrix moved to new places: output block i (columns
// [out_offsets[i], out_offsets[i + 1])) is input block source[i]. Rows in parallel; each block is
// one contiguous copy per row. Offsets and sources are validated by the adapter.
#pragma once

#include <cstdint>

#include "recops/common/parallel.h"
#include "recops/common/streaming.h"

namespace recops::sparse::kernels {

inline void permute_column_blocks(const char* in, char* out, int64_t rows, int64_t width,
                                  int64_t element_size, const int64_t* in_offsets,
                                  const int64_t* out_offsets, const int64_t* source,
                                  int64_t blocks) {
  const int64_t row_bytes = width * element_size;
  parallel_for(0, rows, grain_for_bytes(2 * row_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const char* in_row = in + r * row_bytes;
      char* out_row = out + r * row_bytes;
      for (int64_t i = 0; i < blocks; ++i) {
        const int64_t bytes = (out_offsets[i + 1] - out_offsets[i]) * element_size;
        // copy_bytes: memcpy that also takes the null pointers of a tensor without elements.
        copy_bytes(out_row + out_offsets[i] * element_size,
                   in_row + in_offsets[source[i]] * element_size, bytes, /*streaming=*/false);
      }
    }
  });
}

}  // namespace recops::sparse::kernels

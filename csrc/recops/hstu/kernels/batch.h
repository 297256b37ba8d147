// What the HSTU-family kernels (HSTU, FuXi-alpha; fp32 and bf16) are given: where the jagged
// sequences live, the attention's shape, q / k / v, and the query blocks a sequence is cut into.
#pragma once

#include <cstdint>

namespace recops::attention::kernels {

// Where each sequence lives in the [rows, H, D] tensors.
struct Sequences {
  int64_t count = 0;                   // B
  const int64_t* row_begin = nullptr;  // [B]
  const int64_t* length = nullptr;     // [B]
  int64_t max_len = 0;                 // N
};

template <typename T>
struct HstuShape {
  int64_t heads = 1, dqk = 0, dv = 0;
  T alpha = T(1), silu_scale = T(1);
};

// A [rows, H, D] input whose rows are [H, D] contiguous, `stride` values apart: H * D when the
// tensor is contiguous, more when it is a slice of a wider projection (HSTU splits U, V, Q, K
// out of one linear layer's output), which the kernels then read in place.
template <typename E>
struct Rows {
  const E* data = nullptr;
  int64_t stride = 0;

  // Head h (of d values) of row `row`.
  const E* at(int64_t row, int64_t h, int64_t d) const { return data + row * stride + h * d; }
};

// q, k [rows, H, Dqk] and v [rows, H, Dv]; bf16 as bit patterns (Bf16Tensors).
template <typename T>
struct HstuTensors {
  Rows<T> q, k, v;
};
using Bf16Tensors = HstuTensors<uint16_t>;

// One query block of one sequence: rows [row0, row0 + rows) meet keys [key0, key0 + keys). Its
// tiles have rows of stride() values: `keys`, or `ld` when the bf16 kernels pad them (columns
// [keys, ld) of the mask and bias tiles are then zero).
struct Block {
  int64_t b, length, row0, rows, key0, keys;
  int64_t ld = 0;

  int64_t stride() const { return ld > 0 ? ld : keys; }
};

// A block as a precision's products see it: its key range and tile rows (blk.ld) possibly padded,
// and rows_pad >= blk.rows query rows (the rows past blk.rows are zero in every tile).
struct PaddedBlock {
  Block blk;
  int64_t rows_pad;
};

}  // namespace recops::attention::kernels

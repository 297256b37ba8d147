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

template <typename T>
struct HstuTensors {
  const T* q = nullptr;  // [rows, H, Dqk]
  const T* k = nullptr;  // [rows, H, Dqk]
  const T* v = nullptr;  // [rows, H, Dv]
};

// q, k [rows, H, Dqk] and v [rows, H, Dv] as bf16 bits.
struct Bf16Tensors {
  const uint16_t* q = nullptr;
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
};

// One query block of one sequence: rows [row0, row0 + rows) meet keys [key0, key0 + keys). Its
// tiles have rows of stride() values: `keys`, or `ld` when the bf16 kernels pad them (columns
// [keys, ld) of the mask and bias tiles are then zero).
struct Block {
  int64_t b, length, row0, rows, key0, keys;
  int64_t ld = 0;

  int64_t stride() const { return ld > 0 ? ld : keys; }
};

}  // namespace recops::attention::kernels

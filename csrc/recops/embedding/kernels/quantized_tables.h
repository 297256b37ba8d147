// The tables of FBGEMM's quantized inference TBE (IntNBitTableBatchedEmbeddingBagsCodegen), torch
// free: each table has its own storage type, and its rows are laid out in bytes:
//   FP32, FP16, FP8   D elements of 4, 2 and 1 bytes;
//   INT8, INT4, INT2  an fp16 scale and an fp16 bias first (kQuantizedScaleBiasBytes), then D
//                     codes of 8, 4 or 2 bits, element d being scale * code[d] + bias; sub-byte
//                     codes are packed from the low bits up (element d of INT4 is the low nibble
//                     of byte d / 2 when d is even);
// each row padded to a multiple of row_alignment bytes. FP8 is FBGEMM's "hfp8": a sign bit, then
// exponent_bits of exponent biased by exponent_bias, then the mantissa, without inf or NaN.
#pragma once

#include <cstdint>

namespace recops::embedding::kernels {

// FBGEMM's SparseType codes of the storage types its CPU lookup reads (BF16 5 it does not).
enum class WeightType : uint8_t {
  kFp32 = 0,
  kFp16 = 1,
  kInt8 = 2,
  kInt4 = 3,
  kInt2 = 4,
  kFp8 = 6,
};

constexpr int64_t kQuantizedScaleBiasBytes = 4;

inline bool is_served_weight_type(int64_t code) {
  return code == 0 || code == 1 || code == 2 || code == 3 || code == 4 || code == 6;
}

// Bits per element of a storage type.
constexpr int64_t weight_type_bits(WeightType type) {
  switch (type) {
    case WeightType::kFp32:
      return 32;
    case WeightType::kFp16:
      return 16;
    case WeightType::kInt8:
    case WeightType::kFp8:
      return 8;
    case WeightType::kInt4:
      return 4;
    case WeightType::kInt2:
      return 2;
  }
  return 0;
}

constexpr bool has_scale_bias(WeightType type) {
  return type == WeightType::kInt8 || type == WeightType::kInt4 || type == WeightType::kInt2;
}

// Bytes of one stored row of dim D (D a multiple of the elements per byte), padded to a multiple
// of row_alignment (FBGEMM's padded_row_size_in_bytes).
constexpr int64_t quantized_row_bytes(WeightType type, int64_t D, int64_t row_alignment) {
  const int64_t bytes =
      D * weight_type_bits(type) / 8 + (has_scale_bias(type) ? kQuantizedScaleBiasBytes : 0);
  return (bytes + row_alignment - 1) / row_alignment * row_alignment;
}

// One call: features are tables here (FBGEMM's T), feature t reading rows[t] rows of
// row_bytes(t) bytes from tables[t]. An index of -1 (a row pruned away) adds nothing; any other
// index outside [0, rows) is an error. For Pooling::kNone every feature has dim layout.max_D, the
// output is [num_indices, max_D] and per-sample weights are not read (FBGEMM's nobag kernel).
struct QuantizedTables {
  const uint8_t* const* tables = nullptr;  // [T]: the first byte of feature t's rows
  const WeightType* types = nullptr;       // [T]
  int64_t row_alignment = 1;
  int32_t fp8_exponent_bits = 4;  // read by FP8 tables only
  int32_t fp8_exponent_bias = 7;
};

}  // namespace recops::embedding::kernels

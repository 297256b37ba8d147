// FBGEMM's quantized inference lookup (quantized_tables.h): the bag loop of lookup.h over tables
// whose rows a decoder per storage type reads, dequantizing a column block at a time in
// registers. Parallel over (table, chunk of bags), as the training lookup. Compiled per
// instruction set.
#pragma once

#ifndef RECOPS_ISA_NS
#error "compiled once per instruction set: include through recops/embedding/kernels/variant.h"
#endif

#include "recops/embedding/kernels/lookup.h"

namespace recops::embedding::kernels::RECOPS_ISA_NS {

// Row decoders of the storage types lookup.h's StoredRows does not read (FP32 and FP16 rows are
// StoredRows'): add<W>(acc, row, c, D, scale) adds scale * columns [c, c + W) of a stored row.
template <int kBits>
struct IntRows {  // INT8, INT4, INT2: scale * code + bias
  static constexpr int64_t kPerByte = 8 / kBits;
  static constexpr int kMask = (1 << kBits) - 1;
  template <int64_t kWidth>
  static void add(float* __restrict acc, const uint8_t* row, int64_t c, int64_t, float scale) {
    Fp16 scale_bias[2];
    std::memcpy(scale_bias, row, sizeof(scale_bias));
    const float code_scale = scale * static_cast<float>(scale_bias[0]);
    const float offset = scale * static_cast<float>(scale_bias[1]);
    const uint8_t* codes = row + kQuantizedScaleBiasBytes;
    float values[kWidth];
    if constexpr (kWidth % kPerByte == 0) {
      // Whole bytes (blocks of 4 or more columns start at multiples of 4): each byte's codes
      // unpacked at fixed shifts, which vectorises; a position-dependent shift does not.
      const uint8_t* bytes = codes + c / kPerByte;
      for (int64_t j = 0; j < kWidth / kPerByte; ++j) {
        for (int64_t k = 0; k < kPerByte; ++k) {
          values[j * kPerByte + k] = static_cast<float>((bytes[j] >> (k * kBits)) & kMask);
        }
      }
    } else {  // single columns at the end of a row
      for (int64_t i = 0; i < kWidth; ++i) {
        const int64_t d = c + i;
        values[i] = static_cast<float>((codes[d / kPerByte] >> ((d % kPerByte) * kBits)) & kMask);
      }
    }
    for (int64_t i = 0; i < kWidth; ++i) acc[i] += code_scale * values[i] + offset;
  }
};

// FBGEMM's hfp8 (Float8ToFloat_ref): the 7 magnitude bits placed so that the mantissa lands on
// fp32's, then scaled by 2^(127 - exponent_bias); subnormals come out right because an fp32
// subnormal is scaled alike.
struct Fp8Rows {
  int32_t shift;     // 16 + exponent_bits
  float multiplier;  // 2^(127 - exponent_bias)

  Fp8Rows(int32_t exponent_bits, int32_t exponent_bias)
      : shift(16 + exponent_bits), multiplier(std::ldexp(1.0f, 127 - exponent_bias)) {}

  template <int64_t kWidth>
  void add(float* __restrict acc, const uint8_t* row, int64_t c, int64_t, float scale) const {
    for (int64_t i = 0; i < kWidth; ++i) {
      const uint32_t byte = row[c + i];
      const uint32_t magnitude_bits = (byte & 0x7Fu) << shift;
      float magnitude;
      std::memcpy(&magnitude, &magnitude_bits, sizeof(float));
      const float value = (byte & 0x80u) != 0 ? -(magnitude * multiplier) : magnitude * multiplier;
      acc[i] += scale * value;
    }
  }
};

// An index of -1 is a row pruned away: it adds nothing and is no error, as in FBGEMM.
template <typename Decoder>
using QuantizedTable = FeatureTable<Decoder, /*kSkipsMinusOne=*/true>;

// Calls fn(decoder) with the decoder of `type`.
template <typename Fn>
int64_t with_row_decoder(WeightType type, const QuantizedTables& tables, const Fn& fn) {
  switch (type) {
    case WeightType::kFp32:
      return fn(StoredRows<float>{});
    case WeightType::kFp16:
      return fn(StoredRows<Fp16>{});
    case WeightType::kInt8:
      return fn(IntRows<8>{});
    case WeightType::kInt4:
      return fn(IntRows<4>{});
    case WeightType::kInt2:
      return fn(IntRows<2>{});
    case WeightType::kFp8:
      return fn(Fp8Rows(tables.fp8_exponent_bits, tables.fp8_exponent_bias));
  }
  return -1;  // unreachable: the adapter admits the types above only
}

template <typename out_t, typename index_t>
int64_t quantized_forward(const QuantizedForwardArgs& args) {
  const FeatureLayout& layout = args.layout;
  const TypedBags<index_t> bags(args.bags);
  auto* out = static_cast<out_t*>(args.out);
  const int64_t bytes_per_index = layout.max_D;  // about: a byte per element
  const bool stream_rows = streams_rows<out_t>(layout, bags);
  const auto pool_item = [&](ScratchRows& scratch, int64_t t, int64_t b_begin, int64_t b_end,
                             bool continued) -> int64_t {
    const int64_t D = layout.D_offsets[t + 1] - layout.D_offsets[t];
    const WeightType type = args.tables.types[t];
    const int64_t row_bytes = quantized_row_bytes(type, D, args.tables.row_alignment);
    return with_row_decoder(type, args.tables, [&](auto decoder) {
      const QuantizedTable<decltype(decoder)> table{args.tables.tables[t], layout.rows[t], D,
                                                    row_bytes, decoder};
      return pool_bags(layout, bags, table, t, b_begin, b_end, continued, scratch, out,
                       stream_rows);
    });
  };
  return for_each_bag_chunk(layout, bags.num_indices, bytes_per_index, pool_item);
}

}  // namespace recops::embedding::kernels::RECOPS_ISA_NS

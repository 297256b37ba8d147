// One instruction-set variant of the row-wise quantization kernels (rowwise.h): included once by
// each variant_<isa>.cpp after it selected the instruction set and defined RECOPS_ISA_NS.
#pragma once

#ifndef RECOPS_ISA_NS
#error "compiled once per instruction set: include from a variant_<isa>.cpp"
#endif

namespace recops::quantize::kernels::RECOPS_ISA_NS {

// fp16 <-> float through the compiler's _Float16: F16C instructions in the AVX2 variant, exact
// library conversions in the baseline one. Both round to nearest even and keep a NaN's payload,
// as FBGEMM's F16C conversions do.
RECOPS_ALWAYS_INLINE float widen(float value) {
  return value;
}

RECOPS_ALWAYS_INLINE float widen_fp16_bits(uint16_t bits) {
  _Float16 value;
  std::memcpy(&value, &bits, sizeof(bits));
  return static_cast<float>(value);
}

RECOPS_ALWAYS_INLINE float widen(Fp16 value) {
  return widen_fp16_bits(value.bits);
}

RECOPS_ALWAYS_INLINE uint16_t fp16_bits(float value) {
  const auto narrow = static_cast<_Float16>(value);
  uint16_t bits;
  std::memcpy(&bits, &narrow, sizeof(bits));
  return bits;
}

RECOPS_ALWAYS_INLINE void store(float* out, float value) {
  *out = value;
}
RECOPS_ALWAYS_INLINE void store(Fp16* out, float value) {
  out->bits = fp16_bits(value);
}
// bf16 as FBGEMM's dequantization rounds it: half a step away from zero, on the bits (not
// c10's round to nearest even).
RECOPS_ALWAYS_INLINE void store(Bf16* out, float value) {
  out->bits = static_cast<uint16_t>((float_bits(value) + 0x8000u) >> 16);
}

// The row's min and max as FBGEMM's CPU kernel picks them (std::min_element / max_element): the
// first element no other one is below (above). A NaN after the first element is skipped, a NaN
// first element is both; of equal values (+0 and -0) the first wins. The scan runs in eight
// lanes that skip NaN; only a zero result looks for the first zero, to take its sign. A row
// without columns gets 0 and 0 (FBGEMM leaves its scale and bias unwritten).
template <typename T>
RECOPS_ALWAYS_INLINE float first_zero(const T* row, int64_t cols) {
  for (int64_t c = 0; c < cols; ++c) {
    const float v = widen(row[c]);
    if (v == 0.0f) return v;
  }
  return 0.0f;
}

template <typename T>
RECOPS_ALWAYS_INLINE void row_min_max(const T* row, int64_t cols, float& min_out, float& max_out) {
  const float first = cols > 0 ? widen(row[0]) : 0.0f;
  if (cols == 0 || first != first) {
    min_out = first;
    max_out = first;
    return;
  }
  constexpr int kLanes = 8;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  float lane_min[kLanes];
  float lane_max[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    lane_min[l] = kInf;
    lane_max[l] = -kInf;
  }
  const int64_t body = cols / kLanes * kLanes;
  for (int64_t c = 0; c < body; c += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float v = widen(row[c + l]);
      lane_min[l] = v < lane_min[l] ? v : lane_min[l];
      lane_max[l] = v > lane_max[l] ? v : lane_max[l];
    }
  }
  float lo = kInf;
  float hi = -kInf;
  for (int l = 0; l < kLanes; ++l) {
    lo = lane_min[l] < lo ? lane_min[l] : lo;
    hi = lane_max[l] > hi ? lane_max[l] : hi;
  }
  for (int64_t c = body; c < cols; ++c) {
    const float v = widen(row[c]);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  min_out = lo == 0.0f ? first_zero(row, cols) : lo;
  max_out = hi == 0.0f ? first_zero(row, cols) : hi;
}

// v rounded to the nearest integer (ties to even) and saturated to [0, max_code]; NaN gives 0.
// Saturating first keeps v below 2^23, where adding and subtracting 2^23 rounds it.
RECOPS_ALWAYS_INLINE uint8_t round_saturated(float v, float max_code) {
  v = v > 0.0f ? v : 0.0f;
  v = v < max_code ? v : max_code;
  return static_cast<uint8_t>(static_cast<int32_t>((v + 0x1p23f) - 0x1p23f));
}

template <typename Row>
void for_each_row(int64_t rows, int64_t bytes_per_row, const Row& row) {
  parallel_for(0, rows, grain_for_bytes(bytes_per_row), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) row(r);
  });
}

template <typename Fn>
decltype(auto) dispatch_input(FloatKind kind, Fn&& fn) {
  return kind == FloatKind::kHalf ? fn(TypeTag<Fp16>{}) : fn(TypeTag<float>{});
}

template <typename Fn>
decltype(auto) dispatch_bit_rate(int bit_rate, Fn&& fn) {
  switch (bit_rate) {
    case 1:
      return fn(std::integral_constant<int, 1>{});
    case 2:
      return fn(std::integral_constant<int, 2>{});
    case 3:
      return fn(std::integral_constant<int, 3>{});
    case 4:
      return fn(std::integral_constant<int, 4>{});
    case 5:
      return fn(std::integral_constant<int, 5>{});
    case 6:
      return fn(std::integral_constant<int, 6>{});
    case 7:
      return fn(std::integral_constant<int, 7>{});
    default:
      return fn(std::integral_constant<int, 8>{});
  }
}

// ---- 8-bit: float scale and bias.

template <typename T>
void quantize_8bit_row(const T* row, int64_t cols, uint8_t* out) {
  float lo = 0.0f;
  float hi = 0.0f;
  row_min_max(row, cols, lo, hi);
  const float range = hi - lo;
  const float inverse_scale = 255.0f / (range + 1e-8f);
  for (int64_t c = 0; c < cols; ++c) {
    out[c] = round_saturated((widen(row[c]) - lo) * inverse_scale, 255.0f);
  }
  const float scale_bias[2] = {range / 255.0f, lo};
  std::memcpy(out + cols, scale_bias, sizeof(scale_bias));
}

inline void quantize_8bit(const QuantizeArgs& args) {
  const int64_t out_cols = args.cols + kScaleBias8Bit;
  dispatch_input(args.input_kind, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* input = static_cast<const T*>(args.input);
    for_each_row(args.rows, out_cols + args.cols * int64_t{sizeof(T)}, [&](int64_t r) {
      quantize_8bit_row(input + r * args.cols, args.cols, args.output + r * out_cols);
    });
  });
}

// scale * code + bias in double, rounded once to float (the product is exact), as FBGEMM's CPU
// kernel computes it.
RECOPS_ALWAYS_INLINE float dequantized(float scale, float code, float bias) {
  return static_cast<float>(double{scale} * double{code} + double{bias});
}

template <typename Out>
void dequantize_8bit_row(const uint8_t* row, int64_t in_cols, bool scale_bias_last,
                         bool float_scale_bias, Out* out) {
  const int64_t padding = float_scale_bias ? int64_t{sizeof(float)} : int64_t{sizeof(uint16_t)};
  const int64_t out_cols = in_cols - 2 * padding;
  const uint8_t* scale_bias = scale_bias_last ? row + out_cols : row;
  const uint8_t* codes = scale_bias_last ? row : row + 2 * padding;
  float scale = 0.0f;
  float bias = 0.0f;
  if (float_scale_bias) {
    std::memcpy(&scale, scale_bias, sizeof(float));
    std::memcpy(&bias, scale_bias + sizeof(float), sizeof(float));
  } else {
    uint16_t bits[2];
    std::memcpy(bits, scale_bias, sizeof(bits));
    scale = widen_fp16_bits(bits[0]);
    bias = widen_fp16_bits(bits[1]);
  }
  for (int64_t c = 0; c < out_cols; ++c) {
    store(out + c, dequantized(scale, static_cast<float>(codes[c]), bias));
  }
}

inline void dequantize_8bit(const DequantizeArgs& args) {
  const int64_t padding =
      args.float_scale_bias ? int64_t{sizeof(float)} : int64_t{sizeof(uint16_t)};
  const int64_t out_cols = args.in_cols - 2 * padding;
  dispatch_float_kind<FloatKinds::kNoDouble>(args.output_kind, [&](auto tag) {
    using Out = typename decltype(tag)::type;
    auto* output = static_cast<Out*>(args.output);
    for_each_row(args.rows, args.in_cols + out_cols * int64_t{sizeof(Out)}, [&](int64_t r) {
      dequantize_8bit_row(args.input + r * args.in_cols, args.in_cols, args.scale_bias_last,
                          args.float_scale_bias, output + r * out_cols);
    });
  });
}

// ---- N-bit: fp16 scale and bias behind the packed codes.

// Packs count codes (count a multiple of 8 / kBits), the first in the low bits of each byte.
template <int kBits>
RECOPS_ALWAYS_INLINE void pack_codes(const uint8_t* codes, int64_t count, uint8_t* out) {
  constexpr int kPerByte = 8 / kBits;
  for (int64_t j = 0; j < count / kPerByte; ++j) {
    uint8_t byte = 0;
    for (int k = 0; k < kPerByte; ++k) {
      byte = static_cast<uint8_t>(byte | (codes[j * kPerByte + k] << (k * kBits)));
    }
    out[j] = byte;
  }
}

template <int kBits, typename T>
void quantize_nbit_row(const T* row, int64_t cols, uint8_t* out) {
  constexpr int kPerByte = 8 / kBits;
  constexpr float kMaxCode = static_cast<float>((1 << kBits) - 1);
  float lo = 0.0f;
  float hi = 0.0f;
  row_min_max(row, cols, lo, hi);
  // The bias is stored in fp16, so codes count from the fp16 minimum; the max stays in float.
  const uint16_t bias_bits = fp16_bits(lo);
  lo = widen_fp16_bits(bias_bits);
  const float range = hi - lo;
  float scale = widen_fp16_bits(fp16_bits(range == 0.0f ? 1.0f : range / kMaxCode));
  if (scale == 0.0f) scale = 1.0f;  // every value is the minimum: any scale works
  float inverse_scale = 1.0f / scale;
  if (std::isinf(inverse_scale)) {
    scale = 1.0f;
    inverse_scale = 1.0f;
  }
  constexpr int64_t kChunk = 256;  // codes per pass, a multiple of every kPerByte
  uint8_t codes[kChunk];
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int64_t count = std::min(kChunk, cols - c0);
    for (int64_t i = 0; i < count; ++i) {
      codes[i] = round_saturated((widen(row[c0 + i]) - lo) * inverse_scale, kMaxCode);
    }
    pack_codes<kBits>(codes, count, out + c0 / kPerByte);
  }
  // fbgemm-gpu-cpu stores a NaN scale (a row starting with NaN) as 0x7FFF.
  const uint16_t scale_bits = scale != scale ? uint16_t{0x7FFF} : fp16_bits(scale);
  const uint16_t scale_bias[2] = {scale_bits, bias_bits};
  std::memcpy(out + cols / kPerByte, scale_bias, sizeof(scale_bias));
}

inline void quantize_nbit(const QuantizeArgs& args) {
  const int64_t out_cols = args.cols / values_per_byte(args.bit_rate) + kScaleBiasNBit;
  dispatch_bit_rate(args.bit_rate, [&](auto bits) {
    dispatch_input(args.input_kind, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const auto* input = static_cast<const T*>(args.input);
      for_each_row(args.rows, out_cols + args.cols * int64_t{sizeof(T)}, [&](int64_t r) {
        quantize_nbit_row<decltype(bits)::value>(input + r * args.cols, args.cols,
                                                 args.output + r * out_cols);
      });
    });
  });
}

template <int kBits, typename Out>
void dequantize_nbit_row(const uint8_t* row, int64_t in_cols, Out* out) {
  constexpr int kPerByte = 8 / kBits;
  constexpr unsigned kMask = (1u << kBits) - 1;
  const int64_t bytes = in_cols - kScaleBiasNBit;
  uint16_t scale_bias[2];
  std::memcpy(scale_bias, row + bytes, sizeof(scale_bias));
  const float scale = widen_fp16_bits(scale_bias[0]);
  const float bias = widen_fp16_bits(scale_bias[1]);
  for (int64_t j = 0; j < bytes; ++j) {
    for (int k = 0; k < kPerByte; ++k) {
      const auto code = static_cast<float>((row[j] >> (k * kBits)) & kMask);
      store(out + j * kPerByte + k, dequantized(scale, code, bias));
    }
  }
}

inline void dequantize_nbit(const DequantizeArgs& args) {
  const int64_t out_cols = (args.in_cols - kScaleBiasNBit) * values_per_byte(args.bit_rate);
  dispatch_bit_rate(args.bit_rate, [&](auto bits) {
    dispatch_float_kind<FloatKinds::kNoDouble>(args.output_kind, [&](auto tag) {
      using Out = typename decltype(tag)::type;
      auto* output = static_cast<Out*>(args.output);
      for_each_row(args.rows, args.in_cols + out_cols * int64_t{sizeof(Out)}, [&](int64_t r) {
        dequantize_nbit_row<decltype(bits)::value>(args.input + r * args.in_cols, args.in_cols,
                                                   output + r * out_cols);
      });
    });
  });
}

const RowwiseKernels kRowwiseKernels = {&quantize_8bit, &quantize_nbit, &dequantize_8bit,
                                        &dequantize_nbit};

}  // namespace recops::quantize::kernels::RECOPS_ISA_NS

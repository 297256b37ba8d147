// Row conversions between the stored element types (fp32, fp16, bf16) and the fp32 the kernels
// compute in, and the register-blocked row sums built on them. Compiled per instruction set
// (RECOPS_ISA_NS / RECOPS_ISA_LEVEL, see variant.h): plain loops the compiler vectorises, plus F16C
// instructions for fp16 from the AVX2 level up. Narrowing rounds to nearest even, as Fp16 / Bf16
// (common/half_bits.h) do.
#pragma once

#ifndef RECOPS_ISA_NS
#error "compiled once per instruction set: include through recops/embedding/kernels/variant.h"
#endif

namespace recops::embedding::kernels::RECOPS_ISA_NS {

inline void to_float(const Bf16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i].bits) << 16;
    std::memcpy(dst + i, &bits, sizeof(float));
  }
}

inline void from_float(const float* src, Bf16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, src + i, sizeof(float));
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    dst[i].bits = static_cast<uint16_t>(src[i] != src[i] ? 0x7FC0u : rounded);  // NaN stays NaN
  }
}

inline void to_float(const Fp16* src, float* dst, int64_t n) {
  int64_t i = 0;
#if RECOPS_ISA_LEVEL >= 1
  const int64_t vector_end = n - n % 8;
  for (; i < vector_end; i += 8) {
    const __m128i half8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(half8));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

inline void from_float(const float* src, Fp16* dst, int64_t n) {
  int64_t i = 0;
#if RECOPS_ISA_LEVEL >= 1
  for (; i + 8 <= n; i += 8) {
    const __m128i half8 = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), half8);
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<Fp16>(src[i]);
}

inline void from_float(const float* src, float* dst, int64_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

// An INT8 row of n codes (its scale and bias follow them) as fp32.
inline void to_float(const Int8Rowwise* src, float* dst, int64_t n) {
  float scale_bias[2];
  std::memcpy(scale_bias, src + n, sizeof(scale_bias));
  for (int64_t i = 0; i < n; ++i) dst[i] = scale_bias[0] * src[i].code + scale_bias[1];
}

// A row of T as fp32: the row itself for fp32, else converted into `scratch` (n floats).
template <typename T>
const float* row_as_float(const T* row, float* scratch, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return row;
  } else {
    to_float(row, scratch, n);
    return scratch;
  }
}

// Sums over many rows run column block by column block, each block a compile-time width so that
// its accumulator stays in vector registers (a memory accumulator is re-stored and re-loaded for
// every row, which measured 2x slower): blocks of kMaxBlock columns, then one of 128 and one of 64
// where they fit, then 16, 4 and 1. On AVX-512 a block is 256 columns (16 of the 32 registers), so
// a bag of 256-column rows takes one pass over its rows: a second pass issued no prefetches while
// it ran and measured 15-20% slower on large int8 lookups.
constexpr int64_t kMaxBlock = RECOPS_ISA_LEVEL == 2 ? 256 : RECOPS_ISA_LEVEL == 1 ? 64 : 32;

template <int64_t kWidth>
using BlockWidth = std::integral_constant<int64_t, kWidth>;

// Calls fn(BlockWidth<W>{}, first_column) for consecutive blocks covering columns [0, D).
template <typename Fn>
inline void for_each_column_block(int64_t D, const Fn& fn) {
  int64_t c = 0;
  for (; c + kMaxBlock <= D; c += kMaxBlock) fn(BlockWidth<kMaxBlock>{}, c);
  if constexpr (kMaxBlock > 128) {
    if (c + 128 <= D) fn(BlockWidth<128>{}, std::exchange(c, c + 128));
  }
  if constexpr (kMaxBlock > 64) {
    if (c + 64 <= D) fn(BlockWidth<64>{}, std::exchange(c, c + 64));
  }
  for (; c + 16 <= D; c += 16) fn(BlockWidth<16>{}, c);
  for (; c + 4 <= D; c += 4) fn(BlockWidth<4>{}, c);
  for (; c < D; ++c) fn(BlockWidth<1>{}, c);
}

// acc[0, W) += scale * row[0, W), widening row to fp32.
template <int64_t kWidth, typename T>
inline void add_scaled_block(float* __restrict acc, const T* __restrict row, float scale) {
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t i = 0; i < kWidth; ++i) acc[i] += scale * row[i];
  } else {
    float widened[kWidth];
    to_float(row, widened, kWidth);
    for (int64_t i = 0; i < kWidth; ++i) acc[i] += scale * widened[i];
  }
}

// acc[0, W) += scale * row[c, c + W) for a stored row of dim D (an INT8 row's scale and bias
// follow its D codes, so it is read whole rather than from column c).
template <int64_t kWidth, typename T>
inline void add_row_block(float* __restrict acc, const T* __restrict row, int64_t c, int64_t D,
                          float scale) {
  if constexpr (std::is_same_v<T, Int8Rowwise>) {
    float scale_bias[2];
    std::memcpy(scale_bias, row + D, sizeof(scale_bias));
    const float code_scale = scale * scale_bias[0], offset = scale * scale_bias[1];
    for (int64_t i = 0; i < kWidth; ++i) acc[i] += code_scale * row[c + i].code + offset;
  } else {
    add_scaled_block<kWidth>(acc, row + c, scale);
  }
}

inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace recops::embedding::kernels::RECOPS_ISA_NS

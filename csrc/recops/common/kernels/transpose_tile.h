// The transpose of a tile in cache, for the kernels of any op family: 16 x 16 blocks of fp32 (and
// of bf16 bits) moved through registers. Per instruction set: included by a family's
// variant_<isa>.cpp (after it defined RECOPS_ISA_NS) into recops::RECOPS_ISA_NS, which every
// family's variant of one instruction set shares. The element-by-element loop of common/blas.h's
// transpose does not vectorise (its reads stride down the columns): in the loss op it took ~2% of
// the samples, through registers ~0.3%.
#pragma once

#ifndef RECOPS_ISA_NS
#error "compiled once per instruction set: include from a variant_<isa>.cpp"
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "recops/common/cpu_isa.h"

namespace recops::RECOPS_ISA_NS {

// 16 x 16 blocks transposed in registers: 16 vectors of 16 lanes of E (16 or 32 bits), four
// stages that swap off-diagonal sub-blocks.
namespace lanes16 {

// A vector of 16 E, and the shuffle masks' integer vector of the same shape.
template <typename E>
struct Lanes;
template <>
struct Lanes<float> {
  using Vec = float __attribute__((vector_size(64)));
  using Index = int32_t __attribute__((vector_size(64)));
};
template <>
struct Lanes<uint32_t> {
  using Vec = uint32_t __attribute__((vector_size(64)));
  using Index = int32_t __attribute__((vector_size(64)));
};
template <>
struct Lanes<uint16_t> {
  using Vec = uint16_t __attribute__((vector_size(32)));
  using Index = int16_t __attribute__((vector_size(32)));
};
template <typename E>
using Vec = typename Lanes<E>::Vec;

// (Vectors by reference: by value they would change the ABI across ISA levels.)
template <typename E>
RECOPS_ALWAYS_INLINE void load(const void* p, Vec<E>& v) {
  std::memcpy(&v, p, sizeof(v));
}

template <typename E>
RECOPS_ALWAYS_INLINE void store(void* p, const Vec<E>& v) {
  std::memcpy(p, &v, sizeof(v));
}

// Swaps the off-diagonal B x B sub-blocks of rows a and b = a + B.
template <typename E, int B, int... J>
RECOPS_ALWAYS_INLINE void swap_sub_blocks(Vec<E>& a, Vec<E>& b, std::integer_sequence<int, J...>) {
  using Index = typename Lanes<E>::Index;
  constexpr Index kLow = {((J & B) != 0 ? 16 + J - B : J)...};
  constexpr Index kHigh = {((J & B) != 0 ? 16 + J : J + B)...};
  const Vec<E> low = __builtin_shuffle(a, b, kLow);
  b = __builtin_shuffle(a, b, kHigh);
  a = low;
}

template <typename E, int B>
RECOPS_ALWAYS_INLINE void transpose_stage(Vec<E>* m) {
  for (int i = 0; i < 16; ++i) {
    if ((i & B) == 0) swap_sub_blocks<E, B>(m[i], m[i + B], std::make_integer_sequence<int, 16>());
  }
}

template <typename E>
RECOPS_ALWAYS_INLINE void transpose(Vec<E>* m) {
  transpose_stage<E, 1>(m);
  transpose_stage<E, 2>(m);
  transpose_stage<E, 4>(m);
  transpose_stage<E, 8>(m);
}

// dst element (c, r) = src element (r, c) of a [rows, cols] matrix of E-sized elements, addressed
// in 16-bit units (element (r, c) of src at src + r * ld_src + c * sizeof(E) / 2; of dst alike):
// full 16 x 16 blocks in registers, the edges element by element.
template <typename E>
void transpose_matrix(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src,
                      uint16_t* dst, int64_t ld_dst) {
  constexpr int64_t kWidth = sizeof(E) / sizeof(uint16_t);
  const int64_t full_rows = rows / 16 * 16, full_cols = cols / 16 * 16;
  for (int64_t r0 = 0; r0 < full_rows; r0 += 16) {
    for (int64_t c0 = 0; c0 < full_cols; c0 += 16) {
      Vec<E> m[16];
      for (int t = 0; t < 16; ++t) load<E>(src + (r0 + t) * ld_src + c0 * kWidth, m[t]);
      transpose<E>(m);
      for (int t = 0; t < 16; ++t) store<E>(dst + (c0 + t) * ld_dst + r0 * kWidth, m[t]);
    }
  }
  const auto move = [&](int64_t r, int64_t c) {
    std::memcpy(dst + c * ld_dst + r * kWidth, src + r * ld_src + c * kWidth, sizeof(E));
  };
  for (int64_t r = 0; r < full_rows; ++r) {
    for (int64_t c = full_cols; c < cols; ++c) move(r, c);
  }
  for (int64_t r = full_rows; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) move(r, c);
  }
}

// dst[c * ld_dst + r] = scale * src[r * ld_src + c] (+ dst[c * ld_dst + r] when accumulating) for
// fp32: full 16 x 16 blocks in registers, scaled (and added) as they are stored, the edges element
// by element in the same arithmetic.
inline void transpose_scaled(const float* src, int64_t rows, int64_t cols, int64_t ld_src,
                             float* dst, int64_t ld_dst, float scale, bool accumulate) {
  const int64_t full_rows = rows / 16 * 16, full_cols = cols / 16 * 16;
  const auto put = [&](float* out, float x) { *out = accumulate ? *out + x : x; };
  for (int64_t r0 = 0; r0 < full_rows; r0 += 16) {
    for (int64_t c0 = 0; c0 < full_cols; c0 += 16) {
      Vec<float> m[16];
      for (int t = 0; t < 16; ++t) load<float>(src + (r0 + t) * ld_src + c0, m[t]);
      transpose<float>(m);
      for (int t = 0; t < 16; ++t) {
        float* out = dst + (c0 + t) * ld_dst + r0;
        Vec<float> x = scale * m[t];
        if (accumulate) {
          Vec<float> before;
          load<float>(out, before);
          x = before + x;
        }
        store<float>(out, x);
      }
    }
  }
  for (int64_t r = 0; r < full_rows; ++r) {
    for (int64_t c = full_cols; c < cols; ++c)
      put(dst + c * ld_dst + r, scale * src[r * ld_src + c]);
  }
  for (int64_t r = full_rows; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) put(dst + c * ld_dst + r, scale * src[r * ld_src + c]);
  }
}

}  // namespace lanes16

// dst [cols, rows] = the transpose of src [rows, cols] (row strides ld_src, ld_dst), a tile in
// cache: fp32 through lanes16's register blocks, other types (float64 validation) element by
// element.
template <typename T>
void transpose_tile(const T* src, int64_t rows, int64_t cols, int64_t ld_src, T* dst,
                    int64_t ld_dst) {
  if constexpr (std::is_same_v<T, float>) {
    constexpr int64_t kUnits = sizeof(float) / sizeof(uint16_t);  // lanes16 counts 16-bit units
    lanes16::transpose_matrix<float>(reinterpret_cast<const uint16_t*>(src), rows, cols,
                                     kUnits * ld_src, reinterpret_cast<uint16_t*>(dst),
                                     kUnits * ld_dst);
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) dst[c * ld_dst + r] = src[r * ld_src + c];
    }
  }
}

// dst [cols, rows] = scale * the transpose of src [rows, cols], added to dst when accumulating
// (a work item's transposed key gradients into their rows): as transpose_tile, fp32 through
// registers, other types element by element in the same arithmetic.
template <typename T>
void transpose_tile_scaled(const T* src, int64_t rows, int64_t cols, int64_t ld_src, T* dst,
                           int64_t ld_dst, T scale, bool accumulate) {
  if constexpr (std::is_same_v<T, float>) {
    lanes16::transpose_scaled(src, rows, cols, ld_src, dst, ld_dst, scale, accumulate);
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const T x = scale * src[r * ld_src + c];
        T& out = dst[c * ld_dst + r];
        out = accumulate ? out + x : x;
      }
    }
  }
}

}  // namespace recops::RECOPS_ISA_NS

// 16-bit floating-point values as kernels see them: Bf16 (bfloat16) and Fp16 (IEEE binary16), a
// uint16_t of bits each, with explicit conversions to and from float. They are layout-identical
// to c10::BFloat16 / c10::Half (one uint16_t, trivially copyable), so adapters pass a tensor's
// data pointer reinterpreted (common/dispatch.h's data_as), and the conversions give the same
// bits as c10's on every input: round to nearest even; a NaN becomes 0x7FC0 (bf16) or
// sign | 0x7E00 (fp16), and an fp16 NaN widens to a quiet float NaN with its payload.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace recops {

inline uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float float_from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline uint16_t bf16_bits_from_float(float value) {
  if (value != value) return 0x7FC0;
  const uint32_t bits = float_bits(value);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

inline float float_from_bf16_bits(uint16_t bits) {
  return float_from_bits(static_cast<uint32_t>(bits) << 16);
}

inline uint16_t fp16_bits_from_float(float value) {
  const uint32_t bits = float_bits(value);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return sign | 0x7E00u;  // NaN
  // 65520 = 65504 (the largest fp16) + half a step rounds to even, which is infinity.
  if (magnitude >= 0x477FF000u) return sign | 0x7C00u;
  if (magnitude >= 0x38800000u) {  // 2^-14 and up: a normal fp16
    // Rebias the exponent (127 -> 15), then drop 13 mantissa bits rounding to nearest even; a
    // carry out of the mantissa correctly bumps the exponent.
    const uint32_t rebiased = magnitude - (112u << 23);
    return sign | static_cast<uint16_t>((rebiased + 0xFFFu + ((rebiased >> 13) & 1u)) >> 13);
  }
  // Below 2^-14: a subnormal fp16, value / 2^-24 rounded to nearest even; up to 2^-25 (exactly
  // half of the smallest subnormal, rounding to even 0) everything becomes zero.
  if (magnitude <= 0x33000000u) return sign;
  const uint32_t exponent = magnitude >> 23;  // 102 .. 112
  const uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - exponent;  // value = mantissa * 2^(exponent - 150) = .. 2^-24
  uint32_t result = mantissa >> shift;
  const uint32_t remainder = mantissa & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (remainder > half || (remainder == half && (result & 1u) != 0)) ++result;
  return sign | static_cast<uint16_t>(result);
}

inline float float_from_fp16_bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) {  // infinity, or NaN (made quiet, as a float operation would)
    return float_from_bits(sign | 0x7F800000u | (mantissa << 13) | (mantissa != 0 ? 0x400000u : 0));
  }
  if (exponent != 0) return float_from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  return float_from_bits(sign | float_bits(static_cast<float>(mantissa) * 0x1p-24f));
}

struct Bf16 {
  uint16_t bits;

  Bf16() = default;
  explicit Bf16(float value) : bits(bf16_bits_from_float(value)) {}
  explicit operator float() const { return float_from_bf16_bits(bits); }
};

struct Fp16 {
  uint16_t bits;

  Fp16() = default;
  explicit Fp16(float value) : bits(fp16_bits_from_float(value)) {}
  explicit operator float() const { return float_from_fp16_bits(bits); }
};

static_assert(sizeof(Bf16) == 2 && alignof(Bf16) == 2 && std::is_trivially_copyable_v<Bf16>);
static_assert(sizeof(Fp16) == 2 && alignof(Fp16) == 2 && std::is_trivially_copyable_v<Fp16>);

// The type a kernel accumulates T in: float for the 16-bit types, T itself otherwise (as
// at::opmath_type).
template <typename T>
struct AccumulateType {
  using type = T;
};
template <>
struct AccumulateType<Bf16> {
  using type = float;
};
template <>
struct AccumulateType<Fp16> {
  using type = float;
};
template <typename T>
using accumulate_t = typename AccumulateType<T>::type;

}  // namespace recops

// Input validation shared by every op family's ATen adapter. Each check names the offending
// argument and the violated rule so that bad input surfaces as a readable Python exception.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace recops {

inline void check_dim(const at::Tensor& t, int64_t dim, const char* name) {
  TORCH_CHECK(t.dim() == dim, name, " must be ", dim, "-D, got shape ", t.sizes());
}

inline void check_index_dtype(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, name,
              " must be int32 or int64, got ", t.scalar_type());
}

inline void check_floating(const at::Tensor& t, const char* name) {
  TORCH_CHECK(at::isFloatingType(t.scalar_type()), name,
              " must be float32, bfloat16, float16 or float64, got ", t.scalar_type());
}

inline void check_same_dtype(const at::Tensor& a, const char* a_name, const at::Tensor& b,
                             const char* b_name) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), a_name, " and ", b_name,
              " must share one dtype, got ", a.scalar_type(), " and ", b.scalar_type());
}

inline void check_cpu(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor, got ", t.device());
}

// A floating-point scalar argument (a scale, rate or divisor) must be a finite number in the type
// the kernel computes in: NaN or inf would raise nowhere later but silently poison or flatten the
// result, and a double beyond float's range turns into inf when a float kernel narrows it.
inline void check_finite(double value, const char* name, at::ScalarType compute = at::kDouble) {
  const bool in_range =
      compute == at::kDouble || std::abs(value) <= std::numeric_limits<float>::max();
  TORCH_CHECK_VALUE(std::isfinite(value) && in_range, name, " must be a finite number",
                    compute == at::kDouble ? "" : " in float32's range", ", got ", value);
}

// Reads the i-th element of a 1-D int32/int64 CPU tensor.
inline int64_t index_at(const at::Tensor& t, int64_t i) {
  return t.scalar_type() == at::kInt ? t.const_data_ptr<int32_t>()[i]
                                     : t.const_data_ptr<int64_t>()[i];
}

// The scans below run on every call of the ops they guard, over inputs as long as the op's own
// work, so each first answers "is anything wrong" with a reduction the compiler vectorises (an
// integer OR or max; a loop that returns at the first bad entry stays scalar, about 1 ns per
// entry), and only then looks for the first offender to name it.

// Offsets describe segments [offsets[i], offsets[i+1]). They must start at >= 0 and never
// decrease; otherwise a kernel would read or write outside the values it indexes.
template <typename index_t>
int64_t first_decrease(const index_t* offsets, int64_t n) {
  uint32_t any = 0;
  for (int64_t i = 0; i + 1 < n; ++i) any |= static_cast<uint32_t>(offsets[i + 1] < offsets[i]);
  if (any == 0) return -1;
  for (int64_t i = 0; i + 1 < n; ++i) {
    if (offsets[i + 1] < offsets[i]) return i;
  }
  return -1;
}

inline void check_offsets_monotonic(const at::Tensor& offsets, const char* name) {
  const int64_t n = offsets.numel();
  if (n == 0) return;
  const int64_t first = index_at(offsets, 0);
  TORCH_CHECK_VALUE(first >= 0, name, " must be >= 0, got ", name, "[0] = ", first);
  const int64_t bad = offsets.scalar_type() == at::kInt
                          ? first_decrease(offsets.const_data_ptr<int32_t>(), n)
                          : first_decrease(offsets.const_data_ptr<int64_t>(), n);
  TORCH_CHECK_VALUE(bad < 0, name, " must be non-decreasing, got ", name, "[", bad,
                    "] = ", bad < 0 ? 0 : index_at(offsets, bad), " > ", name, "[", bad + 1,
                    "] = ", bad < 0 ? 0 : index_at(offsets, bad + 1));
}

// Lengths are segment sizes: every entry must be >= 0.
template <typename index_t>
int64_t first_negative(const index_t* lengths, int64_t n) {
  index_t bits = 0;  // the sign bit of the OR is set iff some entry is negative
  for (int64_t i = 0; i < n; ++i) bits |= lengths[i];
  if (bits >= 0) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (lengths[i] < 0) return i;
  }
  return -1;
}

inline void check_lengths_non_negative(const at::Tensor& lengths, const char* name) {
  const int64_t n = lengths.numel();
  const int64_t bad = lengths.scalar_type() == at::kInt
                          ? first_negative(lengths.const_data_ptr<int32_t>(), n)
                          : first_negative(lengths.const_data_ptr<int64_t>(), n);
  TORCH_CHECK_VALUE(bad < 0, name, " must be >= 0, got ", name, ".flatten()[", bad,
                    "] = ", bad < 0 ? 0 : index_at(lengths, bad));
}

// The first i with index[i] outside [0, bound), or -1.
template <typename index_t>
int64_t first_out_of_range(const index_t* index, int64_t n, int64_t bound) {
  using unsigned_t = std::make_unsigned_t<index_t>;
  if (bound > static_cast<int64_t>(std::numeric_limits<index_t>::max())) {
    return first_negative(index, n);  // every non-negative entry is below bound
  }
  // Compared unsigned, a negative entry is a huge value: one compare covers both ends.
  const unsigned_t limit = static_cast<unsigned_t>(bound);
  unsigned_t any = 0;
  for (int64_t i = 0; i < n; ++i) any |= static_cast<unsigned_t>(index[i]) >= limit;
  if (any == 0) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<unsigned_t>(index[i]) >= limit) return i;
  }
  return -1;
}

}  // namespace recops

// Input validation shared by every op family's ATen adapter. Each check names the offending
// argument and the violated rule so that bad input surfaces as a readable Python exception.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "recops/common/index_scans.h"

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

// A probability argument (a dropout rate): a number in [0, 1] (NaN is not).
inline void check_probability(double p, const char* name) {
  TORCH_CHECK_VALUE(p >= 0.0 && p <= 1.0, name, " must be in [0, 1], got ", p);
}

// Reads the i-th element of a 1-D int32/int64 CPU tensor.
inline int64_t index_at(const at::Tensor& t, int64_t i) {
  return t.scalar_type() == at::kInt ? t.const_data_ptr<int32_t>()[i]
                                     : t.const_data_ptr<int64_t>()[i];
}

// Offsets describe segments [offsets[i], offsets[i+1]). They must start at >= 0 and never
// decrease; otherwise a kernel would read or write outside the values it indexes.
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
inline void check_lengths_non_negative(const at::Tensor& lengths, const char* name) {
  const int64_t n = lengths.numel();
  const int64_t bad = lengths.scalar_type() == at::kInt
                          ? first_negative(lengths.const_data_ptr<int32_t>(), n)
                          : first_negative(lengths.const_data_ptr<int64_t>(), n);
  TORCH_CHECK_VALUE(bad < 0, name, " must be >= 0, got ", name, ".flatten()[", bad,
                    "] = ", bad < 0 ? 0 : index_at(lengths, bad));
}

}  // namespace recops

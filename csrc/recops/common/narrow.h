// Narrowing int64 index tensors to int32 (a kernel's or a requested index type). A narrowing cast
// must never change a value: index 2^32 must not become row 0. The test that every value
// round-trips rides along the conversion's one vectorised pass; only a failed tensor is scanned
// again, to name the first offender.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <cstdint>

#include "recops/common/parallel.h"

namespace recops {

// out[i] = in[i] for i in [0, n); returns whether every value fits in int32.
inline bool narrow_to_int32(const int64_t* in, int32_t* out, int64_t n) {
  return parallel_reduce(
      int64_t{0}, n, int64_t{1} << 16, true,
      [&](int64_t begin, int64_t end, bool fits) {
        uint32_t changed = 0;
        for (int64_t i = begin; i < end; ++i) {
          const auto narrowed = static_cast<int32_t>(in[i]);
          out[i] = narrowed;
          changed |= static_cast<uint32_t>(narrowed != in[i]);
        }
        return fits && changed == 0;
      },
      [](bool a, bool b) { return a && b; });
}

// The int64 tensor t as a contiguous int32 tensor of its shape; an IndexError naming `name` and
// the first entry outside int32's range otherwise.
inline at::Tensor checked_int32(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kLong, name, " must be int64 to be narrowed to int32, got ",
              t.scalar_type());
  const at::Tensor in = t.contiguous();
  at::Tensor out = at::empty(in.sizes(), in.options().dtype(at::kInt));
  const int64_t* values = in.const_data_ptr<int64_t>();
  if (!narrow_to_int32(values, out.mutable_data_ptr<int32_t>(), in.numel())) {
    int64_t i = 0;
    while (values[i] == static_cast<int32_t>(values[i])) ++i;
    TORCH_CHECK_INDEX(false, name, ".flatten()[", i, "] = ", values[i],
                      " does not fit in int32, [-2^31, 2^31 - 1]: narrowing would change it");
  }
  return out;
}

}  // namespace recops

// segment_sum_csr's adapter: validates, allocates and dispatches to kernels/segment_sum.h.
#include <ATen/ops/empty.h>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/jagged/kernels/segment_sum.h"
#include "recops/jagged/ops.h"

namespace recops::jagged {
namespace {

// Calls fn(TypeTag<T>{}) with the kernel type of the values: int32, int64 or a floating type.
template <typename Fn>
void dispatch_summable(at::ScalarType dtype, Fn&& fn) {
  if (dtype == at::kInt || dtype == at::kLong) {
    dispatch_index_kind(index_kind(dtype), fn);
    return;
  }
  TORCH_CHECK(at::isFloatingType(dtype),
              "values must be int32, int64, float32, float64, float16 or bfloat16, got ", dtype);
  dispatch_float_kind(float_kind(dtype, "values"), fn);
}

}  // namespace

at::Tensor segment_sum_csr(int64_t batch_size, const at::Tensor& csr_seg,
                           const at::Tensor& values) {
  check_cpu(csr_seg, "csr_seg");
  check_cpu(values, "values");
  check_index_dtype(csr_seg, "csr_seg");
  TORCH_CHECK_VALUE(csr_seg.numel() >= 1, "csr_seg must hold at least one offset, got none");
  TORCH_CHECK_VALUE(batch_size >= 0, "batch_size must be >= 0, got ", batch_size);
  // Both are read flat, as FBGEMM reads them.
  const at::Tensor csr = csr_seg.contiguous();
  check_offsets_monotonic(csr, "csr_seg");
  const int64_t num_segments = csr.numel() - 1;
  const int64_t last = index_at(csr, num_segments);
  TORCH_CHECK_VALUE(batch_size == 0 || last <= values.numel() / batch_size, "csr_seg[",
                    num_segments, "] * batch_size = ", last, " * ", batch_size,
                    " exceeds the number of values, ", values.numel());
  const at::Tensor flat = values.contiguous();
  at::Tensor out = at::empty({num_segments}, flat.options());
  dispatch_summable(flat.scalar_type(), [&](auto value_tag) {
    using value_t = typename decltype(value_tag)::type;
    dispatch_index_kind(index_kind(csr.scalar_type()), [&](auto index_tag) {
      using index_t = typename decltype(index_tag)::type;
      kernels::segment_sum_csr(csr.const_data_ptr<index_t>(), num_segments, batch_size,
                               data_as<value_t>(flat), mutable_data_as<value_t>(out));
    });
  });
  return out;
}

}  // namespace recops::jagged

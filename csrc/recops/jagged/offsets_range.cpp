#include <ATen/ops/empty.h>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/jagged/kernels/offsets_range.h"
#include "recops/jagged/ops.h"

namespace recops::jagged {

at::Tensor offsets_range(const at::Tensor& offsets, int64_t range_size) {
  check_cpu(offsets, "offsets");
  check_dim(offsets, 1, "offsets");
  check_index_dtype(offsets, "offsets");
  TORCH_CHECK_VALUE(range_size >= 0, "range_size must be >= 0, got ", range_size);
  const at::Tensor offsets_c = offsets.contiguous();
  check_offsets_monotonic(offsets_c, "offsets");
  const int64_t num_segments = offsets_c.numel();
  if (num_segments > 0) {
    const int64_t last = index_at(offsets_c, num_segments - 1);
    TORCH_CHECK(last <= range_size, "offsets[-1] = ", last,
                " must be <= range_size = ", range_size);
  }
  at::Tensor out = at::empty({range_size}, offsets_c.options());
  dispatch_index_kind(index_kind(offsets_c.scalar_type()), [&](auto index_tag) {
    using index_t = typename decltype(index_tag)::type;
    kernels::offsets_range(offsets_c.const_data_ptr<index_t>(), num_segments, range_size,
                           out.mutable_data_ptr<index_t>());
  });
  return out;
}

}  // namespace recops::jagged

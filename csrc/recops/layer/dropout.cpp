// counter_dropout's adapter (docs/ops.md section 8).
#include <ATen/ops/empty.h>

#include <cstdint>
#include <limits>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/layer/kernels/layer_kernels.h"
#include "recops/layer/operands.h"
#include "recops/layer/ops.h"

namespace recops::layer {

at::Tensor counter_dropout(const at::Tensor& x, double p, const at::Tensor& seed, int64_t offset) {
  check_cpu(x, "x");
  const FloatKind kind = float_kind(x.scalar_type(), "x");
  check_probability(p, "p");
  const int64_t seed_value = read_seed(seed);
  const int64_t cols = x.dim() == 0 ? 1 : x.size(-1);
  // Columns are counted in 32 bits by the hash.
  TORCH_CHECK_VALUE(cols <= std::numeric_limits<uint32_t>::max(),
                    "x's last dimension must be below 2^32, got ", cols);
  const at::Tensor in = x.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options());
  if (x.numel() == 0) return out;
  const int64_t rows = x.numel() / cols;
  const auto key = kernels::DropoutKey::make(seed_value, offset, p);
  dispatch_float_kind(kind, [&](auto tag) {
    using T = typename decltype(tag)::type;
    kernels::layer_kernels<T>().dropout(data_as<T>(in), cols, mutable_data_as<T>(out), cols, rows,
                                        cols, key);
  });
  return out;
}

}  // namespace recops::layer

#include <ATen/ops/full.h>

#include "recops/hashing/ops.h"

namespace recops::hashing {

std::tuple<at::Tensor, at::Tensor> create_zch_buffer(int64_t size, bool support_evict,
                                                     std::optional<at::Device> device,
                                                     bool long_type) {
  TORCH_CHECK_VALUE(size >= 0, "size must be >= 0, got ", size);
  constexpr int64_t kEmptySlot = -1;
  const auto options = at::TensorOptions().device(device);
  at::Tensor identities =
      at::full({size, 1}, kEmptySlot, options.dtype(long_type ? at::kLong : at::kInt));
  at::Tensor metadata;
  if (support_evict) metadata = at::full({size, 1}, kEmptySlot, options.dtype(at::kInt));
  return {identities, metadata};
}

}  // namespace recops::hashing

#include <ATen/ops/empty.h>

#include "recops/common/memory.h"
#include "recops/embedding/ops.h"

namespace recops::embedding {

at::Tensor embedding_host_zeros(int64_t numel, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(numel >= 0, "numel must be >= 0, got ", numel);
  at::Tensor buffer = at::empty({numel}, at::TensorOptions().dtype(dtype));
  advise_huge_pages(buffer.mutable_data_ptr(), buffer.nbytes());
  return buffer.zero_();
}

}  // namespace recops::embedding

// merge_pooled_embeddings (FBGEMM's schema): on CPU, torch.cat of the tensors along cat_dim with
// the first tensor's dtype, moved to target_device; uncat_dim_size is not read (as in FBGEMM).
// Tensors of one dtype and rank whose other sizes agree take the parallel copy kernel; any other
// list (mixed dtypes, the legacy 1-D empty tensors torch.cat skips) gets torch.cat's own rules.
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>

#include <string>
#include <vector>

#include "recops/common/checks.h"
#include "recops/keyed/kernels/concatenate.h"
#include "recops/keyed/ops.h"

namespace recops::keyed {
namespace {

// Whether the kernel can concatenate `tensors` along `dim` (already wrapped): one dtype and rank,
// sizes equal outside `dim`.
bool plain_concatenation(at::TensorList tensors, int64_t dim) {
  const at::Tensor& first = tensors[0];
  for (const at::Tensor& t : tensors) {
    if (t.scalar_type() != first.scalar_type() || t.dim() != first.dim()) return false;
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (d != dim && t.size(d) != first.size(d)) return false;
    }
  }
  return true;
}

at::Tensor concatenated(at::TensorList tensors, int64_t dim) {
  const at::Tensor& first = tensors[0];
  std::vector<int64_t> shape = first.sizes().vec();
  shape[dim] = 0;
  for (const at::Tensor& t : tensors) shape[dim] += t.size(dim);
  int64_t rows = 1;
  for (int64_t d = 0; d < dim; ++d) rows *= shape[d];
  std::vector<at::Tensor> parts;
  std::vector<const char*> part_data;
  std::vector<int64_t> part_bytes;
  for (const at::Tensor& t : tensors) {
    parts.push_back(t.contiguous());
    part_data.push_back(static_cast<const char*>(parts.back().const_data_ptr()));
    // Bytes per row: the tensor's elements over the `rows` outer rows (0 when rows is 0).
    part_bytes.push_back(rows == 0 ? 0 : t.numel() / rows * t.element_size());
  }
  at::Tensor out = at::empty(shape, first.options());
  kernels::concatenate(part_data.data(), part_bytes.data(), static_cast<int64_t>(parts.size()),
                       rows, static_cast<char*>(out.mutable_data_ptr()));
  return out;
}

}  // namespace

at::Tensor merge_pooled_embeddings(at::TensorList pooled_embeddings, int64_t /*uncat_dim_size*/,
                                   at::Device target_device, int64_t cat_dim) {
  TORCH_CHECK(!pooled_embeddings.empty(), "pooled_embeddings must hold at least one tensor");
  for (size_t i = 0; i < pooled_embeddings.size(); ++i) {
    check_cpu(pooled_embeddings[i], ("pooled_embeddings[" + std::to_string(i) + "]").c_str());
  }
  const int64_t rank = pooled_embeddings[0].dim();
  at::Tensor result;
  if (rank > 0 && cat_dim >= -rank && cat_dim < rank &&
      plain_concatenation(pooled_embeddings, cat_dim < 0 ? cat_dim + rank : cat_dim)) {
    result = concatenated(pooled_embeddings, cat_dim < 0 ? cat_dim + rank : cat_dim);
  } else {
    try {
      result = at::empty({0}, pooled_embeddings[0].options());
      at::cat_out(result, pooled_embeddings, cat_dim);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "pooled_embeddings cannot be concatenated along cat_dim = ", cat_dim, ": ",
                  e.what_without_backtrace());
    }
  }
  if (!target_device.is_cpu()) result = result.to(target_device, /*non_blocking=*/true);
  return result;
}

}  // namespace recops::keyed

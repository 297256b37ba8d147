// permute_pooled_embs (FBGEMM's schema): the pooled embeddings of T features, [B, sum of dims]
// with feature t in columns [offset_dim_list[t], offset_dim_list[t + 1]), regrouped so that output
// block i is input feature permute_list[i], laid out by inv_offset_dim_list. The inverse lists
// only serve the backward (the same op with the roles swapped), which checks them as it uses them.
#include <ATen/ATen.h>

#include "recops/common/checks.h"
#include "recops/sparse/kernels/permute_pooled.h"
#include "recops/sparse/ops.h"

namespace recops::sparse {
namespace {

// An int64 [n] CPU tensor, contiguous.
at::Tensor checked_list(const at::Tensor& t, int64_t n, const char* name) {
  check_cpu(t, name);
  TORCH_CHECK(t.dim() == 1 && t.numel() == n && t.scalar_type() == at::kLong, name,
              " must be int64 [", n, "], got ", t.scalar_type(), " ", t.sizes());
  return t.contiguous();
}

// Column offsets of T blocks: start at 0, non-decreasing, end at `width`.
void check_column_offsets(const at::Tensor& offsets, int64_t width, const char* name) {
  const int64_t* o = offsets.const_data_ptr<int64_t>();
  const int64_t n = offsets.numel();
  TORCH_CHECK(o[0] == 0, name, "[0] must be 0, got ", o[0]);
  for (int64_t i = 1; i < n; ++i) {
    TORCH_CHECK(o[i] >= o[i - 1], name, " must be non-decreasing, but ", name, "[", i, "] = ", o[i],
                " < ", o[i - 1]);
  }
  TORCH_CHECK(o[n - 1] == width, name, " must end at pooled_embs.size(1) = ", width, ", got ",
              o[n - 1]);
}

}  // namespace

at::Tensor permute_pooled_embs(const at::Tensor& pooled_embs, const at::Tensor& offset_dim_list,
                               const at::Tensor& permute_list,
                               const at::Tensor& inv_offset_dim_list,
                               const at::Tensor& inv_permute_list) {
  check_cpu(pooled_embs, "pooled_embs");
  check_dim(pooled_embs, 2, "pooled_embs");
  check_cpu(permute_list, "permute_list");
  TORCH_CHECK(permute_list.dim() == 1, "permute_list must be 1-D, got ", permute_list.dim(), "-D");
  const int64_t T = permute_list.numel();
  const int64_t width = pooled_embs.size(1);
  const at::Tensor permute = checked_list(permute_list, T, "permute_list");
  const at::Tensor in_offsets = checked_list(offset_dim_list, T + 1, "offset_dim_list");
  const at::Tensor out_offsets = checked_list(inv_offset_dim_list, T + 1, "inv_offset_dim_list");
  checked_list(inv_permute_list, T, "inv_permute_list");
  check_column_offsets(in_offsets, width, "offset_dim_list");
  check_column_offsets(out_offsets, width, "inv_offset_dim_list");
  const int64_t* p = permute.const_data_ptr<int64_t>();
  const int64_t* in_o = in_offsets.const_data_ptr<int64_t>();
  const int64_t* out_o = out_offsets.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < T; ++i) {
    TORCH_CHECK(p[i] >= 0 && p[i] < T, "permute_list[", i, "] = ", p[i],
                " is not a feature in [0, ", T, ")");
    TORCH_CHECK(out_o[i + 1] - out_o[i] == in_o[p[i] + 1] - in_o[p[i]],
                "inv_offset_dim_list gives ", "output block ", i, " width ",
                out_o[i + 1] - out_o[i], " but feature ", p[i], " (permute_list[", i,
                "]) has width ", in_o[p[i] + 1] - in_o[p[i]], " in offset_dim_list");
  }
  const at::Tensor in = pooled_embs.contiguous();
  at::Tensor out = at::empty_like(in, at::MemoryFormat::Contiguous);
  kernels::permute_column_blocks(static_cast<const char*>(in.const_data_ptr()),
                                 static_cast<char*>(out.mutable_data_ptr()), in.size(0), width,
                                 in.element_size(), in_o, out_o, p, T);
  return out;
}

}  // namespace recops::sparse

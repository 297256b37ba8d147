// jagged_unique_indices' adapter: validates, allocates and dispatches to
// kernels/jagged_unique_indices.h. FBGEMM has this op on CUDA only; this is its CPU kernel.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/jagged/kernels/cumsum.h"
#include "recops/jagged/kernels/jagged_unique_indices.h"
#include "recops/jagged/ops.h"

namespace recops::jagged {
namespace {

at::Tensor checked(const at::Tensor& t, const char* name, const at::Tensor& indices) {
  check_cpu(t, name);
  check_dim(t, 1, name);
  check_same_dtype(t, name, indices, "indices");
  return t.contiguous();
}

// Every entry of `t` in [lo, hi].
void check_entries_within(const at::Tensor& t, const char* name, int64_t lo, int64_t hi) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t v = index_at(t, i);
    TORCH_CHECK_VALUE(lo <= v && v <= hi, name, " entries must be in [", lo, ", ", hi, "], got ",
                      name, "[", i, "] = ", v);
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> jagged_unique_indices(
    const at::Tensor& hash_size_cumsum, const at::Tensor& hash_size_offsets,
    const at::Tensor& offsets, const at::Tensor& indices) {
  check_cpu(indices, "indices");
  check_dim(indices, 1, "indices");
  check_index_dtype(indices, "indices");
  const at::Tensor idx = indices.contiguous();
  const at::Tensor cumsum = checked(hash_size_cumsum, "hash_size_cumsum", idx);
  const at::Tensor groups = checked(hash_size_offsets, "hash_size_offsets", idx);
  const at::Tensor offs = checked(offsets, "offsets", idx);
  const int64_t num_features = cumsum.numel() - 1;
  TORCH_CHECK_VALUE(num_features >= 1,
                    "hash_size_cumsum must hold at least 2 entries (T + 1 for T >= 1 features), "
                    "got ",
                    cumsum.numel());
  TORCH_CHECK_VALUE(groups.numel() == num_features + 1,
                    "hash_size_offsets must hold T + 1 = ", num_features + 1, " entries, got ",
                    groups.numel());
  TORCH_CHECK_VALUE(offs.numel() >= 1, "offsets must hold at least one entry");
  const int64_t num_bags = offs.numel() - 1;
  TORCH_CHECK_VALUE(num_bags % num_features == 0,
                    "offsets must hold T * B + 1 entries for the T = ", num_features,
                    " features, got ", offs.numel());
  check_offsets_monotonic(cumsum, "hash_size_cumsum");
  check_offsets_monotonic(groups, "hash_size_offsets");
  check_entries_within(groups, "hash_size_offsets", 0, num_features);
  check_offsets_monotonic(offs, "offsets");
  TORCH_CHECK_VALUE(index_at(offs, 0) == 0 && index_at(offs, num_bags) == idx.numel(),
                    "offsets must run from 0 to indices.numel() = ", idx.numel(), ", got ",
                    index_at(offs, 0), " to ", index_at(offs, num_bags));

  const int64_t n = idx.numel();
  at::Tensor linear = at::empty({n}, idx.options().dtype(at::kLong));
  at::Tensor reverse_index = at::empty({n}, idx.options().dtype(at::kLong));
  at::Tensor output_lengths = at::zeros({num_bags}, offs.options());
  at::Tensor output_offsets = at::empty({num_bags + 1}, offs.options());
  at::Tensor unique_indices;
  dispatch_index_kind(index_kind(idx.scalar_type()), [&](auto tag) {
    using index_t = typename decltype(tag)::type;
    kernels::KeyedIndices<index_t> in;
    in.hash_size_cumsum = cumsum.const_data_ptr<index_t>();
    in.hash_size_offsets = groups.const_data_ptr<index_t>();
    in.offsets = offs.const_data_ptr<index_t>();
    in.indices = idx.const_data_ptr<index_t>();
    in.num_features = num_features;
    in.num_bags = num_bags;
    in.num_indices = n;
    const int64_t bad = kernels::linearize_indices(in, linear.mutable_data_ptr<int64_t>());
    TORCH_CHECK_INDEX(bad < 0, "indices[", bad, "] = ", bad < 0 ? 0 : index_at(idx, bad),
                      " is negative or not below its feature's hash size (hash_size_cumsum)");
    at::Tensor unique_linear = at::empty({n}, idx.options().dtype(at::kLong));
    const int64_t num_unique = kernels::rank_unique(linear.const_data_ptr<int64_t>(), n,
                                                    reverse_index.mutable_data_ptr<int64_t>(),
                                                    unique_linear.mutable_data_ptr<int64_t>());
    unique_indices = at::empty({num_unique}, idx.options());
    kernels::first_index_of_each_rank(in.indices, reverse_index.const_data_ptr<int64_t>(), n,
                                      unique_indices.mutable_data_ptr<index_t>());
    kernels::unique_lengths(in, unique_linear.const_data_ptr<int64_t>(), num_unique,
                            output_lengths.mutable_data_ptr<index_t>());
    kernels::complete_cumsum_rows<int64_t>(output_lengths.const_data_ptr<index_t>(),
                                           output_offsets.mutable_data_ptr<index_t>(), 1, num_bags);
  });
  return {output_lengths, output_offsets, unique_indices, reverse_index};
}

}  // namespace recops::jagged

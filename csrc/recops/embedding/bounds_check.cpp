#include <limits>
#include <string>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/common/narrow.h"
#include "recops/embedding/batch.h"
#include "recops/embedding/kernels/bounds_check.h"
#include "recops/embedding/ops.h"

namespace recops::embedding {

void bounds_check_indices(const at::Tensor& rows_per_table, const at::Tensor& indices,
                          const at::Tensor& offsets, int64_t bounds_check_mode,
                          const at::Tensor& warning,
                          const std::optional<at::Tensor>& batch_size_per_feature_per_rank) {
  TORCH_CHECK(bounds_check_mode >= 0 && bounds_check_mode <= 3, "bounds_check_mode must be 0 ",
              "(FATAL), 1 (WARNING), 2 (IGNORE) or 3 (NONE), got ", bounds_check_mode);
  if (bounds_check_mode == 3) return;
  for (const auto& [t, name] : {std::pair{&rows_per_table, "rows_per_table"},
                                {&indices, "indices"},
                                {&offsets, "offsets"},
                                {&warning, "warning"}}) {
    check_cpu(*t, name);
    check_dim(*t, 1, name);
  }
  TORCH_CHECK(rows_per_table.scalar_type() == at::kLong, "rows_per_table must be int64, got ",
              rows_per_table.scalar_type());
  TORCH_CHECK(warning.scalar_type() == at::kLong && warning.numel() == 1,
              "warning must be an int64 counter of one element");
  check_index_dtype(indices, "indices");
  check_same_dtype(indices, "indices", offsets, "offsets");
  const int64_t T = rows_per_table.numel();
  TORCH_CHECK(T >= 1 && offsets.numel() >= 1, "offsets must have T * B + 1 entries for T = ", T,
              " features, got ", offsets.numel());
  const at::Tensor bag_offsets =
      feature_bag_offsets(T, offsets.numel() - 1, batch_size_per_feature_per_rank);
  TORCH_CHECK(indices.is_contiguous() && offsets.is_contiguous(),
              "indices and offsets must be contiguous: bad entries are repaired in place");
  const at::Tensor rows = rows_per_table.contiguous();
  const int64_t num_indices = indices.numel();
  TORCH_CHECK_VALUE(
      indices.scalar_type() == at::kLong || num_indices <= std::numeric_limits<int32_t>::max(),
      "int32 offsets cannot address ", num_indices, " indices; use int64");
  // FBGEMM's rule: the last bag ends at the last index. FATAL raises otherwise; a repair moves the
  // last offset there (the kernel does, before the bags are checked, as FBGEMM does).
  const bool fatal = bounds_check_mode == 0;
  const int64_t last = index_at(offsets, offsets.numel() - 1);
  TORCH_CHECK_VALUE(!fatal || last == num_indices, "offsets are malformed: offsets[-1] = ", last,
                    " must equal the number of indices, ", num_indices,
                    " (BoundsCheckMode.FATAL; WARNING and IGNORE set it so, like FBGEMM)");
  const int64_t* first_bag = bag_offsets.const_data_ptr<int64_t>();
  const kernels::BoundsReport report =
      dispatch_index_kind(index_kind(indices.scalar_type()), [&](auto tag) {
        using index_t = typename decltype(tag)::type;
        return kernels::check_bounds(rows.const_data_ptr<int64_t>(), T, first_bag,
                                     indices.mutable_data_ptr<index_t>(),
                                     offsets.mutable_data_ptr<index_t>(), num_indices, !fatal);
      });
  if (fatal) {
    const int64_t k = report.first_bad_bag;
    int64_t t = 0;  // the feature of bag k
    while (report.bad_bags > 0 && first_bag[t + 1] <= k) ++t;
    TORCH_CHECK_VALUE(report.bad_bags == 0, "offsets of bag ", k - first_bag[t], " of feature ", t,
                      " are malformed: offsets[", k, "] = ", index_at(offsets, k), ", offsets[",
                      k + 1, "] = ", index_at(offsets, k + 1),
                      " must satisfy 0 <= start <= end <= ", num_indices, " (number of indices)");
    const int64_t p = report.first_bad_index;
    TORCH_CHECK_INDEX(report.bad_indices == 0, "indices[", p, "] = ", index_at(indices, p),
                      " is out of range: ", report.bad_indices,
                      " indices are negative or not below their table's rows");
    return;
  }
  if (last != num_indices || report.bad_bags > 0 || report.bad_indices > 0) {
    int64_t& repaired_batches = warning.mutable_data_ptr<int64_t>()[0];
    // WARNING warns at the first repair its counter sees (the module's counter: once per module),
    // here rather than in Python, which would have to read the counter back every step.
    if (bounds_check_mode == 1 && repaired_batches == 0) {
      TORCH_WARN(
          "SplitTableBatchedEmbeddingBagsCodegen: out-of-range indices were set to 0 and "
          "malformed offsets clamped into range (BoundsCheckMode.WARNING warns once; "
          "bounds_check_warning counts the repaired batches)");
    }
    repaired_batches += 1;
  }
}

at::Tensor index_to_int32(const at::Tensor& t, c10::string_view name) {
  check_cpu(t, "t");
  return checked_int32(t, std::string(name).c_str());
}

}  // namespace recops::embedding

#include <limits>
#include <string>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/common/narrow.h"
#include "recops/embedding/batch.h"
#include "recops/embedding/kernels/bounds_check.h"
#include "recops/embedding/ops.h"

namespace recops::embedding {

namespace {

// Feature t's bags [first[t], first[t + 1]): B_offsets (FBGEMM's variable batch size, a running
// sum from 0 over at most the bags of offsets; bags past its end are not checked, as in FBGEMM),
// or T equal batches.
at::Tensor checked_bag_offsets(int64_t T, int64_t num_bags,
                               const std::optional<at::Tensor>& B_offsets, int64_t max_B) {
  if (!B_offsets.has_value()) return feature_bag_offsets(T, num_bags, std::nullopt);
  const at::Tensor& given = *B_offsets;
  check_cpu(given, "B_offsets");
  TORCH_CHECK(given.dim() == 1 && given.numel() == T + 1 &&
                  (given.scalar_type() == at::kInt || given.scalar_type() == at::kLong),
              "B_offsets must be int32 or int64 [T + 1] for T = ", T, " features, got ",
              given.scalar_type(), " ", given.sizes());
  TORCH_CHECK_VALUE(max_B >= 0, "max_B must be >= 0 with B_offsets, got ", max_B);
  at::Tensor first = given.to(at::kLong).contiguous();
  const int64_t* b = first.const_data_ptr<int64_t>();
  TORCH_CHECK_VALUE(b[0] == 0, "B_offsets[0] must be 0, got ", b[0]);
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK_VALUE(b[t] <= b[t + 1] && b[t + 1] <= num_bags,
                      "B_offsets must be non-decreasing and its batch sizes add up to at most the ",
                      num_bags, " bags of offsets: B_offsets[", t + 1, "] = ", b[t + 1], " after ",
                      b[t]);
  }
  return first;
}

}  // namespace

void bounds_check_indices(const at::Tensor& rows_per_table, const at::Tensor& indices,
                          const at::Tensor& offsets, int64_t bounds_check_mode,
                          const at::Tensor& warning, const std::optional<at::Tensor>& weights,
                          const std::optional<at::Tensor>& B_offsets, int64_t max_B,
                          const std::optional<at::Tensor>& /*b_t_map*/, int64_t /*info_B_num_bits*/,
                          int64_t /*info_B_mask*/, int64_t /*bounds_check_version*/,
                          bool /*prefetch_pipeline*/) {
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
  check_index_dtype(offsets, "offsets");
  const int64_t num_indices = indices.numel();
  if (weights.has_value() && weights->numel() != 0) {  // FBGEMM checks only their number
    TORCH_CHECK(weights->dim() >= 1 && weights->size(0) == num_indices,
                "weights must have one entry per index (", num_indices, "), got shape ",
                weights->sizes());
  }
  const int64_t T = rows_per_table.numel();
  TORCH_CHECK(T >= 1 && offsets.numel() >= 1, "offsets must have T * B + 1 entries for T = ", T,
              " features, got ", offsets.numel());
  const int64_t num_bags = offsets.numel() - 1;
  const at::Tensor bag_offsets = checked_bag_offsets(T, num_bags, B_offsets, max_B);
  TORCH_CHECK_VALUE(
      indices.scalar_type() == at::kLong || num_indices <= std::numeric_limits<int32_t>::max(),
      "int32 indices cannot number ", num_indices, " entries; use int64");
  // Non-contiguous indices and offsets are checked in contiguous copies whose repairs are copied
  // back (FBGEMM repairs strided views in place). FBGEMM checks offsets of another dtype than the
  // indices' in a converted copy (its repairs do not reach the caller's offsets); the narrowing
  // is checked.
  const at::Tensor dense_indices = indices.contiguous();
  const at::Tensor checked_offsets =
      offsets.scalar_type() == indices.scalar_type() ? offsets.contiguous()
      : indices.scalar_type() == at::kLong           ? offsets.to(at::kLong).contiguous()
                                           : checked_int32(offsets, "offsets").contiguous();
  const bool offsets_copied =
      offsets.scalar_type() == indices.scalar_type() && !checked_offsets.is_same(offsets);
  const at::Tensor rows = rows_per_table.contiguous();
  // FBGEMM's rule: the last bag ends at the last index. FATAL raises otherwise; a repair moves the
  // last offset there (the kernel does, before the bags are checked, as FBGEMM does).
  const bool fatal = bounds_check_mode == 0;
  const int64_t last = index_at(checked_offsets, num_bags);
  TORCH_CHECK_VALUE(!fatal || last == num_indices, "offsets are malformed: offsets[-1] = ", last,
                    " must equal the number of indices, ", num_indices,
                    " (BoundsCheckMode.FATAL; WARNING and IGNORE set it so, like FBGEMM)");
  const int64_t* first_bag = bag_offsets.const_data_ptr<int64_t>();
  const kernels::BoundsReport report =
      dispatch_index_kind(index_kind(indices.scalar_type()), [&](auto tag) {
        using index_t = typename decltype(tag)::type;
        return kernels::check_bounds(rows.const_data_ptr<int64_t>(), T, first_bag, num_bags,
                                     dense_indices.mutable_data_ptr<index_t>(),
                                     checked_offsets.mutable_data_ptr<index_t>(), num_indices,
                                     !fatal);
      });
  if (!dense_indices.is_same(indices)) indices.copy_(dense_indices);
  if (offsets_copied) offsets.copy_(checked_offsets);
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
                      " indices are negative (other than -1, a pruned row) or not below their "
                      "table's rows");
    return;
  }
  // FBGEMM's counter, kept by WARNING only: this batch's repairs.
  if (bounds_check_mode != 1) return;
  const int64_t repairs = (last != num_indices) + report.bad_bags + report.bad_indices;
  warning.mutable_data_ptr<int64_t>()[0] = repairs;
  if (repairs > 0) {
    TORCH_WARN(
        "bounds_check_indices: out-of-range indices were set to 0 and malformed offsets clamped "
        "into range (BoundsCheckMode.WARNING; the warning tensor counts this batch's repairs)");
  }
}

at::Tensor index_to_int32(const at::Tensor& t, c10::string_view name) {
  check_cpu(t, "t");
  return checked_int32(t, std::string(name).c_str());
}

}  // namespace recops::embedding

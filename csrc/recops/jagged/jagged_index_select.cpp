// Adapters of jagged_index_select_2d_forward(_v2) and jagged_index_add_2d_forward(_v2) (FBGEMM's
// 2-D forward of jagged_index_select and its gradient): validate, allocate, dispatch to
// kernels/jagged_index_select.h. Offsets are inclusive (lengths.cumsum(0), no leading 0).
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/jagged/kernels/jagged_index_select.h"
#include "recops/jagged/ops.h"

namespace recops::jagged {
namespace {

// Inclusive offsets as a contiguous int64 tensor (FBGEMM reads them as int64; int32 widens).
at::Tensor checked_ends(const at::Tensor& ends, const char* name) {
  check_cpu(ends, name);
  check_dim(ends, 1, name);
  check_index_dtype(ends, name);
  return ends.to(at::kLong).contiguous();
}

// The checked indices, contiguous, with at least one entry per segment of `ends_name`.
at::Tensor checked_indices(const at::Tensor& indices, int64_t num_segments, const char* ends_name) {
  check_cpu(indices, "indices");
  check_dim(indices, 1, "indices");
  check_index_dtype(indices, "indices");
  TORCH_CHECK_VALUE(indices.numel() >= num_segments, "indices must hold one entry per segment of ",
                    ends_name, " (", num_segments, "), got ", indices.numel());
  return indices.contiguous();
}

// The last inclusive offset: the rows the segments cover (0 without segments).
int64_t covered_rows(const at::Tensor& ends) {
  return ends.numel() == 0 ? 0 : ends.const_data_ptr<int64_t>()[ends.numel() - 1];
}

// values as 2-D rows whose elements are contiguous (a copy when they are not).
at::Tensor checked_values(const at::Tensor& values) {
  check_cpu(values, "values");
  TORCH_CHECK(values.dim() == 2, "values must be 2-D [rows, columns], got shape ", values.sizes());
  return with_unit_columns(values);
}

void check_segment(int64_t bad, const at::Tensor& indices, int64_t num_targets,
                   const char* ends_name, const char* rows_name, int64_t rows) {
  if (bad < 0) return;
  const int64_t index = index_at(indices, bad);
  TORCH_CHECK_INDEX(index >= 0 && index < num_targets, "indices[", bad, "] = ", index,
                    " is outside [0, ", num_targets, "), the segments of ", ends_name);
  TORCH_CHECK_INDEX(false, "segment ", bad, " (indices[", bad, "] = ", index,
                    ") would reach rows outside the ", rows, " rows of ", rows_name,
                    "; check the offsets");
}

}  // namespace

at::Tensor jagged_index_select_2d_forward(const at::Tensor& values, const at::Tensor& indices,
                                          const at::Tensor& input_offsets,
                                          const at::Tensor& output_offsets,
                                          int64_t num_dense_output_rows) {
  const at::Tensor src = checked_values(values);
  const at::Tensor in_ends = checked_ends(input_offsets, "input_offsets");
  const at::Tensor out_ends = checked_ends(output_offsets, "output_offsets");
  const at::Tensor idx = checked_indices(indices, out_ends.numel(), "output_offsets");
  TORCH_CHECK_VALUE(num_dense_output_rows >= 0, "num_dense_output_rows must be >= 0, got ",
                    num_dense_output_rows);
  check_offsets_monotonic(out_ends, "output_offsets");
  TORCH_CHECK_VALUE(num_dense_output_rows <= covered_rows(out_ends),
                    "num_dense_output_rows = ", num_dense_output_rows,
                    " exceeds the rows output_offsets covers, ", covered_rows(out_ends));
  const int64_t bad_selection = dispatch_index_kind(index_kind(idx.scalar_type()), [&](auto tag) {
    using index_t = typename decltype(tag)::type;
    return kernels::first_bad_selection(
        idx.const_data_ptr<index_t>(), in_ends.const_data_ptr<int64_t>(), in_ends.numel(),
        out_ends.const_data_ptr<int64_t>(), out_ends.numel(), num_dense_output_rows, src.size(0));
  });
  check_segment(bad_selection, idx, in_ends.numel(), "input_offsets", "values", src.size(0));
  at::Tensor out = at::empty({num_dense_output_rows, src.size(1)}, src.options());
  if (num_dense_output_rows == 0) return out;
  kernels::ByteRows rows;
  rows.data = static_cast<const char*>(src.const_data_ptr());
  rows.rows = src.size(0);
  rows.row_stride = src.stride(0) * src.element_size();
  rows.row_bytes = src.size(1) * src.element_size();
  const int64_t bad = dispatch_index_kind(index_kind(idx.scalar_type()), [&](auto tag) {
    using index_t = typename decltype(tag)::type;
    return kernels::jagged_index_select_rows(
        rows, idx.const_data_ptr<index_t>(), in_ends.const_data_ptr<int64_t>(), in_ends.numel(),
        out_ends.const_data_ptr<int64_t>(), out_ends.numel(),
        static_cast<char*>(out.mutable_data_ptr()), num_dense_output_rows);
  });
  check_segment(bad, idx, in_ends.numel(), "input_offsets", "values", src.size(0));
  return out;
}

at::Tensor jagged_index_select_2d_forward_v2(const at::Tensor& values, const at::Tensor& indices,
                                             const at::Tensor& input_offsets,
                                             const at::Tensor& output_offsets,
                                             std::optional<int64_t> num_dense_output_rows) {
  if (!num_dense_output_rows.has_value()) {
    const at::Tensor out_ends = checked_ends(output_offsets, "output_offsets");
    num_dense_output_rows = covered_rows(out_ends);
  }
  return jagged_index_select_2d_forward(values, indices, input_offsets, output_offsets,
                                        *num_dense_output_rows);
}

at::Tensor jagged_index_add_2d_forward(const at::Tensor& values, const at::Tensor& indices,
                                       const at::Tensor& input_offsets,
                                       const at::Tensor& output_offsets,
                                       int64_t /*num_dense_input_rows*/, int64_t num_output_rows) {
  // num_dense_input_rows is not read, as in FBGEMM: every row of values is added.
  const at::Tensor src = checked_values(values);
  TORCH_CHECK(at::isFloatingType(src.scalar_type()) || src.scalar_type() == at::kInt ||
                  src.scalar_type() == at::kLong,
              "values must be float32, float64, float16, bfloat16, int32 or int64, got ",
              src.scalar_type());
  const at::Tensor in_ends = checked_ends(input_offsets, "input_offsets");
  const at::Tensor out_ends = checked_ends(output_offsets, "output_offsets");
  const at::Tensor idx = checked_indices(indices, in_ends.numel(), "input_offsets");
  TORCH_CHECK_VALUE(num_output_rows >= 0, "num_output_rows must be >= 0, got ", num_output_rows);
  check_offsets_monotonic(in_ends, "input_offsets");
  TORCH_CHECK_VALUE(src.size(0) <= covered_rows(in_ends), "values has ", src.size(0),
                    " rows but input_offsets covers ", covered_rows(in_ends));
  at::Tensor out = at::zeros({num_output_rows, src.size(1)}, src.options());
  int64_t bad = -1;
  const auto add = [&](auto value_tag) {
    using value_t = typename decltype(value_tag)::type;
    kernels::ValueRows<value_t> rows;
    rows.data = data_as<value_t>(src);
    rows.rows = src.size(0);
    rows.row_stride = src.stride(0);
    rows.cols = src.size(1);
    dispatch_index_kind(index_kind(idx.scalar_type()), [&](auto index_tag) {
      using index_t = typename decltype(index_tag)::type;
      bad = kernels::jagged_index_add_rows(rows, idx.const_data_ptr<index_t>(),
                                           in_ends.const_data_ptr<int64_t>(), in_ends.numel(),
                                           out_ends.const_data_ptr<int64_t>(), out_ends.numel(),
                                           mutable_data_as<value_t>(out), num_output_rows);
    });
  };
  if (src.scalar_type() == at::kInt || src.scalar_type() == at::kLong) {
    dispatch_index_kind(index_kind(src.scalar_type()), add);
  } else {
    dispatch_float_kind(float_kind(src.scalar_type(), "values"), add);
  }
  check_segment(bad, idx, out_ends.numel(), "output_offsets", "the output", num_output_rows);
  return out;
}

at::Tensor jagged_index_add_2d_forward_v2(const at::Tensor& values, const at::Tensor& indices,
                                          const at::Tensor& input_offsets,
                                          const at::Tensor& output_offsets, int64_t num_output_rows,
                                          int64_t num_dense_input_rows) {
  return jagged_index_add_2d_forward(values, indices, input_offsets, output_offsets,
                                     num_dense_input_rows, num_output_rows);
}

}  // namespace recops::jagged

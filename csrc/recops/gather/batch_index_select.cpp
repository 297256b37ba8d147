// batch_index_select_dim0 (and its _tensor form) and the backward
// (docs/gather_and_relative_bias.md): `inputs` packs tables of input_rows[i] x input_columns[i]
// elements back to back, `indices` packs input_num_indices[i] row indices per table; the output
// packs the selected rows table by table
// ([num_indices_i, columns_i] each), or with permute_output_dim_0_1 row by row ([B, sum of
// columns], every table selecting B rows).
#include <ATen/ops/empty.h>

#include <string>
#include <vector>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/gather/kernels/index_select_rows.h"
#include "recops/gather/ops.h"

namespace recops::gather {
namespace {

// The per-table sizes, validated, and where each table's data, indices and outputs start.
struct BatchLayout {
  int64_t tables = 0;
  std::vector<int64_t> num_indices, rows, columns;
  std::vector<int64_t> input_offset, index_offset, output_offset;  // elements
  int64_t input_numel = 0, index_numel = 0, output_numel = 0, total_columns = 0;
  bool permute = false;
};

std::vector<int64_t> int64_list(const at::Tensor& t, const char* name) {
  check_cpu(t, name);
  check_dim(t, 1, name);
  TORCH_CHECK(t.scalar_type() == at::kLong, name, " must be int64, got ", t.scalar_type());
  const at::Tensor c = t.contiguous();
  const int64_t* p = c.const_data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

void check_same_length(const std::vector<int64_t>& a, const char* a_name,
                       const std::vector<int64_t>& b, const char* b_name) {
  TORCH_CHECK(a.size() == b.size(), b_name, " must have the same length as ", a_name, " (",
              a.size(), "), got ", b.size());
}

// a * b for non-negative a, b, raising when it overflows int64.
int64_t checked_product(int64_t a, int64_t b, const char* what) {
  int64_t product = 0;
  TORCH_CHECK_VALUE(!__builtin_mul_overflow(a, b, &product), what, " overflows int64");
  return product;
}

int64_t checked_sum(int64_t a, int64_t b, const char* what) {
  int64_t sum = 0;
  TORCH_CHECK_VALUE(!__builtin_add_overflow(a, b, &sum), what, " overflows int64");
  return sum;
}

// Every entry of `values` must be > 0 (`strict`) or >= 0.
void check_sizes(const std::vector<int64_t>& values, const char* name, bool strict) {
  for (size_t i = 0; i < values.size(); ++i) {
    TORCH_CHECK_VALUE(strict ? values[i] > 0 : values[i] >= 0, name, " entries must be ",
                      strict ? "> 0" : ">= 0", ", got ", name, "[", i, "] = ", values[i]);
  }
}

BatchLayout layout_of(std::vector<int64_t> num_indices, std::vector<int64_t> rows,
                      std::vector<int64_t> columns, bool permute, bool strict) {
  BatchLayout l;
  l.tables = static_cast<int64_t>(num_indices.size());
  l.permute = permute;
  check_sizes(rows, "input_rows", strict);
  check_sizes(columns, "input_columns", strict);
  if (permute) {
    TORCH_CHECK_VALUE(l.tables > 0, "input_num_indices must not be empty");
    check_sizes({num_indices[0]}, "input_num_indices", strict);
    for (int64_t i = 1; i < l.tables; ++i) {
      TORCH_CHECK_VALUE(num_indices[i] == num_indices[0],
                        "input_num_indices entries must all be equal with permute_output_dim_0_1",
                        ", got input_num_indices[0] = ", num_indices[0], " and input_num_indices[",
                        i, "] = ", num_indices[i]);
    }
  } else {
    check_sizes(num_indices, "input_num_indices", strict);
  }
  for (int64_t i = 0; i < l.tables; ++i) {
    l.input_offset.push_back(l.input_numel);
    l.index_offset.push_back(l.index_numel);
    l.output_offset.push_back(permute ? l.total_columns : l.output_numel);
    l.input_numel = checked_sum(l.input_numel,
                                checked_product(rows[i], columns[i], "input_rows * input_columns"),
                                "input_rows * input_columns summed");
    l.index_numel = checked_sum(l.index_numel, num_indices[i], "input_num_indices summed");
    l.output_numel = checked_sum(
        l.output_numel,
        checked_product(num_indices[i], columns[i], "input_num_indices * input_columns"),
        "input_num_indices * input_columns summed");
    l.total_columns = checked_sum(l.total_columns, columns[i], "input_columns summed");
  }
  l.num_indices = std::move(num_indices);
  l.rows = std::move(rows);
  l.columns = std::move(columns);
  return l;
}

void check_indices(const at::Tensor& indices, const BatchLayout& l) {
  check_cpu(indices, "indices");
  check_dim(indices, 1, "indices");
  check_index_dtype(indices, "indices");
  TORCH_CHECK(indices.numel() == l.index_numel,
              "indices must hold sum(input_num_indices) = ", l.index_numel, " entries, got ",
              indices.numel());
}

// Names the table and position of a bad index reported by a kernel.
void check_kernel_result(int64_t table, int64_t position, const at::Tensor& indices,
                         const BatchLayout& l) {
  TORCH_CHECK_INDEX(table < 0, "indices of table ", table, " must be in [0, ",
                    table < 0 ? 0 : l.rows[table], ") (input_rows[", table, "]), got indices[",
                    table < 0 ? 0 : l.index_offset[table] + position,
                    "] = ", table < 0 ? 0 : index_at(indices, l.index_offset[table] + position));
}

at::Tensor select(const at::Tensor& inputs, const at::Tensor& indices, BatchLayout l) {
  check_cpu(inputs, "inputs");
  // FBGEMM splits inputs along dim 0 and views each piece as [rows, columns]: [N] or [N, 1, ...].
  TORCH_CHECK(inputs.dim() >= 1 && inputs.numel() == inputs.size(0),
              "inputs must be 1-D, or [N, 1, ...] (one element per row of dim 0), got shape ",
              inputs.sizes());
  TORCH_CHECK(inputs.numel() == l.input_numel,
              "inputs must hold sum(input_rows * input_columns) = ", l.input_numel,
              " elements, got ", inputs.numel());
  check_indices(indices, l);
  const at::Tensor inputs_c = inputs.contiguous();
  const at::Tensor indices_c = indices.contiguous();
  at::Tensor out = at::empty({l.output_numel}, inputs_c.options());
  const int64_t element = inputs_c.element_size();
  const auto* src = static_cast<const char*>(inputs_c.const_data_ptr());
  auto* dst = static_cast<char*>(out.mutable_data_ptr());
  const auto* index = static_cast<const char*>(indices_c.const_data_ptr());
  const bool is_int64 = indices_c.scalar_type() == at::kLong;
  std::vector<kernels::RowGather> groups(l.tables);
  for (int64_t i = 0; i < l.tables; ++i) {
    const int64_t row_bytes = l.columns[i] * element;
    groups[i] = {src + l.input_offset[i] * element,
                 l.rows[i],
                 row_bytes,
                 {index + l.index_offset[i] * indices_c.element_size(), is_int64},
                 l.num_indices[i],
                 dst + l.output_offset[i] * element,
                 l.permute ? l.total_columns * element : row_bytes};
  }
  const kernels::BadIndex bad = kernels::gather_row_groups(groups.data(), l.tables);
  check_kernel_result(bad.group, bad.position, indices_c, l);
  return out;
}

at::Tensor select_backward(const at::Tensor& grad_output, const at::Tensor& indices,
                           const BatchLayout& l) {
  check_cpu(grad_output, "grad_output");
  check_dim(grad_output, 1, "grad_output");
  TORCH_CHECK(grad_output.numel() == l.output_numel, "grad_output must hold ", l.output_numel,
              " elements (the forward output's), got ", grad_output.numel());
  check_indices(indices, l);
  const FloatKind kind = float_kind(grad_output.scalar_type(), "grad_output");
  const at::Tensor grad_c = grad_output.contiguous();
  const at::Tensor indices_c = indices.contiguous();
  at::Tensor out = at::empty({l.input_numel}, grad_c.options());
  const auto* index = static_cast<const char*>(indices_c.const_data_ptr());
  const bool is_int64 = indices_c.scalar_type() == at::kLong;
  for (int64_t i = 0; i < l.tables; ++i) {
    const kernels::RowIndex row_index{index + l.index_offset[i] * indices_c.element_size(),
                                      is_int64};
    const int64_t bad = dispatch_float_kind(kind, [&](auto scalar_tag) {
      using scalar_t = typename decltype(scalar_tag)::type;
      return kernels::scatter_add_rows<accumulate_t<scalar_t>>(
          data_as<scalar_t>(grad_c) + l.output_offset[i],
          l.permute ? l.total_columns : l.columns[i], row_index, l.num_indices[i], l.rows[i],
          l.columns[i], mutable_data_as<scalar_t>(out) + l.input_offset[i]);
    });
    check_kernel_result(bad < 0 ? -1 : i, bad, indices_c, l);
  }
  return out;
}

}  // namespace

at::Tensor batch_index_select_dim0(const at::Tensor& inputs, const at::Tensor& indices,
                                   at::IntArrayRef input_num_indices, at::IntArrayRef input_rows,
                                   at::IntArrayRef input_columns, bool permute_output_dim_0_1) {
  TORCH_CHECK(input_rows.size() == input_num_indices.size(),
              "input_rows must have the same length as input_num_indices (",
              input_num_indices.size(), "), got ", input_rows.size());
  TORCH_CHECK(input_columns.size() == input_num_indices.size(),
              "input_columns must have the same length as input_num_indices (",
              input_num_indices.size(), "), got ", input_columns.size());
  check_cpu(inputs, "inputs");
  if (inputs.numel() == 0) return at::empty({0}, inputs.options());
  return select(inputs, indices,
                layout_of(input_num_indices.vec(), input_rows.vec(), input_columns.vec(),
                          permute_output_dim_0_1, /*strict=*/true));
}

at::Tensor batch_index_select_dim0_tensor(const at::Tensor& inputs, const at::Tensor& indices,
                                          const at::Tensor& input_num_indices,
                                          const at::Tensor& input_rows,
                                          const at::Tensor& input_columns,
                                          bool permute_output_dim_0_1) {
  std::vector<int64_t> num = int64_list(input_num_indices, "input_num_indices");
  std::vector<int64_t> rows = int64_list(input_rows, "input_rows");
  std::vector<int64_t> columns = int64_list(input_columns, "input_columns");
  check_same_length(num, "input_num_indices", rows, "input_rows");
  check_same_length(num, "input_num_indices", columns, "input_columns");
  check_cpu(inputs, "inputs");
  if (inputs.numel() == 0) return at::empty({0}, inputs.options());
  return select(inputs, indices,
                layout_of(std::move(num), std::move(rows), std::move(columns),
                          permute_output_dim_0_1, /*strict=*/true));
}

at::Tensor batch_index_select_dim0_backward(
    const at::Tensor& grad_output, const at::Tensor& indices, at::IntArrayRef input_num_indices,
    at::IntArrayRef input_rows, at::IntArrayRef input_columns, bool permute_output_dim_0_1) {
  TORCH_CHECK(input_rows.size() == input_num_indices.size() &&
                  input_columns.size() == input_num_indices.size(),
              "input_rows and input_columns must have the same length as input_num_indices (",
              input_num_indices.size(), "), got ", input_rows.size(), " and ",
              input_columns.size());
  return select_backward(grad_output, indices,
                         layout_of(input_num_indices.vec(), input_rows.vec(), input_columns.vec(),
                                   permute_output_dim_0_1,
                                   /*strict=*/false));
}

at::Tensor batch_index_select_dim0_backward_cpu_impl(
    const at::Tensor& grad_output, const at::Tensor& indices, const at::Tensor& indices_numels,
    const at::Tensor& input_num_indices, const at::Tensor& input_rows,
    const at::Tensor& input_columns, bool permute_output_dim_0_1, const at::Tensor& saved_tensor) {
  check_cpu(saved_tensor, "saved_tensor");
  TORCH_CHECK(saved_tensor.scalar_type() == at::kLong && saved_tensor.numel() >= 1,
              "saved_tensor must be an int64 tensor holding the forward input's numel, got ",
              saved_tensor.scalar_type(), " of shape ", saved_tensor.sizes());
  const int64_t saved_numel = saved_tensor.contiguous().const_data_ptr<int64_t>()[0];
  if (saved_numel == 0) {
    return at::empty({0}, grad_output.options());
  }
  std::vector<int64_t> num = int64_list(input_num_indices, "input_num_indices");
  std::vector<int64_t> rows = int64_list(input_rows, "input_rows");
  std::vector<int64_t> columns = int64_list(input_columns, "input_columns");
  const std::vector<int64_t> numels = int64_list(indices_numels, "indices_numels");
  check_same_length(num, "input_num_indices", rows, "input_rows");
  check_same_length(num, "input_num_indices", columns, "input_columns");
  TORCH_CHECK(numels == num, "indices_numels must equal input_num_indices (each table's ",
              "gradient rows take its indices), got ", indices_numels, " and ", input_num_indices);
  const BatchLayout layout = layout_of(std::move(num), std::move(rows), std::move(columns),
                                       permute_output_dim_0_1, /*strict=*/false);
  TORCH_CHECK_VALUE(saved_numel == layout.input_numel,
                    "saved_tensor[0] (the forward input's numel) must equal sum(input_rows * ",
                    "input_columns) = ", layout.input_numel, ", got ", saved_numel);
  return select_backward(grad_output, indices, layout);
}

}  // namespace recops::gather

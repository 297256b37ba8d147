#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros.h>

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/common/memory.h"
#include "recops/jagged/kernels/jagged_dense.h"
#include "recops/jagged/ops.h"

namespace recops::jagged {
namespace {

using kernels::JaggedLayout;
using kernels::kMaxJaggedDims;

// Offsets of all jagged levels, validated: contiguous, one index dtype, monotonic, and each level
// sized by the previous level's last offset.
struct CheckedOffsets {
  std::vector<at::Tensor> levels;
  int64_t batch = 0;
  int64_t first_row = 0;  // offsets[K-1][0]
  int64_t num_rows = 0;   // offsets[K-1][-1]: values rows the offsets address
};

CheckedOffsets check_offsets(at::TensorList offsets, const char* name) {
  const int64_t num_levels = static_cast<int64_t>(offsets.size());
  TORCH_CHECK(num_levels >= 1 && num_levels <= kMaxJaggedDims, name, " must hold 1 to ",
              kMaxJaggedDims, " tensors (one per jagged dim), got ", num_levels);
  CheckedOffsets checked;
  int64_t previous_last = -1;
  for (int64_t d = 0; d < num_levels; ++d) {
    const std::string level = std::string(name) + "[" + std::to_string(d) + "]";
    const at::Tensor& t = offsets[d];
    check_cpu(t, level.c_str());
    check_dim(t, 1, level.c_str());
    check_index_dtype(t, level.c_str());
    check_same_dtype(t, level.c_str(), offsets[0], (std::string(name) + "[0]").c_str());
    TORCH_CHECK(t.numel() >= 1, level, " must have at least one entry, got none");
    if (d > 0) {
      TORCH_CHECK(t.numel() == previous_last + 1, level, " must have ", name, "[", d - 1,
                  "][-1] + 1 = ", previous_last + 1, " entries, got ", t.numel());
    }
    at::Tensor contiguous = t.contiguous();
    check_offsets_monotonic(contiguous, level.c_str());
    previous_last = index_at(contiguous, contiguous.numel() - 1);
    checked.levels.push_back(std::move(contiguous));
  }
  checked.batch = checked.levels[0].numel() - 1;
  checked.first_row = index_at(checked.levels.back(), 0);
  checked.num_rows = previous_last;
  return checked;
}

template <typename index_t>
JaggedLayout<index_t> make_layout(const CheckedOffsets& offsets, at::IntArrayRef max_lengths,
                                  int64_t inner) {
  JaggedLayout<index_t> layout;
  layout.num_jagged_dims = static_cast<int>(offsets.levels.size());
  for (int d = 0; d < layout.num_jagged_dims; ++d) {
    layout.offsets[d] = offsets.levels[d].const_data_ptr<index_t>();
    layout.max_lengths[d] = max_lengths[d];
  }
  layout.batch = offsets.batch;
  layout.inner = inner;
  return layout;
}

// padding_value in the values' dtype as raw bits, converted as a fill converts it (checked for
// float, double, integers and bool, so it raises where a fill would; through float, unchecked, for
// half and bfloat16). An integer padding (jagged_1d_to_dense's) stays an integer, so int64 values
// get it exactly, never rounded through double. The usual dtypes skip the scalar tensor, whose
// allocation and fill cost as much as a small op's kernel.
template <typename elem_t>
elem_t padding_bits(const c10::Scalar& padding_value, const at::TensorOptions& options) {
  elem_t bits{};
  const at::ScalarType dtype = options.dtype().toScalarType();
  switch (dtype) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kLong:
    case at::kInt:
    case at::kShort:
    case at::kChar:
    case at::kByte:
    case at::kBool:
      AT_DISPATCH_ALL_TYPES_AND3(at::kHalf, at::kBFloat16, at::kBool, dtype, "padding", [&] {
        if constexpr (sizeof(scalar_t) == sizeof(elem_t)) {
          scalar_t value;
          if constexpr (std::is_same_v<scalar_t, at::Half> ||
                        std::is_same_v<scalar_t, at::BFloat16>) {
            value = static_cast<scalar_t>(static_cast<float>(padding_value.toDouble()));
          } else {
            if constexpr (!std::is_same_v<scalar_t, bool>) {
              // c10::overflows lets a negative value wrap into an unsigned type (-1 -> 255):
              // a narrowing that changes the value, so negatives are refused there.
              const bool negative_to_unsigned =
                  std::is_unsigned_v<scalar_t> && padding_value.toDouble() < 0;
              const bool overflows = negative_to_unsigned ||
                                     (padding_value.isIntegral(/*includeBool=*/false)
                                          ? c10::overflows<scalar_t>(padding_value.toLong())
                                          : c10::overflows<scalar_t>(padding_value.toDouble()));
              TORCH_CHECK_VALUE(!overflows, "padding_value = ", padding_value,
                                " cannot be represented in the values' dtype ", dtype);
            }
            value = padding_value.to<scalar_t>();
          }
          std::memcpy(&bits, &value, sizeof(elem_t));
        }
      });
      return bits;
    default: {
      const at::Tensor padding = at::scalar_tensor(padding_value, options);
      std::memcpy(&bits, padding.const_data_ptr(), sizeof(elem_t));
      return bits;
    }
  }
}

// Shared by dense_to_jagged_forward and jagged_to_padded_dense_backward.
at::Tensor dense_to_jagged_impl(const at::Tensor& dense, at::TensorList offsets,
                                std::optional<int64_t> total_L, const char* dense_name,
                                const char* offsets_name) {
  check_cpu(dense, dense_name);
  const CheckedOffsets checked = check_offsets(offsets, offsets_name);
  const int64_t num_levels = static_cast<int64_t>(checked.levels.size());
  TORCH_CHECK(dense.dim() >= num_levels + 1, dense_name, " must have at least ", num_levels + 1,
              " dims [B, max_lengths...] for ", num_levels, " jagged dims, got shape ",
              dense.sizes());
  TORCH_CHECK(dense.size(0) == checked.batch, dense_name, ".size(0) = ", dense.size(0),
              " must equal len(", offsets_name, "[0]) - 1 = ", checked.batch);
  // Without total_L the output has the last offset's rows, as in FBGEMM: rows of runs longer than
  // the dense extent (truncated by jagged_to_padded_dense) come back zero. A huge last offset is a
  // huge output; the allocator answers an impossible one.
  const int64_t rows = total_L.value_or(checked.num_rows);
  TORCH_CHECK_VALUE(rows >= 0, "total_L must be >= 0, got ", rows);
  TORCH_CHECK(rows >= checked.num_rows, "total_L = ", rows, " is smaller than ", offsets_name, "[",
              num_levels - 1, "][-1] = ", checked.num_rows);

  const at::Tensor dense_c = dense.contiguous();
  const at::IntArrayRef max_lengths = dense_c.sizes().slice(1, num_levels);
  const at::IntArrayRef row_shape = dense_c.sizes().slice(num_levels + 1);
  std::vector<int64_t> out_shape{rows};
  out_shape.insert(out_shape.end(), row_shape.begin(), row_shape.end());
  int64_t inner = 1;
  for (const int64_t s : row_shape) inner *= s;

  // The kernel writes every row of a run; rows outside all runs exist only with several jagged
  // levels (truncated outer rows) or when the runs do not tile [0, total_L).
  const bool runs_tile_output =
      num_levels == 1 && checked.first_row == 0 && rows == checked.num_rows;
  at::Tensor values = at::empty(out_shape, dense_c.options());
  advise_huge_pages(values.mutable_data_ptr(), values.nbytes());
  if (!runs_tile_output) values.zero_();
  dispatch_index_kind(index_kind(checked.levels[0].scalar_type()), [&](auto index_tag) {
    using index_t = typename decltype(index_tag)::type;
    const auto layout = make_layout<index_t>(checked, max_lengths, inner);
    dispatch_element_width(dense_c.element_size(), [&](auto elem_tag) {
      using elem_t = typename decltype(elem_tag)::type;
      kernels::dense_to_jagged(layout, static_cast<const elem_t*>(dense_c.const_data_ptr()),
                               static_cast<elem_t*>(values.mutable_data_ptr()));
    });
  });
  return values;
}

// jagged_to_padded_dense_forward and the one-level forms, with the padding as given (a float,
// or jagged_1d_to_dense's integer).
at::Tensor jagged_to_padded_dense_impl(const at::Tensor& values, at::TensorList offsets,
                                       at::IntArrayRef max_lengths,
                                       const c10::Scalar& padding_value) {
  check_cpu(values, "values");
  const CheckedOffsets checked = check_offsets(offsets, "offsets");
  const int64_t num_levels = static_cast<int64_t>(checked.levels.size());
  TORCH_CHECK(values.dim() >= 1, "values must be at least 1-D [L] or [L, D], got a scalar");
  TORCH_CHECK(static_cast<int64_t>(max_lengths.size()) == num_levels,
              "max_lengths must have one entry per jagged dim (", num_levels, "), got ",
              max_lengths.size());
  for (int64_t d = 0; d < num_levels; ++d) {
    TORCH_CHECK_VALUE(max_lengths[d] >= 0, "max_lengths[", d, "] must be >= 0, got ",
                      max_lengths[d]);
  }
  TORCH_CHECK(checked.num_rows <= values.size(0), "values has ", values.size(0),
              " rows but offsets[", num_levels - 1, "][-1] = ", checked.num_rows,
              " rows are addressed");

  const at::Tensor values_c = values.contiguous();
  const at::IntArrayRef row_shape = values_c.sizes().slice(1);
  std::vector<int64_t> out_shape{checked.batch};
  out_shape.insert(out_shape.end(), max_lengths.begin(), max_lengths.end());
  out_shape.insert(out_shape.end(), row_shape.begin(), row_shape.end());
  int64_t inner = 1;
  for (const int64_t s : row_shape) inner *= s;
  at::Tensor dense = at::empty(out_shape, values_c.options());
  advise_huge_pages(dense.mutable_data_ptr(), dense.nbytes());

  dispatch_index_kind(index_kind(checked.levels[0].scalar_type()), [&](auto index_tag) {
    using index_t = typename decltype(index_tag)::type;
    const auto layout = make_layout<index_t>(checked, max_lengths, inner);
    dispatch_element_width(values_c.element_size(), [&](auto elem_tag) {
      using elem_t = typename decltype(elem_tag)::type;
      // The padding value converted to the values' dtype, then moved as raw bits.
      const elem_t padding = padding_bits<elem_t>(padding_value, values_c.options());
      kernels::jagged_to_dense(layout, static_cast<const elem_t*>(values_c.const_data_ptr()),
                               padding, static_cast<elem_t*>(dense.mutable_data_ptr()));
    });
  });
  return dense;
}

// The one-level forms' max_lengths[0], under its own name.
void check_max_sequence_length(int64_t max_sequence_length) {
  TORCH_CHECK_VALUE(max_sequence_length >= 0, "max_sequence_length must be >= 0, got ",
                    max_sequence_length);
}

}  // namespace

at::Tensor jagged_to_padded_dense_forward(const at::Tensor& values, at::TensorList offsets,
                                          at::IntArrayRef max_lengths, double padding_value) {
  return jagged_to_padded_dense_impl(values, offsets, max_lengths, padding_value);
}

at::Tensor jagged_to_padded_dense_backward(const at::Tensor& grad_output, at::TensorList offsets,
                                           int64_t total_L) {
  return dense_to_jagged_impl(grad_output, offsets, total_L, "grad_output", "offsets");
}

at::Tensor dense_to_jagged_forward(const at::Tensor& dense, at::TensorList x_offsets,
                                   std::optional<int64_t> total_L) {
  return dense_to_jagged_impl(dense, x_offsets, total_L, "dense", "x_offsets");
}

at::Tensor jagged_2d_to_dense(const at::Tensor& values, const at::Tensor& offsets,
                              int64_t max_sequence_length) {
  check_dim(values, 2, "values");
  check_max_sequence_length(max_sequence_length);
  return jagged_to_padded_dense_impl(values, {offsets}, {max_sequence_length}, 0.0);
}

at::Tensor jagged_1d_to_dense(const at::Tensor& values, const at::Tensor& offsets,
                              int64_t max_sequence_length, int64_t padding_value) {
  check_dim(values, 1, "values");
  check_max_sequence_length(max_sequence_length);
  return jagged_to_padded_dense_impl(values, {offsets}, {max_sequence_length}, padding_value);
}

}  // namespace recops::jagged

// group_index_select_dim0 and FBGEMM's two helper ops behind its autograd (docs/gather_and_relative
// _bias.md): output g = input_group[g].index_select(0, indices_group[g]) for every group, and the
// backward that scatter-adds each output gradient into a zero table of its input's shape.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <string>
#include <utility>
#include <vector>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/gather/kernels/index_select_rows.h"
#include "recops/gather/ops.h"

namespace recops::gather {
namespace {

std::string nth(const char* list, size_t g) {
  return std::string(list) + "[" + std::to_string(g) + "]";
}

void check_group_index(const at::Tensor& index, const std::string& name) {
  check_cpu(index, name.c_str());
  TORCH_CHECK(index.dim() <= 1, name, " must be 1-D, got shape ", index.sizes());
  check_index_dtype(index, name.c_str());
}

kernels::RowIndex row_index(const at::Tensor& index_c) {
  return {index_c.const_data_ptr(), index_c.scalar_type() == at::kLong};
}

// The product of sizes[1:]: the elements of one row.
int64_t row_numel(at::IntArrayRef sizes) {
  int64_t n = 1;
  for (size_t d = 1; d < sizes.size(); ++d) n *= sizes[d];
  return n;
}

// Outputs of the first `group_size` groups: inputs[g].index_select(0, indices[g]).
std::vector<at::Tensor> select_groups(at::TensorList inputs, at::TensorList indices,
                                      const char* inputs_name, const char* indices_name) {
  const size_t group_size = indices.size();
  std::vector<at::Tensor> inputs_c, indices_c, outputs;
  std::vector<kernels::RowGather> groups(group_size);
  for (size_t g = 0; g < group_size; ++g) {
    const std::string input_name = nth(inputs_name, g);
    const std::string index_name = nth(indices_name, g);
    check_cpu(inputs[g], input_name.c_str());
    check_group_index(indices[g], index_name);
    // index_select on a scalar, as FBGEMM's CPU path: one row of one element, a scalar out.
    TORCH_CHECK_INDEX(inputs[g].dim() > 0 || indices[g].numel() == 1, index_name,
                      " must hold exactly one index when ", input_name, " is 0-D, got ",
                      indices[g].numel());
    inputs_c.push_back(inputs[g].contiguous());
    indices_c.push_back(indices[g].contiguous());
  }
  for (size_t g = 0; g < group_size; ++g) {
    const at::Tensor& input = inputs_c[g];
    std::vector<int64_t> shape = input.sizes().vec();
    if (input.dim() > 0) shape[0] = indices_c[g].numel();
    outputs.push_back(at::empty(shape, input.options()));
    const int64_t row_bytes = row_numel(input.sizes()) * input.element_size();
    groups[g] = {static_cast<const char*>(input.const_data_ptr()),
                 input.dim() > 0 ? input.size(0) : 1,
                 row_bytes,
                 row_index(indices_c[g]),
                 indices_c[g].numel(),
                 static_cast<char*>(outputs[g].mutable_data_ptr()),
                 row_bytes};
  }
  const kernels::BadIndex bad =
      kernels::gather_row_groups(groups.data(), static_cast<int64_t>(group_size));
  TORCH_CHECK_INDEX(bad.group < 0, indices_name, "[", bad.group, "] entries must be in [0, ",
                    bad.group < 0 ? 0 : groups[bad.group].rows, ") (the rows of ", inputs_name, "[",
                    bad.group, "]), got ", indices_name, "[", bad.group, "][", bad.position,
                    "] = ", bad.group < 0 ? 0 : index_at(indices_c[bad.group], bad.position));
  return outputs;
}

}  // namespace

std::vector<at::Tensor> group_index_select_dim0(at::TensorList input_group,
                                                at::TensorList indices_group) {
  TORCH_CHECK(input_group.size() >= indices_group.size(),
              "input_group must hold one tensor per entry of indices_group (", indices_group.size(),
              "), got ", input_group.size());
  return select_groups(input_group, indices_group, "input_group", "indices_group");
}

std::vector<at::Tensor> group_index_select_dim0_gpu_impl(at::TensorList inputs,
                                                         int64_t group_size) {
  TORCH_CHECK(group_size >= 0, "group_size must be >= 0, got ", group_size);
  TORCH_CHECK(group_size <= static_cast<int64_t>(inputs.size()) / 2,
              "inputs must hold group_size (", group_size,
              ") index tensors followed by as many input tensors, got ", inputs.size(), " tensors");
  std::vector<at::Tensor> outputs =
      select_groups(inputs.slice(group_size, group_size), inputs.slice(0, group_size),
                    "inputs[group_size:]", "inputs[:group_size]");
  for (at::Tensor& saved : empty_saved_data()) outputs.push_back(std::move(saved));
  return outputs;
}

std::vector<at::Tensor> empty_saved_data() {
  const auto options = at::TensorOptions().dtype(at::kLong);
  return {at::empty({0}, options), at::empty({0}, options)};
}

std::vector<at::Tensor> group_index_select_dim0_gpu_backward(at::TensorList inputs,
                                                             at::IntArrayRef output_shape_group) {
  TORCH_CHECK(inputs.size() >= 3,
              "inputs must hold the output gradients, the indices, two tensors of saved data and "
              "the first forward input (at least 3 tensors), got ",
              inputs.size());
  const size_t group_size = (inputs.size() - 3) / 2;
  const at::Tensor& first_input = inputs[2 * group_size + 2];
  const int64_t dim = first_input.dim();
  TORCH_CHECK(dim >= 1, "inputs[", 2 * group_size + 2,
              "] (the first forward input) must have at least 1 dimension, got a 0-D tensor");
  TORCH_CHECK(
      static_cast<int64_t>(output_shape_group.size()) == static_cast<int64_t>(group_size) * dim,
      "output_shape_group must hold ", dim, " sizes (the first forward input's dim) for ",
      "each of the ", group_size, " groups, got ", output_shape_group.size());
  for (size_t i = 0; i < output_shape_group.size(); ++i) {
    TORCH_CHECK_VALUE(output_shape_group[i] >= 0, "output_shape_group entries must be >= 0, got ",
                      "output_shape_group[", i, "] = ", output_shape_group[i]);
  }
  const std::string first_name =
      "inputs[" + std::to_string(2 * group_size + 2) + "] (the first forward input)";
  check_cpu(first_input, first_name.c_str());
  const FloatKind kind = float_kind(first_input.scalar_type(), first_name.c_str());
  const at::TensorOptions options = first_input.options();

  std::vector<at::Tensor> outputs;
  for (size_t g = 0; g < group_size; ++g) {
    outputs.push_back(at::empty({0}, at::TensorOptions().dtype(at::kLong)));
  }
  std::vector<at::Tensor> grads_c, indices_c;
  for (size_t g = 0; g < group_size; ++g) {
    const std::string grad_name = nth("inputs", g) + " (grad of output " + std::to_string(g) + ")";
    const std::string index_name =
        nth("inputs", group_size + g) + " (indices " + std::to_string(g) + ")";
    check_cpu(inputs[g], grad_name.c_str());
    check_group_index(inputs[group_size + g], index_name);
    const at::Tensor index = inputs[group_size + g].contiguous();
    at::IntArrayRef shape = output_shape_group.slice(g * dim, dim);
    std::vector<int64_t> grad_shape = shape.vec();
    grad_shape[0] = index.numel();
    TORCH_CHECK(inputs[g].sizes() == at::IntArrayRef(grad_shape), grad_name, " must have shape ",
                at::IntArrayRef(grad_shape), " (the indices' length, then the input's row shape), ",
                "got ", inputs[g].sizes());
    float_kind(inputs[g].scalar_type(), grad_name.c_str());
    grads_c.push_back(inputs[g].to(options.dtype()).contiguous());
    indices_c.push_back(index);
    outputs.push_back(at::empty(shape, options));
  }
  for (size_t g = 0; g < group_size; ++g) {
    const at::Tensor& out = outputs[group_size + g];
    const int64_t width = row_numel(out.sizes());
    const int64_t bad = dispatch_float_kind(kind, [&](auto scalar_tag) {
      using scalar_t = typename decltype(scalar_tag)::type;
      return kernels::scatter_add_rows<accumulate_t<scalar_t>>(
          data_as<scalar_t>(grads_c[g]), width, row_index(indices_c[g]), indices_c[g].numel(),
          out.size(0), width, mutable_data_as<scalar_t>(out));
    });
    TORCH_CHECK_INDEX(bad < 0, "indices ", g, " (inputs[", group_size + g,
                      "]) entries must be in [0, ", out.size(0), ") (output_shape_group's rows), ",
                      "got entry ", bad, " = ", bad < 0 ? 0 : index_at(indices_c[g], bad));
  }
  return outputs;
}

}  // namespace recops::gather

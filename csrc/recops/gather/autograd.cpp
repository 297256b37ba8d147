// Autograd of group_index_select_dim0 and its _gpu_impl form, in C++ as FBGEMM binds them: a
// group of small selections runs in tens of microseconds, where a Python autograd wrapper costs
// as much again. The backward of both calls recops::group_index_select_dim0_gpu_backward through
// the dispatcher, so compiled and exported graphs see that op. The forwards redispatch below the
// Autograd key (else they would re-enter themselves).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <vector>

#include "recops/gather/ops.h"

namespace recops::gather {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Saves what table_grads needs: the indices, FBGEMM's two saved-data tensors, every selected
// table's shape (flattened, as the backward op takes them) and the first table (its dtype and dim
// give the gradients'). Called after the forward op has validated its arguments.
void save_groups(AutogradContext* ctx, at::TensorList tables, at::TensorList indices,
                 at::TensorList saved_data) {
  std::vector<at::Tensor> to_save(indices.begin(), indices.end());
  to_save.insert(to_save.end(), saved_data.begin(), saved_data.end());
  ctx->save_for_backward(to_save);
  std::vector<c10::SymInt> shapes;
  for (const at::Tensor& table : tables) {
    const c10::SymIntArrayRef sizes = table.sym_sizes();
    shapes.insert(shapes.end(), sizes.begin(), sizes.end());
  }
  ctx->saved_data["table_shapes"] = std::move(shapes);
  if (!tables.empty()) ctx->saved_data["first_table"] = tables[0].detach();
}

// The tables' gradients from the outputs' (one per group, in the first table's dtype; the
// autograd engine casts each to its table's dtype).
variable_list table_grads(AutogradContext* ctx, const variable_list& output_grads) {
  static const auto backward =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("recops::group_index_select_dim0_gpu_backward", "")
          .typed<std::vector<at::Tensor>(at::TensorList, c10::SymIntArrayRef)>();
  const variable_list saved = ctx->get_saved_variables();
  const size_t group_size = saved.size() - 2;  // the indices, then the two saved-data tensors
  if (group_size == 0) return {};
  std::vector<at::Tensor> inputs(output_grads.begin(), output_grads.begin() + group_size);
  inputs.insert(inputs.end(), saved.begin(), saved.end());
  inputs.push_back(ctx->saved_data["first_table"].toTensor());
  const std::vector<c10::SymInt> shapes = ctx->saved_data["table_shapes"].toSymIntVector();
  std::vector<at::Tensor> result = backward.call(inputs, shapes);
  return variable_list(result.begin() + group_size, result.end());
}

struct GroupIndexSelect : public torch::autograd::Function<GroupIndexSelect> {
  static variable_list forward(AutogradContext* ctx, at::TensorList input_group,
                               at::TensorList indices_group) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("recops::group_index_select_dim0", "")
                               .typed<std::vector<at::Tensor>(at::TensorList, at::TensorList)>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    std::vector<at::Tensor> outputs = op.call(input_group, indices_group);
    const size_t group_size = indices_group.size();
    save_groups(ctx, input_group.slice(0, group_size), indices_group, empty_saved_data());
    ctx->saved_data["num_inputs"] = static_cast<int64_t>(input_group.size());
    return outputs;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // One gradient per table, then none for the unselected inputs and the indices.
    variable_list grads = table_grads(ctx, grad_outputs);
    const auto num_inputs = static_cast<size_t>(ctx->saved_data["num_inputs"].toInt());
    grads.resize(num_inputs + (ctx->get_saved_variables().size() - 2));
    return grads;
  }
};

struct GroupIndexSelectGpuImpl : public torch::autograd::Function<GroupIndexSelectGpuImpl> {
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, int64_t group_size) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("recops::group_index_select_dim0_gpu_impl", "")
                               .typed<std::vector<at::Tensor>(at::TensorList, int64_t)>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    std::vector<at::Tensor> outputs = op.call(inputs, group_size);
    // The op has checked 0 <= group_size <= inputs.size() / 2: indices first, then the tables.
    const at::TensorList results(outputs);
    save_groups(ctx, inputs.slice(group_size, group_size), inputs.slice(0, group_size),
                results.slice(group_size));
    ctx->saved_data["group_size"] = group_size;
    ctx->saved_data["num_inputs"] = static_cast<int64_t>(inputs.size());
    ctx->mark_non_differentiable(results.slice(group_size).vec());
    return outputs;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // None for the indices, one gradient per table, none for the rest and for group_size.
    const variable_list tables = table_grads(ctx, grad_outputs);
    const auto group_size = static_cast<size_t>(ctx->saved_data["group_size"].toInt());
    variable_list grads(group_size);
    grads.insert(grads.end(), tables.begin(), tables.end());
    grads.resize(static_cast<size_t>(ctx->saved_data["num_inputs"].toInt()) + 1);
    return grads;
  }
};

std::vector<at::Tensor> group_index_select_dim0_autograd(at::TensorList input_group,
                                                         at::TensorList indices_group) {
  return GroupIndexSelect::apply(input_group, indices_group);
}

std::vector<at::Tensor> group_index_select_dim0_gpu_impl_autograd(at::TensorList inputs,
                                                                  int64_t group_size) {
  return GroupIndexSelectGpuImpl::apply(inputs, group_size);
}

}  // namespace
}  // namespace recops::gather

TORCH_LIBRARY_IMPL(recops, Autograd, m) {
  using namespace recops::gather;
  m.impl("group_index_select_dim0", TORCH_FN(group_index_select_dim0_autograd));
  m.impl("group_index_select_dim0_gpu_impl", TORCH_FN(group_index_select_dim0_gpu_impl_autograd));
}

// Autograd of the jagged <-> dense ops, in C++ as FBGEMM binds them: these ops run in
// microseconds, where a Python autograd wrapper would cost as much as the kernel. Each backward
// calls another recops op through the dispatcher, so compiled and exported graphs see ops. The
// forwards redispatch below the Autograd key (else they would re-enter themselves).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

namespace recops::jagged {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Variable;
using torch::autograd::variable_list;

at::Tensor call_jagged_to_padded_dense_forward(const at::Tensor& values, at::TensorList offsets,
                                               c10::SymIntArrayRef max_lengths,
                                               double padding_value) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("recops::jagged_to_padded_dense_forward", "")
          .typed<at::Tensor(const at::Tensor&, at::TensorList, c10::SymIntArrayRef, double)>();
  return op.call(values, offsets, max_lengths, padding_value);
}

at::Tensor call_jagged_to_padded_dense_backward(const at::Tensor& grad, at::TensorList offsets,
                                                c10::SymInt total_L) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("recops::jagged_to_padded_dense_backward", "")
                             .typed<at::Tensor(const at::Tensor&, at::TensorList, c10::SymInt)>();
  return op.call(grad, offsets, std::move(total_L));
}

// The gradient of every jagged -> dense op: the valid positions of the dense gradient, back in
// the jagged layout of `offsets` (saved by forward) with `total_L` rows.
variable_list jagged_values_grad(AutogradContext* ctx, const variable_list& grad_outputs,
                                 size_t num_inputs) {
  variable_list grads(num_inputs);
  grads[0] = call_jagged_to_padded_dense_backward(grad_outputs[0], ctx->get_saved_variables(),
                                                  ctx->saved_data["total_L"].toSymInt());
  return grads;
}

// Saves what jagged_values_grad needs: the offsets levels and the number of values rows.
void save_jagged_layout(AutogradContext* ctx, const at::Tensor& values,
                        const std::vector<at::Tensor>& offsets) {
  ctx->save_for_backward(offsets);
  ctx->saved_data["total_L"] = values.sym_size(0);
}

struct JaggedToPaddedDense : public torch::autograd::Function<JaggedToPaddedDense> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& values,
                            const std::vector<at::Tensor>& offsets, c10::SymIntArrayRef max_lengths,
                            double padding_value) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    at::Tensor dense =
        call_jagged_to_padded_dense_forward(values, offsets, max_lengths, padding_value);
    save_jagged_layout(ctx, values, offsets);  // after the op has validated values
    return dense;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    return jagged_values_grad(ctx, grad_outputs, 4);
  }
};

struct DenseToJagged : public torch::autograd::Function<DenseToJagged> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& dense,
                            const std::vector<at::Tensor>& x_offsets,
                            std::optional<c10::SymInt> total_L) {
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("recops::dense_to_jagged_forward", "")
            .typed<at::Tensor(const at::Tensor&, at::TensorList, std::optional<c10::SymInt>)>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    at::Tensor values = op.call(dense, x_offsets, std::move(total_L));
    // After the op has validated that dense has [B, max_lengths..., ...] dims.
    ctx->save_for_backward(x_offsets);
    const c10::SymIntArrayRef sizes = dense.sym_sizes();
    ctx->saved_data["max_lengths"] =
        std::vector<c10::SymInt>(sizes.begin() + 1, sizes.begin() + 1 + x_offsets.size());
    return values;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto max_lengths = ctx->saved_data["max_lengths"].toSymIntVector();
    return {call_jagged_to_padded_dense_forward(grad_outputs[0], ctx->get_saved_variables(),
                                                max_lengths, 0.0),
            Variable(), Variable()};
  }
};

struct Jagged2dToDense : public torch::autograd::Function<Jagged2dToDense> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& values,
                            const at::Tensor& offsets, c10::SymInt max_sequence_length) {
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("recops::jagged_2d_to_dense", "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::SymInt)>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    at::Tensor dense = op.call(values, offsets, std::move(max_sequence_length));
    save_jagged_layout(ctx, values, {offsets});
    return dense;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    return jagged_values_grad(ctx, grad_outputs, 3);
  }
};

struct Jagged1dToDense : public torch::autograd::Function<Jagged1dToDense> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& values,
                            const at::Tensor& offsets, c10::SymInt max_sequence_length,
                            int64_t padding_value) {
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("recops::jagged_1d_to_dense", "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::SymInt, int64_t)>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    at::Tensor dense = op.call(values, offsets, std::move(max_sequence_length), padding_value);
    save_jagged_layout(ctx, values, {offsets});
    return dense;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    return jagged_values_grad(ctx, grad_outputs, 4);
  }
};

at::Tensor jagged_to_padded_dense_forward_autograd(const at::Tensor& values, at::TensorList offsets,
                                                   c10::SymIntArrayRef max_lengths,
                                                   double padding_value) {
  return JaggedToPaddedDense::apply(values, offsets.vec(), max_lengths, padding_value);
}

at::Tensor dense_to_jagged_forward_autograd(const at::Tensor& dense, at::TensorList x_offsets,
                                            std::optional<c10::SymInt> total_L) {
  return DenseToJagged::apply(dense, x_offsets.vec(), std::move(total_L));
}

at::Tensor jagged_2d_to_dense_autograd(const at::Tensor& values, const at::Tensor& offsets,
                                       c10::SymInt max_sequence_length) {
  return Jagged2dToDense::apply(values, offsets, std::move(max_sequence_length));
}

at::Tensor jagged_1d_to_dense_autograd(const at::Tensor& values, const at::Tensor& offsets,
                                       c10::SymInt max_sequence_length, int64_t padding_value) {
  return Jagged1dToDense::apply(values, offsets, std::move(max_sequence_length), padding_value);
}

}  // namespace
}  // namespace recops::jagged

TORCH_LIBRARY_IMPL(recops, Autograd, m) {
  using namespace recops::jagged;
  m.impl("jagged_to_padded_dense_forward", TORCH_FN(jagged_to_padded_dense_forward_autograd));
  m.impl("dense_to_jagged_forward", TORCH_FN(dense_to_jagged_forward_autograd));
  m.impl("jagged_2d_to_dense", TORCH_FN(jagged_2d_to_dense_autograd));
  m.impl("jagged_1d_to_dense", TORCH_FN(jagged_1d_to_dense_autograd));
}

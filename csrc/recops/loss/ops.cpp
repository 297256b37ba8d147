// Schemas and kernel registrations of the loss family in torch.ops.recops, and its autograd.
// Fake kernels and the Python entry point live in recops/operators/loss.py.
#include <ATen/TensorSubclassLikeUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/mul.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include "recops/loss/ops.h"

TORCH_LIBRARY_FRAGMENT(recops, m) {
  m.set_python_module("recops.operators.loss");
  const std::vector<at::Tag> pt2 = {at::Tag::pt2_compliant_tag};
  m.def(
      "sampled_softmax_loss(Tensor queries, Tensor positives, Tensor positive_ids, "
      "Tensor negatives, Tensor negative_ids, Tensor weights, float temperature, "
      "float eps=1e-6, int positive_shift=0) -> Tensor",
      pt2);
  m.def(
      "sampled_softmax_loss_and_grads(Tensor queries, Tensor positives, Tensor positive_ids, "
      "Tensor negatives, Tensor negative_ids, Tensor weights, float temperature, "
      "float eps=1e-6, int positive_shift=0) "
      "-> (Tensor loss, Tensor grad_queries, Tensor grad_positives, Tensor grad_negatives)",
      pt2);
}

TORCH_LIBRARY_IMPL(recops, CPU, m) {
  m.impl("sampled_softmax_loss", TORCH_FN(recops::loss::sampled_softmax_loss));
  m.impl("sampled_softmax_loss_and_grads", TORCH_FN(recops::loss::sampled_softmax_loss_and_grads));
}

namespace recops::loss {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A scalar loss's gradients are grad_output times those of a grad_output of 1: the forward of a
// call that needs gradients (sampled_softmax_loss_autograd decides) computes those with the loss,
// in its one pass over the rows (sampled_softmax_loss_and_grads), and the backward only scales
// them. Computing them in the backward would multiply the queries with the negatives a second time
// (a third of the loss's work). Both ops are called through the dispatcher, so compiled and
// exported graphs see them.
struct SampledSoftmaxLoss : public torch::autograd::Function<SampledSoftmaxLoss> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& queries,
                            const at::Tensor& positives, const at::Tensor& positive_ids,
                            const at::Tensor& negatives, const at::Tensor& negative_ids,
                            const at::Tensor& weights, double temperature, double eps,
                            int64_t positive_shift) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    static const auto loss_and_grads =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("recops::sampled_softmax_loss_and_grads", "")
            .typed<decltype(sampled_softmax_loss_and_grads)>();
    auto [loss, grad_queries, grad_positives, grad_negatives] =
        loss_and_grads.call(queries, positives, positive_ids, negatives, negative_ids, weights,
                            temperature, eps, positive_shift);
    ctx->save_for_backward({grad_queries, grad_positives, grad_negatives});
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    // The saved gradients have no graph of their own: differentiated again, they would pass as
    // constants.
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "sampled_softmax_loss is differentiable once: its backward does not support "
                "create_graph=True");
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& grad = grad_outputs[0];
    // loss.backward()'s grad_output is 1: the saved gradients are the answer as they are, without
    // a scaled copy of each (two [M, d] writes a training step). Autograd adds into them out of
    // place (the saved reference keeps them from being reused). Only a plain tensor's value is
    // read: a traced or batched grad_output has none.
    const bool unit =
        !at::isTensorSubclassLike(grad) && grad.numel() == 1 && grad.item<double>() == 1.0;
    const auto scaled = [&](size_t input, const at::Tensor& g) {
      if (!ctx->needs_input_grad(input)) return at::Tensor();
      return unit ? g : at::mul(g, grad);
    };
    // One gradient per argument: the three float operands', none for the ids, the weights,
    // the temperature, eps and the shift.
    return {scaled(0, saved[0]), scaled(1, saved[1]), at::Tensor(),
            scaled(3, saved[2]), at::Tensor(),        at::Tensor(),
            at::Tensor(),        at::Tensor(),        at::Tensor()};
  }
};

at::Tensor sampled_softmax_loss_autograd(const at::Tensor& queries, const at::Tensor& positives,
                                         const at::Tensor& positive_ids,
                                         const at::Tensor& negatives,
                                         const at::Tensor& negative_ids, const at::Tensor& weights,
                                         double temperature, double eps, int64_t positive_shift) {
  if (torch::autograd::compute_requires_grad(queries, positives, negatives)) {
    return SampledSoftmaxLoss::apply(queries, positives, positive_ids, negatives, negative_ids,
                                     weights, temperature, eps, positive_shift);
  }
  static const auto loss = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("recops::sampled_softmax_loss", "")
                               .typed<decltype(sampled_softmax_loss)>();
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return loss.call(queries, positives, positive_ids, negatives, negative_ids, weights, temperature,
                   eps, positive_shift);
}

}  // namespace
}  // namespace recops::loss

TORCH_LIBRARY_IMPL(recops, Autograd, m) {
  m.impl("sampled_softmax_loss", TORCH_FN(recops::loss::sampled_softmax_loss_autograd));
}

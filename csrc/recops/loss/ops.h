// ATen adapters of the loss family (docs/ops.md section 9): the sampled softmax loss over shared
// negatives, fused. Validate, allocate, dispatch to kernels/.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace recops::loss {

// The weighted mean over the rows of queries [M, d] of -log softmax of [q_i . p^_i, q_i . n^_j
// for the R shared negatives] / temperature at the positive, p^ and n^ the L2-normalised rows of
// positives [M, d] and negatives [R, d] (x / max(|x|, eps)); a negative whose id equals the row's
// positive id drops out. weights [M]. With positive_shift s, row i of queries (and of weights)
// goes with row i + s of positives and positive_ids, for i < M - s (next-item prediction over
// one sequence's rows: s = 1, no shifted copies). A 0-d tensor of queries' dtype.
at::Tensor sampled_softmax_loss(const at::Tensor& queries, const at::Tensor& positives,
                                const at::Tensor& positive_ids, const at::Tensor& negatives,
                                const at::Tensor& negative_ids, const at::Tensor& weights,
                                double temperature, double eps, int64_t positive_shift);

// (the loss, grad_queries, grad_positives, grad_negatives): the loss and its gradients for a
// grad_output of 1, in one pass over the rows (the autograd's forward; its backward scales them);
// the rows no pair reads (positive_shift) have zero gradients.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sampled_softmax_loss_and_grads(
    const at::Tensor& queries, const at::Tensor& positives, const at::Tensor& positive_ids,
    const at::Tensor& negatives, const at::Tensor& negative_ids, const at::Tensor& weights,
    double temperature, double eps, int64_t positive_shift);

}  // namespace recops::loss

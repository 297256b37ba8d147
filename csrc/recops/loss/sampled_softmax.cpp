// sampled_softmax_loss and sampled_softmax_loss_and_grads's adapters (docs/ops.md section 9).
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>

#include <cmath>
#include <limits>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/loss/kernels/loss_kernels.h"
#include "recops/loss/ops.h"

namespace recops::loss {
namespace {

// The validated operands: matrices with unit column stride, ids and weights contiguous in the
// kernels' types.
struct Inputs {
  at::Tensor queries, positives, positive_ids, negatives, negative_ids, weights;
};

Inputs checked_inputs(const at::Tensor& queries, const at::Tensor& positives,
                      const at::Tensor& positive_ids, const at::Tensor& negatives,
                      const at::Tensor& negative_ids, const at::Tensor& weights, double temperature,
                      double eps, int64_t positive_shift) {
  for (const auto& [t, name] : {std::pair{&queries, "queries"},
                                {&positives, "positives"},
                                {&negatives, "negatives"},
                                {&positive_ids, "positive_ids"},
                                {&negative_ids, "negative_ids"},
                                {&weights, "weights"}}) {
    check_cpu(*t, name);
  }
  float_kind(queries.scalar_type(), "queries");
  check_dim(queries, 2, "queries");
  check_dim(positives, 2, "positives");
  check_dim(negatives, 2, "negatives");
  check_same_dtype(positives, "positives", queries, "queries");
  check_same_dtype(negatives, "negatives", queries, "queries");
  TORCH_CHECK_VALUE(positives.sizes() == queries.sizes(), "positives must have queries' shape ",
                    queries.sizes(), ", got ", positives.sizes());
  TORCH_CHECK_VALUE(negatives.size(1) == queries.size(1), "negatives must have queries' ",
                    queries.size(1), " columns, got shape ", negatives.sizes());
  check_dim(positive_ids, 1, "positive_ids");
  check_dim(negative_ids, 1, "negative_ids");
  check_index_dtype(positive_ids, "positive_ids");
  check_index_dtype(negative_ids, "negative_ids");
  TORCH_CHECK_VALUE(positive_ids.size(0) == queries.size(0),
                    "positive_ids must have one id per "
                    "row of queries (",
                    queries.size(0), "), got ", positive_ids.size(0));
  TORCH_CHECK_VALUE(negative_ids.size(0) == negatives.size(0),
                    "negative_ids must have one id "
                    "per row of negatives (",
                    negatives.size(0), "), got ", negative_ids.size(0));
  check_dim(weights, 1, "weights");
  TORCH_CHECK_VALUE(weights.size(0) == queries.size(0),
                    "weights must have one value per row of "
                    "queries (",
                    queries.size(0), "), got ", weights.size(0));
  TORCH_CHECK_VALUE(at::isFloatingType(weights.scalar_type()) || weights.scalar_type() == at::kBool,
                    "weights must be floating point or bool, got ", weights.scalar_type());
  TORCH_CHECK_VALUE(std::isfinite(temperature) && temperature > 0.0,
                    "temperature must be positive and finite, got ", temperature);
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps > 0.0, "eps must be positive and finite, got ", eps);
  TORCH_CHECK_VALUE(positive_shift >= 0 && positive_shift <= queries.size(0),
                    "positive_shift must be in [0, queries.size(0)] = [0, ", queries.size(0),
                    "], got ", positive_shift);
  return Inputs{with_unit_columns(queries),
                with_unit_columns(positives),
                positive_ids.to(at::kLong).contiguous(),
                with_unit_columns(negatives),
                negative_ids.to(at::kLong).contiguous(),
                weights.to(at::kDouble).contiguous()};
}

// The kernels' problem: the first M - shift rows of queries and weights against the rows of
// positives and positive_ids `shift` further on.
template <typename T>
kernels::SampledSoftmaxProblem<T> problem(const Inputs& in, double temperature, double eps,
                                          int64_t shift) {
  return kernels::SampledSoftmaxProblem<T>{
      in.queries.size(0) - shift,
      in.queries.size(1),
      in.negatives.size(0),
      data_as<T>(in.queries),
      in.queries.stride(0),
      data_as<T>(in.positives) + shift * in.positives.stride(0),
      in.positives.stride(0),
      in.positive_ids.const_data_ptr<int64_t>() + shift,
      data_as<T>(in.negatives),
      in.negatives.stride(0),
      in.negative_ids.const_data_ptr<int64_t>(),
      in.weights.const_data_ptr<double>(),
      temperature,
      eps};
}

// The weighted mean; 0 / 0 (no weight) is NaN, as the composition's mean of nothing.
at::Tensor mean_loss(const kernels::LossSums& sums, const at::Tensor& queries) {
  return at::full({}, sums.weighted_loss / sums.weight, queries.options());
}

}  // namespace

at::Tensor sampled_softmax_loss(const at::Tensor& queries, const at::Tensor& positives,
                                const at::Tensor& positive_ids, const at::Tensor& negatives,
                                const at::Tensor& negative_ids, const at::Tensor& weights,
                                double temperature, double eps, int64_t positive_shift) {
  const Inputs in = checked_inputs(queries, positives, positive_ids, negatives, negative_ids,
                                   weights, temperature, eps, positive_shift);
  const kernels::LossSums sums =
      dispatch_float_kind(float_kind(queries.scalar_type(), "queries"), [&](auto tag) {
        using T = typename decltype(tag)::type;
        return kernels::loss_kernels<T>().loss(problem<T>(in, temperature, eps, positive_shift),
                                               nullptr);
      });
  return mean_loss(sums, queries);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sampled_softmax_loss_and_grads(
    const at::Tensor& queries, const at::Tensor& positives, const at::Tensor& positive_ids,
    const at::Tensor& negatives, const at::Tensor& negative_ids, const at::Tensor& weights,
    double temperature, double eps, int64_t positive_shift) {
  const Inputs in = checked_inputs(queries, positives, positive_ids, negatives, negative_ids,
                                   weights, temperature, eps, positive_shift);
  const int64_t rows = queries.size(0), scored = rows - positive_shift;
  // The rows no pair reads get zero: the last `shift` queries, the first `shift` positives.
  at::Tensor grad_queries = at::empty(queries.sizes(), queries.options());
  at::Tensor grad_positives = at::empty(positives.sizes(), positives.options());
  at::Tensor grad_negatives = at::empty(negatives.sizes(), negatives.options());
  grad_queries.narrow(0, scored, positive_shift).zero_();
  grad_positives.narrow(0, 0, positive_shift).zero_();
  const kernels::LossSums sums =
      dispatch_float_kind(float_kind(queries.scalar_type(), "queries"), [&](auto tag) {
        using T = typename decltype(tag)::type;
        const kernels::SampledSoftmaxGrads<T> grads{
            mutable_data_as<T>(grad_queries),
            mutable_data_as<T>(grad_positives) + positive_shift * positives.size(1),
            mutable_data_as<T>(grad_negatives)};
        return kernels::loss_kernels<T>().loss(problem<T>(in, temperature, eps, positive_shift),
                                               &grads);
      });
  return {mean_loss(sums, queries), grad_queries, grad_positives, grad_negatives};
}

}  // namespace recops::loss

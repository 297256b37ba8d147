#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include "recops/common/checks.h"
#include "recops/embedding/batch.h"
#include "recops/embedding/ops.h"

namespace recops::embedding {
namespace {

// Positions outside [offsets[0], offsets[-1]) belong to no bag, so a NONE-pooled output only
// needs zeroing when the bags do not cover all indices.
bool bags_cover_indices(const CheckedBatch& batch) {
  const int64_t last = batch.offsets.numel() - 1;
  return index_at(batch.offsets, 0) == 0 && index_at(batch.offsets, last) == batch.bags.num_indices;
}

}  // namespace

at::Tensor split_embedding_codegen_forward(
    const at::Tensor& weights, const at::Tensor& weights_offsets, const at::Tensor& D_offsets,
    int64_t total_D, int64_t max_D, const at::Tensor& rows_per_table, const at::Tensor& indices,
    const at::Tensor& offsets, int64_t pooling_mode,
    const std::optional<at::Tensor>& indice_weights, int64_t output_dtype,
    const std::optional<at::Tensor>& batch_size_per_feature_per_rank, int64_t vbe_output_size) {
  const CheckedBatch batch =
      check_batch(weights, weights_offsets, D_offsets, rows_per_table, indices, offsets,
                  pooling_mode, indice_weights, batch_size_per_feature_per_rank);
  TORCH_CHECK(total_D == batch.layout.total_D && max_D == batch.layout.max_D, "total_D = ", total_D,
              " and max_D = ", max_D, " must match D_offsets (", batch.layout.total_D, " and ",
              batch.layout.max_D, ")");
  const at::TensorOptions options = weights.options().dtype(lookup_output_dtype(output_dtype));
  const bool pooled = pooling_mode != static_cast<int64_t>(kernels::Pooling::kNone);
  const bool vbe = batch.output_offsets.defined();
  TORCH_CHECK(!vbe || vbe_output_size == batch.output_size, "vbe_output_size = ", vbe_output_size,
              " must be the variable-batch output's size, ", batch.output_size,
              " (the sum over features and ranks of batch size times dim)");
  // Every bag's row is written: the VBE rows tile the flat output exactly.
  at::Tensor out = vbe      ? at::empty({batch.output_size}, options)
                   : pooled ? at::empty({batch.layout.batch_size, total_D}, options)
                   : bags_cover_indices(batch)
                       ? at::empty({batch.bags.num_indices, max_D}, options)
                       : at::zeros({batch.bags.num_indices, max_D}, options);
  const at::Tensor weights_c = weights.contiguous();
  kernels::ForwardArgs args;
  args.layout = batch.layout;
  args.bags = batch.bags;
  args.int8_weights = weights_c.scalar_type() == at::kByte;
  if (!args.int8_weights) args.weights_kind = stored_float_kind(weights_c, "weights");
  args.weights = weights_c.const_data_ptr();
  args.out_kind = stored_float_kind(out, "output");
  args.out = out.mutable_data_ptr();
  const int64_t bad = kernels::tbe_kernels(cpu_isa()).forward(args);
  if (bad >= 0) raise_out_of_range(batch, bad);
  return out;
}

at::Tensor split_embedding_codegen_grad_indice_weights(
    const at::Tensor& grad_output, const at::Tensor& weights, const at::Tensor& weights_offsets,
    const at::Tensor& D_offsets, const at::Tensor& rows_per_table, const at::Tensor& indices,
    const at::Tensor& offsets, int64_t pooling_mode,
    const std::optional<at::Tensor>& feature_requires_grad, bool gradient_clipping,
    double max_gradient, const std::optional<at::Tensor>& batch_size_per_feature_per_rank) {
  check_not_int8(weights);
  const CheckedBatch batch =
      check_batch(weights, weights_offsets, D_offsets, rows_per_table, indices, offsets,
                  pooling_mode, std::nullopt, batch_size_per_feature_per_rank);
  const at::Tensor grad = checked_grad_output(grad_output, batch);
  at::Tensor requires_grad;
  if (feature_requires_grad.has_value()) {
    check_cpu(*feature_requires_grad, "feature_requires_grad");
    TORCH_CHECK(feature_requires_grad->numel() == batch.layout.num_features,
                "feature_requires_grad must have one entry per feature (",
                batch.layout.num_features, "), got ", feature_requires_grad->numel());
    // Nonzero means "requires grad" for any dtype; a cast to int32 could turn 2^32 into 0.
    requires_grad = feature_requires_grad->ne(0).to(at::kInt).contiguous();
  }
  at::Tensor out = at::zeros({batch.bags.num_indices}, grad.options());
  const at::Tensor weights_c = weights.contiguous();
  kernels::SampleWeightsGradArgs args;
  args.layout = batch.layout;
  args.bags = batch.bags;
  args.weights_kind = stored_float_kind(weights_c, "weights");
  args.weights = weights_c.const_data_ptr();
  args.grad_output = grad.const_data_ptr<float>();
  args.max_gradient = clip_bound(gradient_clipping, max_gradient);
  args.feature_requires_grad =
      requires_grad.defined() ? requires_grad.const_data_ptr<int32_t>() : nullptr;
  args.grad = out.mutable_data_ptr<float>();
  const int64_t bad = kernels::tbe_kernels(cpu_isa()).sample_weights_grad(args);
  if (bad >= 0) raise_out_of_range(batch, bad);
  return out;
}

}  // namespace recops::embedding

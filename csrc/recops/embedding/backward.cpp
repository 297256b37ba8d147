#include <algorithm>
#include <map>
#include <vector>

#include "recops/common/checks.h"
#include "recops/embedding/batch.h"
#include "recops/embedding/ops.h"

namespace recops::embedding {
namespace {

int64_t state_size(kernels::Optimizer optimizer, int64_t D) {
  switch (optimizer) {
    case kernels::Optimizer::kAdagrad:
      return D;
    case kernels::Optimizer::kRowwiseAdagrad:
      return 1;
    default:
      return 0;
  }
}

// momentum1 must hold every feature's table state (rows x D elements for Adagrad, rows for
// rowwise Adagrad) at momentum1_offsets[t]; features sharing a table share its state.
at::Tensor checked_state_offsets(kernels::Optimizer optimizer, const CheckedBatch& batch,
                                 const OptimizerState& state) {
  TORCH_CHECK(state.momentum1.has_value() && state.momentum1_offsets.has_value(),
              "this optimizer needs momentum1 and momentum1_offsets");
  const at::Tensor& momentum1 = *state.momentum1;
  check_cpu(momentum1, "momentum1");
  check_dim(momentum1, 1, "momentum1");
  TORCH_CHECK(momentum1.scalar_type() == at::kFloat, "momentum1 must be float32, got ",
              momentum1.scalar_type());
  TORCH_CHECK(momentum1.is_contiguous(), "momentum1 must be contiguous: it is updated in place");
  const int64_t T = batch.layout.num_features;
  const at::Tensor& offsets = *state.momentum1_offsets;
  check_cpu(offsets, "momentum1_offsets");
  TORCH_CHECK(offsets.dim() == 1 && offsets.numel() == T && offsets.scalar_type() == at::kLong,
              "momentum1_offsets must be int64 [", T, "], got ", offsets.scalar_type(), " ",
              offsets.sizes());
  at::Tensor offsets_c = offsets.contiguous();
  const int64_t* state_off = offsets_c.const_data_ptr<int64_t>();
  std::vector<TableExtent> tables(T);
  std::map<int64_t, int64_t> table_state;  // weights offset of a non-empty table -> state offset
  for (int64_t t = 0; t < T; ++t) {
    const int64_t D = batch.layout.D_offsets[t + 1] - batch.layout.D_offsets[t];
    const int64_t per_row = state_size(optimizer, D);
    const int64_t rows = batch.layout.rows[t];
    TORCH_CHECK(state_off[t] >= 0 && rows <= (momentum1.numel() - state_off[t]) / per_row,
                "feature ", t, "'s optimizer state (", rows, " x ", per_row,
                " at momentum1_offsets[", t, "] = ", state_off[t],
                ") does not fit in momentum1 of ", momentum1.numel(), " elements");
    tables[t] = {state_off[t], rows, per_row};
    if (rows == 0) continue;
    const auto [it, inserted] = table_state.emplace(batch.layout.weights_offsets[t], state_off[t]);
    TORCH_CHECK(inserted || it->second == state_off[t],
                "features sharing a table must share its optimizer state, feature ", t,
                " has momentum1_offsets ", state_off[t], " but another has ", it->second);
  }
  check_disjoint_tables(tables, "momentum1", "momentum1_offsets");
  return offsets_c;
}

}  // namespace

void backward_exact(kernels::Optimizer optimizer, const at::Tensor& grad_output,
                    const at::Tensor& weights, const at::Tensor& weights_offsets,
                    const at::Tensor& D_offsets, const at::Tensor& rows_per_table,
                    const at::Tensor& indices, const at::Tensor& offsets, int64_t pooling_mode,
                    const std::optional<at::Tensor>& indice_weights, const OptimizerState& state,
                    const at::Tensor& learning_rate_tensor, double weight_decay,
                    int64_t weight_decay_mode, bool gradient_clipping, double max_gradient) {
  const CheckedBatch batch = check_batch(weights, weights_offsets, D_offsets, rows_per_table,
                                         indices, offsets, pooling_mode, indice_weights);
  TORCH_CHECK(weights.is_contiguous(), "weights must be contiguous: they are updated in place");
  const at::Tensor grad = checked_grad_output(grad_output, batch);
  TORCH_CHECK(weight_decay_mode >= 0 && weight_decay_mode <= 2,
              "weight_decay_mode must be 0 (NONE), 1 (L2) or 2 (DECOUPLE), got ",
              weight_decay_mode);
  check_cpu(learning_rate_tensor, "learning_rate_tensor");
  TORCH_CHECK(learning_rate_tensor.scalar_type() == at::kFloat && learning_rate_tensor.numel() == 1,
              "learning_rate_tensor must be a float32 tensor of one value, got ",
              learning_rate_tensor.scalar_type(), " of shape ", learning_rate_tensor.sizes());
  const float learning_rate = learning_rate_tensor.item<float>();
  check_finite(learning_rate, "learning_rate_tensor", at::kFloat);
  check_finite(weight_decay, "weight_decay", at::kFloat);
  if (optimizer != kernels::Optimizer::kSgd) check_finite(state.eps, "eps", at::kFloat);
  // Sort keys pack (global row, bag or position) into 64 bits.
  const auto bits_below = [](int64_t bound) {
    return bound <= 1 ? 0 : 64 - __builtin_clzll(static_cast<uint64_t>(bound - 1));
  };
  const int64_t payloads =
      std::max(batch.bags.num_indices, batch.layout.num_features * batch.layout.batch_size);
  TORCH_CHECK(bits_below(batch.max_table_rows) + bits_below(payloads) <= 64, "a table of ",
              batch.max_table_rows, " rows with ", payloads,
              " indices or bags exceeds the 64-bit sort key");

  kernels::UpdateArgs args;
  args.layout = batch.layout;
  args.bags = batch.bags;
  args.grad_output = grad.const_data_ptr<float>();
  args.max_gradient = clip_bound(gradient_clipping, max_gradient);
  args.weights_kind = float_kind(weights, "weights");
  args.weights = weights.mutable_data_ptr();
  at::Tensor state_offsets;
  if (optimizer != kernels::Optimizer::kSgd) {
    state_offsets = checked_state_offsets(optimizer, batch, state);
    args.state = state.momentum1->mutable_data_ptr<float>();
    args.state_offsets = state_offsets.const_data_ptr<int64_t>();
  }
  args.optimizer = optimizer;
  args.params.learning_rate = learning_rate;
  args.params.eps = static_cast<float>(state.eps);
  args.params.weight_decay = static_cast<float>(weight_decay);
  args.params.weight_decay_mode = static_cast<kernels::WeightDecay>(weight_decay_mode);
  const int64_t bad = kernels::tbe_kernels(cpu_isa()).exact_update(args);
  if (bad >= 0) raise_out_of_range(batch, bad);
}

}  // namespace recops::embedding

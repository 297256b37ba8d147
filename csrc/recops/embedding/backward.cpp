#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "recops/common/checks.h"
#include "recops/embedding/batch.h"
#include "recops/embedding/ops.h"

namespace recops::embedding {
namespace {

using kernels::Optimizer;

// State buffer k (`name`, e.g. momentum1) must hold every feature's table state (rows x
// optimizer_state_size elements) at <name>_offsets[t]; features sharing a table share its state.
at::Tensor checked_state_offsets(Optimizer optimizer, int k, const CheckedBatch& batch,
                                 const std::optional<at::Tensor>& state,
                                 const std::optional<at::Tensor>& state_offsets) {
  const std::string name = kernels::optimizer_row(optimizer).buffers[k];
  const std::string offsets_name = name + "_offsets";
  TORCH_CHECK(state.has_value() && state_offsets.has_value(), "this optimizer needs ", name,
              " and ", offsets_name);
  const at::Tensor& momentum = *state;
  check_cpu(momentum, name.c_str());
  check_dim(momentum, 1, name.c_str());
  TORCH_CHECK(momentum.scalar_type() == at::kFloat, name, " must be float32, got ",
              momentum.scalar_type());
  TORCH_CHECK(momentum.is_contiguous(), name, " must be contiguous: it is updated in place");
  const int64_t T = batch.layout.num_features;
  const at::Tensor& offsets = *state_offsets;
  check_cpu(offsets, offsets_name.c_str());
  TORCH_CHECK(offsets.dim() == 1 && offsets.numel() == T && offsets.scalar_type() == at::kLong,
              offsets_name, " must be int64 [", T, "], got ", offsets.scalar_type(), " ",
              offsets.sizes());
  at::Tensor offsets_c = offsets.contiguous();
  const int64_t* state_off = offsets_c.const_data_ptr<int64_t>();
  std::vector<TableExtent> tables(T);
  std::map<int64_t, int64_t> table_state;  // weights offset of a non-empty table -> state offset
  for (int64_t t = 0; t < T; ++t) {
    const int64_t D = batch.layout.D_offsets[t + 1] - batch.layout.D_offsets[t];
    const int64_t per_row = kernels::optimizer_state_size(optimizer, k, D);
    const int64_t rows = batch.layout.rows[t];
    TORCH_CHECK(state_off[t] >= 0 && rows <= (momentum.numel() - state_off[t]) / per_row,
                "feature ", t, "'s optimizer state (", rows, " x ", per_row, " at ", offsets_name,
                "[", t, "] = ", state_off[t], ") does not fit in ", name, " of ", momentum.numel(),
                " elements");
    tables[t] = {state_off[t], rows, per_row};
    if (rows == 0) continue;
    const auto [it, inserted] = table_state.emplace(batch.layout.weights_offsets[t], state_off[t]);
    TORCH_CHECK(inserted || it->second == state_off[t],
                "features sharing a table must share its optimizer state, feature ", t, " has ",
                offsets_name, " ", state_off[t], " but another has ", it->second);
  }
  check_disjoint_tables(tables, name.c_str(), offsets_name.c_str());
  return offsets_c;
}

// 1 - beta^iter for the Adam family's bias correction, after checking beta and iter.
float bias_correction(double beta, const char* name, int64_t iter) {
  TORCH_CHECK_VALUE(std::isfinite(beta) && beta >= 0 && beta < 1, name, " must be in [0, 1), got ",
                    beta);
  return static_cast<float>(1.0 - std::pow(beta, static_cast<double>(iter)));
}

// The counter optimizer's arguments, checked (kernels/tbe.h OptimizerParams::Counter). FBGEMM's
// tail threshold may be a ratio of max_counter: it becomes a count here.
kernels::OptimizerParams::Counter checked_counter(const OptimizerState& state) {
  TORCH_CHECK_VALUE(state.regularization_mode == 3 || state.regularization_mode == 4,
                    "regularization_mode must be 3 (COUNTER) or 4 (COWCLIP), got ",
                    state.regularization_mode);
  TORCH_CHECK_VALUE(state.learning_rate_mode >= -1 && state.learning_rate_mode <= 2,
                    "learning_rate_mode must be -1 (EQUAL) to 2 (COUNTER_SGD), got ",
                    state.learning_rate_mode);
  constexpr int64_t kExactInFloat = int64_t{1} << 24;
  for (const auto& [name, value] : {std::pair{"counter_halflife", state.counter_halflife},
                                    {"adjustment_iter", state.adjustment_iter}}) {
    TORCH_CHECK_VALUE(value >= -kExactInFloat && value <= kExactInFloat, name,
                      " must be within +-2^24 (exact in float32), got ", value);
  }
  for (const auto& [name, value] : {std::pair{"adjustment_ub", state.adjustment_ub},
                                    {"max_counter", state.max_counter},
                                    {"tail_id_threshold", state.tail_id_threshold},
                                    {"weight_norm_coefficient", state.weight_norm_coefficient},
                                    {"lower_bound", state.lower_bound}}) {
    check_finite(value, name, at::kFloat);
  }
  TORCH_CHECK_VALUE(state.max_counter != 0, "max_counter must not be 0 (rates divide by it)");
  kernels::OptimizerParams::Counter counter;
  counter.regularization = static_cast<kernels::CounterRegularization>(state.regularization_mode);
  counter.halflife = static_cast<float>(state.counter_halflife);
  counter.adjustment_iter = static_cast<float>(state.adjustment_iter);
  counter.adjustment_ub = static_cast<float>(state.adjustment_ub);
  counter.learning_rate_mode = state.learning_rate_mode;
  counter.max_counter = static_cast<float>(state.max_counter);
  counter.tail_id_threshold =
      state.is_tail_id_thresh_ratio != 0
          ? std::floor(static_cast<float>(state.tail_id_threshold) * counter.max_counter)
          : static_cast<float>(state.tail_id_threshold);
  counter.weight_norm_coefficient = static_cast<float>(state.weight_norm_coefficient);
  counter.lower_bound = static_cast<float>(state.lower_bound);
  return counter;
}

}  // namespace

void backward_exact(kernels::Optimizer optimizer, const at::Tensor& grad_output,
                    const at::Tensor& weights, const at::Tensor& weights_offsets,
                    const at::Tensor& D_offsets, const at::Tensor& rows_per_table,
                    const at::Tensor& indices, const at::Tensor& offsets, int64_t pooling_mode,
                    const std::optional<at::Tensor>& indice_weights, const OptimizerState& state,
                    const at::Tensor& learning_rate_tensor, double weight_decay,
                    int64_t weight_decay_mode, bool gradient_clipping, double max_gradient,
                    const std::optional<at::Tensor>& batch_size_per_feature_per_rank) {
  check_not_int8(weights);
  const CheckedBatch batch =
      check_batch(weights, weights_offsets, D_offsets, rows_per_table, indices, offsets,
                  pooling_mode, indice_weights, batch_size_per_feature_per_rank);
  TORCH_CHECK(weights.is_contiguous(), "weights must be contiguous: they are updated in place");
  const at::Tensor grad = checked_grad_output(grad_output, batch);
  const kernels::OptimizerRow& row = kernels::optimizer_row(optimizer);
  TORCH_CHECK(row.max_weight_decay_mode > 0 || weight_decay_mode == 0, row.optim_type,
              " applies its own decay in its update: weight_decay_mode must be 0 (NONE), got ",
              weight_decay_mode);
  constexpr const char* kModeNames[] = {"0 (NONE)", "1 (L2)", "2 (DECOUPLE)", "3 (ADAGRADW)"};
  TORCH_CHECK(weight_decay_mode >= 0 && weight_decay_mode <= row.max_weight_decay_mode, row.name,
              "'s weight_decay_mode must be 0 (NONE) to ", kModeNames[row.max_weight_decay_mode],
              ", got ", weight_decay_mode);
  check_cpu(learning_rate_tensor, "learning_rate_tensor");
  TORCH_CHECK(learning_rate_tensor.scalar_type() == at::kFloat && learning_rate_tensor.numel() == 1,
              "learning_rate_tensor must be a float32 tensor of one value, got ",
              learning_rate_tensor.scalar_type(), " of shape ", learning_rate_tensor.sizes());
  const float learning_rate = learning_rate_tensor.item<float>();
  check_finite(learning_rate, "learning_rate_tensor", at::kFloat);
  check_finite(weight_decay, "weight_decay", at::kFloat);
  check_finite(state.eps, "eps", at::kFloat);  // 0 where the optimizer reads none
  for (const auto& [name, value] : {std::pair{"ar_alpha", state.ar_alpha},
                                    {"ema_beta", state.ema_beta},
                                    {"min_shrinkage", state.min_shrinkage}}) {
    check_finite(value, name, at::kFloat);  // 0 where the optimizer reads none
  }
  TORCH_CHECK_VALUE(state.iter >= 1, "iter must be >= 1 (the step being taken), got ", state.iter);
  const kernels::OptimizerParams::Counter counter = checked_counter(state);
  float bias_correction1 = 1, bias_correction2 = 1;
  if (row.bias_corrected) {
    bias_correction1 = bias_correction(state.beta1, "beta1", state.iter);
    bias_correction2 = bias_correction(state.beta2, "beta2", state.iter);
  }
  // Sort keys pack (global row, bag or position) into 64 bits.
  const auto bits_below = [](int64_t bound) {
    return bound <= 1 ? 0 : 64 - __builtin_clzll(static_cast<uint64_t>(bound - 1));
  };
  const int64_t payloads = std::max(batch.bags.num_indices, batch.layout.num_bags());
  TORCH_CHECK(bits_below(batch.max_table_rows) + bits_below(payloads) <= 64, "a table of ",
              batch.max_table_rows, " rows with ", payloads,
              " indices or bags exceeds the 64-bit sort key");

  kernels::UpdateArgs args;
  args.layout = batch.layout;
  args.bags = batch.bags;
  args.grad_output = grad.const_data_ptr<float>();
  args.max_gradient = clip_bound(gradient_clipping, max_gradient);
  args.weights_kind = stored_float_kind(weights, "weights");
  args.weights = weights.mutable_data_ptr();
  at::Tensor state_offsets[kernels::kMaxStates];
  for (int k = 0; k < kernels::kMaxStates; ++k) {
    if (kernels::optimizer_state_size(optimizer, k, 1) == 0) continue;
    state_offsets[k] =
        checked_state_offsets(optimizer, k, batch, state.buffers[k], state.offsets[k]);
    args.state[k] = state.buffers[k]->mutable_data_ptr<float>();
    args.state_offsets[k] = state_offsets[k].const_data_ptr<int64_t>();
  }
  // The buffers updated together must not share memory: their rows are updated concurrently.
  constexpr int kUpdated = 1 + kernels::kMaxStates;
  const char* names[kUpdated] = {"weights"};
  const at::Tensor* updated[kUpdated] = {&weights};
  for (int k = 0; k < kernels::kMaxStates; ++k) {
    names[k + 1] = row.buffers[k];
    if (args.state[k] != nullptr) updated[k + 1] = &*state.buffers[k];
  }
  for (int i = 0; i < kUpdated; ++i) {
    for (int j = i + 1; j < kUpdated; ++j) {
      TORCH_CHECK(updated[i] == nullptr || updated[j] == nullptr ||
                      at::get_overlap_status(*updated[i], *updated[j]) == at::MemOverlapStatus::No,
                  names[i], " and ", names[j],
                  " must not share memory: they are updated in place together");
    }
  }
  args.optimizer = optimizer;
  args.params.learning_rate = learning_rate;
  args.params.eps = static_cast<float>(state.eps);
  args.params.weight_decay = static_cast<float>(weight_decay);
  args.params.weight_decay_mode = static_cast<kernels::WeightDecay>(weight_decay_mode);
  args.params.beta1 = static_cast<float>(state.beta1);
  args.params.beta2 = static_cast<float>(state.beta2);
  args.params.bias_correction1 = bias_correction1;
  args.params.bias_correction2 = bias_correction2;
  args.params.iter = static_cast<float>(state.iter);
  args.params.ar_alpha = static_cast<float>(state.ar_alpha);
  args.params.ema_beta = static_cast<float>(state.ema_beta);
  args.params.min_shrinkage = static_cast<float>(state.min_shrinkage);
  args.params.counter = counter;
  const int64_t bad = kernels::tbe_kernels(cpu_isa()).exact_update(args);
  if (bad >= 0) raise_out_of_range(batch, bad);
}

}  // namespace recops::embedding

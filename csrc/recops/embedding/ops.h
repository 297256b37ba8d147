// ATen adapters of the embedding family (docs/ops.md section 7): validate, allocate, dispatch to
// the instruction-set variant of kernels/. Argument names follow FBGEMM's TBE ops: per feature t,
// weights_offsets[t] is the first element of its table in the flat `weights`, D_offsets[t] its
// first output column, rows_per_table[t] its table's rows; momentum1_offsets[t] likewise for the
// optimizer state. pooling_mode is PoolingMode (SUM 0, MEAN 1, NONE 2), output_dtype SparseType's
// integer (FP32 0, FP16 1, BF16 5), weight_decay_mode WeightDecayMode (NONE 0, L2 1, DECOUPLE 2).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "recops/embedding/kernels/tbe.h"

namespace recops::embedding {

// A zero-filled flat buffer for tables or optimizer state, advised to use transparent huge pages
// before it is first written (see common/memory.h): rows are read at random, and with 4 KiB pages
// nearly every row costs a TLB miss.
at::Tensor embedding_host_zeros(int64_t numel, at::ScalarType dtype);

// FBGEMM's bounds_check_indices (its schema and CPU semantics). BoundsCheckMode: FATAL 0 raises
// (IndexError for an index outside its table, ValueError for malformed offsets, including a last
// offset other than the number of indices, FBGEMM's rule) and writes nothing; WARNING 1 and
// IGNORE 2 repair in place (index -> 0, offsets clamped into range, the last one set to the number
// of indices); WARNING also zeroes `warning`, counts the batch's repairs in it and warns; NONE 3
// does nothing. Index -1 (a pruned row) is left as it is. B_offsets [T + 1] gives a variable batch
// size per feature; weights only has its size checked; b_t_map, info_B_*, bounds_check_version
// and prefetch_pipeline are ignored, as FBGEMM's CPU kernel ignores them.
void bounds_check_indices(const at::Tensor& rows_per_table, const at::Tensor& indices,
                          const at::Tensor& offsets, int64_t bounds_check_mode,
                          const at::Tensor& warning, const std::optional<at::Tensor>& weights,
                          const std::optional<at::Tensor>& B_offsets, int64_t max_B,
                          const std::optional<at::Tensor>& b_t_map, int64_t info_B_num_bits,
                          int64_t info_B_mask, int64_t bounds_check_version,
                          bool prefetch_pipeline);

// An int64 index tensor (indices or offsets, named `name` in errors) narrowed to int32 for
// embedding_table_index_type=torch.int32: an IndexError where a value does not fit.
at::Tensor index_to_int32(const at::Tensor& t, c10::string_view name);

at::Tensor split_embedding_codegen_forward(
    const at::Tensor& weights, const at::Tensor& weights_offsets, const at::Tensor& D_offsets,
    int64_t total_D, int64_t max_D, const at::Tensor& rows_per_table, const at::Tensor& indices,
    const at::Tensor& offsets, int64_t pooling_mode,
    const std::optional<at::Tensor>& indice_weights, int64_t output_dtype,
    const std::optional<at::Tensor>& batch_size_per_feature_per_rank, int64_t vbe_output_size);

at::Tensor split_embedding_codegen_grad_indice_weights(
    const at::Tensor& grad_output, const at::Tensor& weights, const at::Tensor& weights_offsets,
    const at::Tensor& D_offsets, const at::Tensor& rows_per_table, const at::Tensor& indices,
    const at::Tensor& offsets, int64_t pooling_mode,
    const std::optional<at::Tensor>& feature_requires_grad, bool gradient_clipping,
    double max_gradient, const std::optional<at::Tensor>& batch_size_per_feature_per_rank);

// FBGEMM's quantized inference lookup: tables of mixed storage types (FP32, FP16, INT8, INT4,
// INT2, FP8; kernels/quantized_tables.h) in dev_weights (uvm_weights for MANAGED placements),
// weights_offsets in bytes, weights_tys SparseType codes; pooled (SUM / MEAN) into
// [B, total_D], or for PoolingMode.NONE one row of max(max_*_D) per index, per-sample weights
// not read. Indices of -1 (pruned rows) add nothing.
at::Tensor int_nbit_split_embedding_codegen_lookup_function(
    const at::Tensor& dev_weights, const at::Tensor& uvm_weights,
    const at::Tensor& weights_placements, const at::Tensor& weights_offsets,
    const at::Tensor& weights_tys, const at::Tensor& D_offsets, int64_t total_D, int64_t max_int2_D,
    int64_t max_int4_D, int64_t max_int8_D, int64_t max_float16_D, int64_t max_float32_D,
    const at::Tensor& indices, const at::Tensor& offsets, int64_t pooling_mode,
    const std::optional<at::Tensor>& indice_weights, int64_t output_dtype,
    const std::optional<at::Tensor>& lxu_cache_weights,
    const std::optional<at::Tensor>& lxu_cache_locations, std::optional<int64_t> row_alignment,
    std::optional<int64_t> max_float8_D, std::optional<int64_t> fp8_exponent_bits,
    std::optional<int64_t> fp8_exponent_bias);

// The fused backward of every optimizer: updates weights and the optimizer's state buffers in
// place. Each optimizer reads the hyper-parameters its row of kernels/optimizer_table.h declares:
// the Adam family's moments decay by beta1 and beta2 and are bias-corrected at step `iter`;
// rowwise RMSprop-AR's second moment decays by ema_beta and a row untouched since prev_iter
// shrinks by max(min_shrinkage, 1 - lr * ar_alpha * (iter - prev_iter)); rowwise Adagrad with
// counter reads the counter arguments of FBGEMM's rowwise_adagrad_with_counter (their meaning:
// kernels/tbe.h OptimizerParams::Counter).
struct OptimizerState {
  std::optional<at::Tensor> buffers[kernels::kMaxStates];  // the row's buffers, e.g. momentum1
  std::optional<at::Tensor> offsets[kernels::kMaxStates];  // <buffer>_offsets
  double eps = 0;
  double beta1 = 0;
  double beta2 = 0;
  int64_t iter = 1;  // the step being taken
  double ar_alpha = 0;
  double ema_beta = 0;
  double min_shrinkage = 0;
  int64_t counter_halflife = -1;
  int64_t adjustment_iter = -1;
  double adjustment_ub = 1;
  int64_t learning_rate_mode = -1;
  double max_counter = 1;
  double tail_id_threshold = 0;
  int64_t is_tail_id_thresh_ratio = 0;
  int64_t regularization_mode = 3;
  double weight_norm_coefficient = 0;
  double lower_bound = 0;
};

void backward_exact(kernels::Optimizer optimizer, const at::Tensor& grad_output,
                    const at::Tensor& weights, const at::Tensor& weights_offsets,
                    const at::Tensor& D_offsets, const at::Tensor& rows_per_table,
                    const at::Tensor& indices, const at::Tensor& offsets, int64_t pooling_mode,
                    const std::optional<at::Tensor>& indice_weights, const OptimizerState& state,
                    const at::Tensor& learning_rate_tensor, double weight_decay,
                    int64_t weight_decay_mode, bool gradient_clipping, double max_gradient,
                    const std::optional<at::Tensor>& batch_size_per_feature_per_rank);

}  // namespace recops::embedding

// Validation shared by the embedding adapters: turns the tensors describing tables and a batch of
// bags into the torch-free structs of kernels/tbe.h, after checking everything a kernel relies on
// to stay inside its buffers (indices themselves are checked by the kernels).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "recops/embedding/kernels/tbe.h"

namespace recops::embedding {

struct CheckedBatch {
  // Contiguous tensors the layout and bags point into.
  at::Tensor D_offsets;
  at::Tensor weights_offsets;
  at::Tensor rows;
  at::Tensor indices;
  at::Tensor offsets;
  at::Tensor per_sample_weights;  // undefined when absent
  at::Tensor bag_offsets;         // int64 [T + 1]: feature t's bags
  at::Tensor output_offsets;      // int64 [bags] with a variable batch size, else undefined
  int64_t output_size = 0;        // elements of the flat pooled output (variable batch size)
  kernels::FeatureLayout layout;
  kernels::Bags bags;
  int64_t max_table_rows = 0;

  // Points `bags` at indices, offsets and per_sample_weights (once they are final).
  void bind_bags(int64_t pooling_mode);
};

// batch_size_per_feature_per_rank ([T, R] int64, FBGEMM's variable batch size, "VBE"): feature t
// has sum_r [t, r] bags, and the pooled output is flat, rank-major: for each rank r, for each
// feature t, its [t, r] bags' rows of D_t elements (FBGEMM's output_offsets_feature_rank).
CheckedBatch check_batch(const at::Tensor& weights, const at::Tensor& weights_offsets,
                         const at::Tensor& D_offsets, const at::Tensor& rows_per_table,
                         const at::Tensor& indices, const at::Tensor& offsets, int64_t pooling_mode,
                         const std::optional<at::Tensor>& indice_weights,
                         const std::optional<at::Tensor>& batch_size_per_feature_per_rank);

// The first bag of each feature, int64 [T + 1], for `num_bags` bags: B = num_bags / T each, or
// the row sums of batch_size_per_feature_per_rank (which must then add up to num_bags).
at::Tensor feature_bag_offsets(int64_t T, int64_t num_bags,
                               const std::optional<at::Tensor>& batch_size_per_feature_per_rank);

// One feature's table inside a flat buffer (weights, or optimizer state): rows x width elements
// from element `begin`.
struct TableExtent {
  int64_t begin = 0, rows = 0, width = 0;
  int64_t end() const { return begin + rows * width; }
};

// Features whose tables start at the same offset share that table and must agree on its shape;
// distinct tables must not overlap (the update gives every row one owner: two tables on the same
// elements would update them twice, concurrently). An empty table occupies nothing and shares
// with no one: FBGEMM lays a 0-row table at the offset of the next. tables[t] is feature t's.
void check_disjoint_tables(const std::vector<TableExtent>& tables, const char* buffer,
                           const char* offsets_name);

// A per-feature tensor (`name` in errors): 1-D, of `dtype`, with `numel` entries; contiguous.
at::Tensor checked_table_info(const at::Tensor& t, const char* name, at::ScalarType dtype,
                              int64_t numel);

// Per-sample weights (`name`: the schema's argument) as contiguous float32, one per index.
at::Tensor checked_sample_weights(const at::Tensor& w, const char* name, int64_t num_indices);

// The dtype of a lookup's output: output_dtype is SparseType FP32 (0), FP16 (1) or BF16 (5).
at::ScalarType lookup_output_dtype(int64_t output_dtype);

// Raises for uint8 (INT8) weights, which only the forward lookup reads.
void check_not_int8(const at::Tensor& weights);

// The kind of a table or output tensor: float32, float16 or bfloat16 (the dtypes TBE kernels
// store in), else an error naming `name`.
FloatKind stored_float_kind(const at::Tensor& t, const char* name);

// grad_output as contiguous fp32 of the forward output's shape: [B, total_D] pooled ([output_size]
// with a variable batch size), or [num_indices, max_D] for PoolingMode.NONE.
at::Tensor checked_grad_output(const at::Tensor& grad_output, const CheckedBatch& batch);

// The elementwise bound on grad_output: max_gradient when clipping, else +inf.
float clip_bound(bool gradient_clipping, double max_gradient);

// Raises an IndexError naming the index at `position`, its feature, bag and table size.
[[noreturn]] void raise_out_of_range(const CheckedBatch& batch, int64_t position);

}  // namespace recops::embedding

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
  kernels::FeatureLayout layout;
  kernels::Bags bags;
  int64_t max_table_rows = 0;
};

CheckedBatch check_batch(const at::Tensor& weights, const at::Tensor& weights_offsets,
                         const at::Tensor& D_offsets, const at::Tensor& rows_per_table,
                         const at::Tensor& indices, const at::Tensor& offsets, int64_t pooling_mode,
                         const std::optional<at::Tensor>& indice_weights);

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

// The kind of a table or output tensor: float32, float16 or bfloat16 (the dtypes TBE kernels
// store in), else an error naming `name`.
FloatKind stored_float_kind(const at::Tensor& t, const char* name);

// grad_output as contiguous fp32 of the forward output's shape: [B, total_D] pooled, or
// [num_indices, max_D] for PoolingMode.NONE.
at::Tensor checked_grad_output(const at::Tensor& grad_output, const CheckedBatch& batch);

// The elementwise bound on grad_output: max_gradient when clipping, else +inf.
float clip_bound(bool gradient_clipping, double max_gradient);

// Raises an IndexError naming the index at `position`, its feature, bag and table size.
[[noreturn]] void raise_out_of_range(const CheckedBatch& batch, int64_t position);

}  // namespace recops::embedding

#include "recops/embedding/batch.h"

#include <algorithm>
#include <limits>
#include <vector>

#include <ATen/ops/empty.h>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"

namespace recops::embedding {

at::Tensor checked_table_info(const at::Tensor& t, const char* name, at::ScalarType dtype,
                              int64_t numel) {
  check_cpu(t, name);
  check_dim(t, 1, name);
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.numel() == numel, name, " must have ", numel, " entries, got ", t.numel());
  return t.contiguous();
}

namespace {

// Element offsets of every bag's row in the flat VBE output (see check_batch), and their total.
int64_t vbe_output_offsets(const at::Tensor& batch_sizes, const int32_t* D_offsets,
                           const int64_t* bag_offsets, int64_t* output_offsets) {
  const int64_t T = batch_sizes.size(0), R = batch_sizes.size(1);
  const int64_t* sizes = batch_sizes.const_data_ptr<int64_t>();
  std::vector<int64_t> next_bag(bag_offsets, bag_offsets + T);  // per feature, its next bag
  int64_t element = 0;
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t D = D_offsets[t + 1] - D_offsets[t];
      for (int64_t i = 0; i < sizes[t * R + r]; ++i) {
        output_offsets[next_bag[t]++] = element;
        element += D;
      }
    }
  }
  return element;
}

}  // namespace

at::Tensor feature_bag_offsets(int64_t T, int64_t num_bags,
                               const std::optional<at::Tensor>& batch_size_per_feature_per_rank) {
  at::Tensor bag_offsets = at::empty({T + 1}, at::TensorOptions().dtype(at::kLong));
  int64_t* first = bag_offsets.mutable_data_ptr<int64_t>();
  first[0] = 0;
  if (!batch_size_per_feature_per_rank.has_value()) {
    TORCH_CHECK(num_bags % T == 0, "offsets must have T * B + 1 entries for T = ", T,
                " features, got ", num_bags + 1);
    for (int64_t t = 1; t <= T; ++t) first[t] = t * (num_bags / T);
    return bag_offsets;
  }
  const at::Tensor& sizes = *batch_size_per_feature_per_rank;
  const char* name = "batch_size_per_feature_per_rank";
  check_cpu(sizes, name);
  TORCH_CHECK(sizes.dim() == 2 && sizes.size(0) == T && sizes.scalar_type() == at::kLong, name,
              " must be int64 [T, R] for T = ", T, " features, got ", sizes.scalar_type(), " ",
              sizes.sizes());
  const at::Tensor sizes_c = sizes.contiguous();
  const int64_t R = sizes.size(1);
  const int64_t* size = sizes_c.const_data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    first[t + 1] = first[t];
    for (int64_t r = 0; r < R; ++r) {
      const int64_t B = size[t * R + r];
      // Each bound keeps the running sum at most num_bags: it cannot overflow.
      TORCH_CHECK(B >= 0 && B <= num_bags - first[t + 1], name, "[", t, "][", r, "] = ", B,
                  " must be >= 0, and the batch sizes must add up to the ", num_bags,
                  " bags of offsets");
      first[t + 1] += B;
    }
  }
  TORCH_CHECK(first[T] == num_bags, "the batch sizes in ", name, " add up to ", first[T],
              " bags, but offsets has ", num_bags, " (", num_bags + 1, " entries)");
  return bag_offsets;
}

void check_disjoint_tables(const std::vector<TableExtent>& tables, const char* buffer,
                           const char* offsets_name) {
  const int64_t T = static_cast<int64_t>(tables.size());
  std::vector<int64_t> order;  // the features of non-empty tables, by offset
  for (int64_t t = 0; t < T; ++t) {
    if (tables[t].rows > 0) order.push_back(t);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return tables[a].begin < tables[b].begin; });
  const auto describe = [&](int64_t t) {
    const TableExtent& e = tables[t];
    return c10::str("feature ", t, "'s table (", e.rows, " x ", e.width, " at ", offsets_name, "[",
                    t, "] = ", e.begin, ")");
  };
  int64_t reach = -1;  // the feature whose table ends last among those before
  for (size_t i = 1; i < order.size(); ++i) {
    const int64_t prev = order[i - 1], t = order[i];
    if (reach < 0 || tables[prev].end() > tables[reach].end()) reach = prev;
    const TableExtent& e = tables[t];
    if (e.begin == tables[prev].begin) {
      TORCH_CHECK(e.rows == tables[prev].rows && e.width == tables[prev].width,
                  "features sharing the table at ", offsets_name, " ", e.begin,
                  " must agree on its rows and dim, got ", describe(t), " and ", describe(prev));
      continue;
    }
    TORCH_CHECK(tables[reach].end() <= e.begin, describe(t), " overlaps ", describe(reach),
                " inside ", buffer, ": distinct tables need disjoint extents");
  }
}

void CheckedBatch::bind_bags(int64_t pooling_mode) {
  bags.index_kind = index_kind(indices.scalar_type());
  bags.indices = indices.const_data_ptr();
  bags.offsets = offsets.const_data_ptr();
  bags.num_indices = indices.numel();
  bags.per_sample_weights =
      per_sample_weights.defined() ? per_sample_weights.const_data_ptr<float>() : nullptr;
  bags.pooling = static_cast<kernels::Pooling>(pooling_mode);
}

at::Tensor checked_sample_weights(const at::Tensor& w, const char* name, int64_t num_indices) {
  check_cpu(w, name);
  check_dim(w, 1, name);
  TORCH_CHECK(w.scalar_type() == at::kFloat, name, " must be float32, got ", w.scalar_type());
  TORCH_CHECK(w.numel() == num_indices, name, " must have one entry per index (", num_indices,
              "), got ", w.numel());
  return w.contiguous();
}

at::ScalarType lookup_output_dtype(int64_t output_dtype) {
  switch (output_dtype) {
    case 0:
      return at::kFloat;
    case 1:
      return at::kHalf;
    case 5:
      return at::kBFloat16;
    default:
      TORCH_CHECK(false, "output_dtype must be SparseType FP32 (0), FP16 (1) or BF16 (5), got ",
                  output_dtype);
  }
}

void check_not_int8(const at::Tensor& weights) {
  TORCH_CHECK(weights.scalar_type() != at::kByte,
              "weights of weights_precision INT8 (uint8) are looked up only: there is no INT8 "
              "backward, as in FBGEMM's CPU module (run the forward under torch.no_grad())");
}

FloatKind stored_float_kind(const at::Tensor& t, const char* name) {
  const at::ScalarType dtype = t.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16, name,
              " must be float32, float16 or bfloat16, got ", dtype);
  return float_kind(dtype, name);
}

CheckedBatch check_batch(const at::Tensor& weights, const at::Tensor& weights_offsets,
                         const at::Tensor& D_offsets, const at::Tensor& rows_per_table,
                         const at::Tensor& indices, const at::Tensor& offsets, int64_t pooling_mode,
                         const std::optional<at::Tensor>& indice_weights,
                         const std::optional<at::Tensor>& batch_size_per_feature_per_rank) {
  check_cpu(weights, "weights");
  check_dim(weights, 1, "weights");
  // uint8: FBGEMM's INT8 rows, D codes and a float32 scale and bias each (kernels/tbe.h).
  const bool int8 = weights.scalar_type() == at::kByte;
  if (!int8) stored_float_kind(weights, "weights");
  TORCH_CHECK(pooling_mode >= 0 && pooling_mode <= 2,
              "pooling_mode must be 0 (SUM), 1 (MEAN) or 2 (NONE), got ", pooling_mode);

  CheckedBatch batch;
  check_cpu(D_offsets, "D_offsets");
  check_dim(D_offsets, 1, "D_offsets");
  const int64_t T = D_offsets.numel() - 1;
  TORCH_CHECK(T >= 1, "D_offsets must have at least 2 entries (one feature), got ",
              D_offsets.numel());
  batch.D_offsets = checked_table_info(D_offsets, "D_offsets", at::kInt, T + 1);
  batch.weights_offsets = checked_table_info(weights_offsets, "weights_offsets", at::kLong, T);
  batch.rows = checked_table_info(rows_per_table, "rows_per_table", at::kLong, T);
  const int32_t* D_off = batch.D_offsets.const_data_ptr<int32_t>();
  const int64_t* w_off = batch.weights_offsets.const_data_ptr<int64_t>();
  const int64_t* rows = batch.rows.const_data_ptr<int64_t>();

  TORCH_CHECK(D_off[0] == 0, "D_offsets[0] must be 0, got ", D_off[0]);
  int64_t max_D = 0;
  std::vector<TableExtent> tables(T);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t D = D_off[t + 1] - D_off[t];
    TORCH_CHECK(D >= 1, "feature ", t, " must have a positive embedding dim, got D_offsets[", t + 1,
                "] - D_offsets[", t, "] = ", D);
    TORCH_CHECK(rows[t] >= 0, "rows_per_table[", t, "] must be >= 0, got ", rows[t]);
    const int64_t row_size = int8 ? D + kernels::kInt8RowTail : D;
    TORCH_CHECK(w_off[t] >= 0 && rows[t] <= (weights.numel() - w_off[t]) / row_size, "feature ", t,
                "'s table (", rows[t], " rows of ", row_size, " at weights_offsets[", t,
                "] = ", w_off[t], ") does not fit in weights of ", weights.numel(), " elements");
    tables[t] = {w_off[t], rows[t], row_size};
    batch.max_table_rows = std::max(batch.max_table_rows, rows[t]);
    max_D = std::max(max_D, D);
  }
  check_disjoint_tables(tables, "weights", "weights_offsets");
  TORCH_CHECK(pooling_mode != 2 || max_D * T == D_off[T],
              "PoolingMode.NONE needs one embedding dim for all features, got dims from 1 to ",
              max_D, " summing to ", D_off[T]);

  check_cpu(indices, "indices");
  check_cpu(offsets, "offsets");
  check_dim(indices, 1, "indices");
  check_dim(offsets, 1, "offsets");
  check_index_dtype(indices, "indices");
  check_same_dtype(indices, "indices", offsets, "offsets");
  TORCH_CHECK(offsets.numel() >= 1, "offsets must have at least one entry");
  const bool vbe = batch_size_per_feature_per_rank.has_value();
  TORCH_CHECK(!vbe || pooling_mode != 2,
              "batch_size_per_feature_per_rank (a variable batch size) needs pooling: "
              "PoolingMode.NONE has no batch, as in FBGEMM");
  batch.bag_offsets = feature_bag_offsets(T, offsets.numel() - 1, batch_size_per_feature_per_rank);
  batch.indices = indices.contiguous();
  batch.offsets = offsets.contiguous();
  check_offsets_monotonic(batch.offsets, "offsets");
  const int64_t num_indices = batch.indices.numel();
  const int64_t last = index_at(batch.offsets, batch.offsets.numel() - 1);
  TORCH_CHECK_VALUE(last <= num_indices, "offsets[-1] = ", last, " exceeds the ", num_indices,
                    " indices");

  if (indice_weights.has_value()) {
    batch.per_sample_weights =
        checked_sample_weights(*indice_weights, "per_sample_weights", num_indices);
  }

  batch.layout.num_features = T;
  const int64_t* bag_offsets = batch.bag_offsets.const_data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    batch.layout.batch_size =
        std::max(batch.layout.batch_size, bag_offsets[t + 1] - bag_offsets[t]);
  }
  if (vbe) {
    batch.output_offsets = at::empty({bag_offsets[T]}, batch.bag_offsets.options());
    batch.output_size =
        vbe_output_offsets(batch_size_per_feature_per_rank->contiguous(), D_off, bag_offsets,
                           batch.output_offsets.mutable_data_ptr<int64_t>());
    batch.layout.bag_offsets = bag_offsets;
    batch.layout.output_offsets = batch.output_offsets.const_data_ptr<int64_t>();
  }
  batch.layout.total_D = D_off[T];
  batch.layout.max_D = max_D;
  batch.layout.D_offsets = D_off;
  batch.layout.weights_offsets = w_off;
  batch.layout.rows = rows;
  batch.bind_bags(pooling_mode);
  return batch;
}

at::Tensor checked_grad_output(const at::Tensor& grad_output, const CheckedBatch& batch) {
  check_cpu(grad_output, "grad_output");
  stored_float_kind(grad_output, "grad_output");
  const bool pooled = batch.bags.pooling != kernels::Pooling::kNone;
  if (batch.output_offsets.defined()) {
    TORCH_CHECK(grad_output.dim() == 1 && grad_output.size(0) == batch.output_size,
                "grad_output must have the variable-batch output's shape [", batch.output_size,
                "], got ", grad_output.sizes());
    return grad_output.to(at::kFloat).contiguous();
  }
  const int64_t rows = pooled ? batch.layout.batch_size : batch.bags.num_indices;
  const int64_t cols = pooled ? batch.layout.total_D : batch.layout.max_D;
  TORCH_CHECK(grad_output.dim() == 2 && grad_output.size(0) == rows && grad_output.size(1) == cols,
              "grad_output must have the output's shape [", rows, ", ", cols, "], got ",
              grad_output.sizes());
  return grad_output.to(at::kFloat).contiguous();
}

float clip_bound(bool gradient_clipping, double max_gradient) {
  if (!gradient_clipping) return std::numeric_limits<float>::infinity();
  check_finite(max_gradient, "max_gradient", at::kFloat);
  TORCH_CHECK_VALUE(max_gradient >= 0, "max_gradient must be >= 0 when clipping, got ",
                    max_gradient);
  return static_cast<float>(max_gradient);
}

void raise_out_of_range(const CheckedBatch& batch, int64_t position) {
  const kernels::FeatureLayout& layout = batch.layout;
  const int64_t num_bags = layout.num_bags();
  int64_t bag = 0;  // the last bag starting at or before `position` (bags are in order)
  while (bag + 1 < num_bags && index_at(batch.offsets, bag + 1) <= position) ++bag;
  int64_t t = 0;  // the feature of that bag
  while (t + 1 < layout.num_features && layout.first_bag(t + 1) <= bag) ++t;
  TORCH_CHECK_INDEX(false, "indices[", position, "] = ", index_at(batch.indices, position),
                    " is out of range for feature ", t, " (bag ", bag - layout.first_bag(t),
                    "), whose table has ", layout.rows[t], " rows");
}

}  // namespace recops::embedding

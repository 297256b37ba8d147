// FBGEMM's quantized inference lookup on CPU (int_nbit_split_embedding_codegen_lookup_function,
// the op IntNBitTableBatchedEmbeddingBagsCodegen and torchrec's quantized embeddings call): the
// checks FBGEMM's CPU kernel relies on, made before anything is allocated, then
// kernels/quantized_lookup.h. The row layout is kernels/quantized_tables.h's.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "recops/common/checks.h"
#include "recops/embedding/batch.h"
#include "recops/embedding/ops.h"

namespace recops::embedding {
namespace {

using kernels::WeightType;

// FBGEMM's PlacementType: DEVICE 0 has no CPU memory; MANAGED 1 and MANAGED_CACHING 2 read
// uvm_weights, HOST 3 dev_weights.
constexpr int32_t kPlacementDevice = 0;
constexpr int32_t kPlacementHost = 3;

void check_empty_cache(const std::optional<at::Tensor>& t, const char* name) {
  TORCH_CHECK_VALUE(!t.has_value() || t->numel() == 0, name,
                    " must be None or empty: the CPU lookup has no cache, got shape ", t->sizes());
}

const char* weight_type_name(WeightType type) {
  switch (type) {
    case WeightType::kFp32:
      return "FP32";
    case WeightType::kFp16:
      return "FP16";
    case WeightType::kInt8:
      return "INT8";
    case WeightType::kInt4:
      return "INT4";
    case WeightType::kInt2:
      return "INT2";
    case WeightType::kFp8:
      return "FP8";
  }
  return "?";
}

}  // namespace

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
    std::optional<int64_t> fp8_exponent_bias) {
  TORCH_CHECK_VALUE(pooling_mode >= 0 && pooling_mode <= 2,
                    "pooling_mode must be 0 (SUM), 1 (MEAN) or 2 (NONE), got ", pooling_mode);
  const bool pooled = pooling_mode != static_cast<int64_t>(kernels::Pooling::kNone);
  // FBGEMM's INT8 and INT4 outputs are not served.
  const at::ScalarType out_dtype = lookup_output_dtype(output_dtype);
  check_empty_cache(lxu_cache_weights, "lxu_cache_weights");
  check_empty_cache(lxu_cache_locations, "lxu_cache_locations");
  const int64_t alignment = row_alignment.value_or(1);
  TORCH_CHECK_VALUE(alignment >= 1 && alignment <= std::numeric_limits<int32_t>::max(),
                    "row_alignment must be in [1, 2^31), got ", alignment);

  // Tables. Pooled, feature t is table t and D_offsets gives its dim; PoolingMode.NONE (FBGEMM's
  // nobag kernel) reads every table with the one dim max(max_*_D) and ignores D_offsets.
  check_cpu(weights_offsets, "weights_offsets");
  const int64_t T = pooled ? D_offsets.numel() - 1 : weights_offsets.numel();
  TORCH_CHECK_VALUE(T >= 1,
                    pooled ? "D_offsets must have at least 2 entries (one table), got "
                           : "weights_offsets must have at least one entry (one table), got ",
                    pooled ? D_offsets.numel() : weights_offsets.numel());
  const at::Tensor w_offsets = checked_table_info(weights_offsets, "weights_offsets", at::kLong, T);
  const at::Tensor placements =
      checked_table_info(weights_placements, "weights_placements", at::kInt, T);
  const at::Tensor tys = checked_table_info(weights_tys, "weights_tys", at::kByte, T);
  std::vector<int32_t> dims(T + 1);  // D_offsets, or every table's max_D for NONE
  if (pooled) {
    const at::Tensor d_off = checked_table_info(D_offsets, "D_offsets", at::kInt, T + 1);
    std::copy_n(d_off.const_data_ptr<int32_t>(), T + 1, dims.begin());
    TORCH_CHECK_VALUE(total_D >= 1, "total_D must be >= 1, got ", total_D);
    TORCH_CHECK_VALUE(dims[0] >= 0 && dims[T] <= total_D,
                      "D_offsets must lie in [0, total_D = ", total_D,
                      "], got D_offsets[0] = ", dims[0], " and D_offsets[", T, "] = ", dims[T]);
  } else {
    const int64_t D = std::max({max_int2_D, max_int4_D, max_int8_D, max_float16_D, max_float32_D,
                                max_float8_D.value_or(0)});
    TORCH_CHECK_VALUE(D >= 1 && D <= std::numeric_limits<int32_t>::max() / T,
                      "PoolingMode.NONE reads every table with dim max(max_int2_D, max_int4_D, "
                      "max_int8_D, max_float16_D, max_float32_D, max_float8_D), which must be in "
                      "[1, 2^31 / tables), got ",
                      D);
    for (int64_t t = 0; t <= T; ++t) dims[t] = static_cast<int32_t>(t * D);
  }

  const int32_t* place = placements.const_data_ptr<int32_t>();
  const uint8_t* type_codes = tys.const_data_ptr<uint8_t>();
  const int64_t* w_off = w_offsets.const_data_ptr<int64_t>();
  bool reads_uvm = false;
  bool has_fp8 = false;
  int64_t max_D = 0;
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK_VALUE(
        place[t] > kPlacementDevice && place[t] <= kPlacementHost, "weights_placements[", t,
        "] must be MANAGED (1), MANAGED_CACHING (2) or HOST (3) on CPU, got ", place[t]);
    reads_uvm = reads_uvm || place[t] != kPlacementHost;
    TORCH_CHECK_VALUE(kernels::is_served_weight_type(type_codes[t]), "weights_tys[", t,
                      "] must be a SparseType the CPU lookup reads: FP32 (0), FP16 (1), INT8 (2), "
                      "INT4 (3), INT2 (4) or FP8 (6), got ",
                      static_cast<int>(type_codes[t]));
    const auto type = static_cast<WeightType>(type_codes[t]);
    has_fp8 = has_fp8 || type == WeightType::kFp8;
    const int64_t D = static_cast<int64_t>(dims[t + 1]) - dims[t];
    TORCH_CHECK_VALUE(D >= 1, "table ", t, " must have a positive dim, got D_offsets[", t + 1,
                      "] - D_offsets[", t, "] = ", D);
    const int64_t per_byte = 8 / std::min<int64_t>(8, kernels::weight_type_bits(type));
    TORCH_CHECK_VALUE(D % per_byte == 0, "weights_tys[", t, "] = ", weight_type_name(type),
                      " needs a dim (from D_offsets, or max(max_*_D) for PoolingMode.NONE) that "
                      "is a multiple of ",
                      per_byte, ", got ", D);
    max_D = std::max(max_D, D);
  }
  const auto checked_weights = [](const at::Tensor& w, const char* name) {
    check_cpu(w, name);
    TORCH_CHECK(w.scalar_type() == at::kByte, name, " must be uint8 (row bytes), got ",
                w.scalar_type());
    return w.contiguous();
  };
  const at::Tensor dev = checked_weights(dev_weights, "dev_weights");
  const at::Tensor uvm = reads_uvm ? checked_weights(uvm_weights, "uvm_weights") : at::Tensor();
  if (has_fp8) {
    const int64_t bits = fp8_exponent_bits.value_or(-1);
    const int64_t bias = fp8_exponent_bias.value_or(-1);
    TORCH_CHECK_VALUE(bits >= 1 && bits <= 7,
                      "fp8_exponent_bits must be in [1, 7] for FP8 tables, got ", bits);
    TORCH_CHECK_VALUE(bias >= 1 && bias <= 253,
                      "fp8_exponent_bias must be in [1, 253] for FP8 tables, got ", bias);
  }

  // A table's rows run up to the next table's offset (in either buffer, as FBGEMM reads them) or
  // the end of its buffer: FBGEMM counts them from there, tables being padded to 128 bytes.
  std::vector<int64_t> starts(w_off, w_off + T);
  std::sort(starts.begin(), starts.end());
  std::vector<int64_t> rows(T);
  std::vector<const uint8_t*> tables(T);
  std::vector<WeightType> types(T);
  for (int64_t t = 0; t < T; ++t) {
    const at::Tensor& buffer = place[t] == kPlacementHost ? dev : uvm;
    const char* buffer_name = place[t] == kPlacementHost ? "dev_weights" : "uvm_weights";
    TORCH_CHECK_VALUE(w_off[t] >= 0 && w_off[t] <= buffer.numel(), "weights_offsets[", t,
                      "] = ", w_off[t], " must be in [0, ", buffer.numel(), "], the bytes of ",
                      buffer_name);
    const auto next = std::upper_bound(starts.begin(), starts.end(), w_off[t]);
    const int64_t end = next != starts.end() ? std::min(*next, buffer.numel()) : buffer.numel();
    types[t] = static_cast<WeightType>(type_codes[t]);
    rows[t] =
        (end - w_off[t]) / kernels::quantized_row_bytes(types[t], dims[t + 1] - dims[t], alignment);
    tables[t] = buffer.const_data_ptr<uint8_t>() + w_off[t];
  }

  // The batch: B = (offsets.numel() - 1) / T bags per table, FBGEMM's rule (later offsets are
  // not read).
  check_cpu(indices, "indices");
  check_cpu(offsets, "offsets");
  check_dim(indices, 1, "indices");
  check_dim(offsets, 1, "offsets");
  check_index_dtype(indices, "indices");
  check_index_dtype(offsets, "offsets");
  TORCH_CHECK_VALUE(offsets.numel() >= 1, "offsets must have at least one entry");
  const int64_t B = (offsets.numel() - 1) / T;
  CheckedBatch batch;
  batch.indices = indices.contiguous();
  batch.offsets = offsets.slice(0, 0, B * T + 1).contiguous();
  check_offsets_monotonic(batch.offsets, "offsets");
  const int64_t num_indices = batch.indices.numel();
  const int64_t last = index_at(batch.offsets, B * T);
  TORCH_CHECK_VALUE(last <= num_indices, "offsets[", B * T, "] = ", last, " exceeds the ",
                    num_indices, " indices");
  // FBGEMM reads offsets in the indices' dtype; their values (<= num_indices) fit it.
  batch.offsets = batch.offsets.to(indices.scalar_type());
  // Per-sample weights: pooled only; an empty tensor means none, as in FBGEMM, which reads them
  // as a flat array whatever their shape ([N] or torchrec's [N, 1]).
  if (pooled && indice_weights.has_value() && indice_weights->numel() > 0) {
    batch.per_sample_weights =
        checked_sample_weights(indice_weights->flatten(), "indice_weights", num_indices);
  }

  at::Tensor out;
  const at::TensorOptions options = dev.options().dtype(out_dtype);
  if (pooled) {
    const bool covered = dims[0] == 0 && dims[T] == total_D;  // dims increase: they tile the row
    out = covered ? at::empty({B, total_D}, options) : at::zeros({B, total_D}, options);
  } else {
    // Rows of pruned indices and of indices outside every bag stay zero.
    out = at::zeros({num_indices, max_D}, options);
  }
  if (B == 0) return out;

  kernels::QuantizedForwardArgs args;
  kernels::FeatureLayout& layout = args.layout;
  layout.num_features = T;
  layout.batch_size = B;
  layout.total_D = pooled ? total_D : max_D;
  layout.max_D = max_D;
  layout.D_offsets = dims.data();
  layout.weights_offsets = w_off;
  layout.rows = rows.data();
  batch.bind_bags(pooling_mode);
  args.bags = batch.bags;
  args.tables.tables = tables.data();
  args.tables.types = types.data();
  args.tables.row_alignment = alignment;
  args.tables.fp8_exponent_bits = static_cast<int32_t>(fp8_exponent_bits.value_or(-1));
  args.tables.fp8_exponent_bias = static_cast<int32_t>(fp8_exponent_bias.value_or(-1));
  args.out_kind = stored_float_kind(out, "output");
  args.out = out.mutable_data_ptr();
  const int64_t bad = kernels::tbe_kernels(cpu_isa()).quantized_forward(args);
  if (bad >= 0) {
    batch.layout = layout;
    raise_out_of_range(batch, bad);
  }
  return out;
}

}  // namespace recops::embedding

#include <ATen/ops/aminmax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/nonzero.h>

#include <cmath>
#include <limits>
#include <vector>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/hstu/kernels/relative_bias.h"
#include "recops/hstu/ops.h"

namespace recops::attention {
namespace {

using kernels::BiasShape;
using kernels::Lengths;
using kernels::LogBucketizer;

bool is_timestamp_type(at::ScalarType dtype) {
  return dtype == at::kInt || dtype == at::kLong || dtype == at::kFloat || dtype == at::kDouble;
}

// Calls fn(TypeTag<ts_t>{}) for a timestamp dtype: int32, int64, float or double.
template <typename Fn>
decltype(auto) dispatch_timestamp_type(at::ScalarType dtype, Fn&& fn) {
  switch (dtype) {
    case at::kInt:
      return fn(TypeTag<int32_t>{});
    case at::kLong:
      return fn(TypeTag<int64_t>{});
    case at::kFloat:
      return fn(TypeTag<float>{});
    case at::kDouble:
      return fn(TypeTag<double>{});
    default:
      TORCH_CHECK(false, "unsupported timestamp dtype ", dtype);
  }
}

// Calls fn(TypeTag<bin_t>{}) for a bucket-index dtype: uint8, int32 or int64.
template <typename Fn>
decltype(auto) dispatch_bucket_type(at::ScalarType dtype, const char* name, Fn&& fn) {
  switch (dtype) {
    case at::kByte:
      return fn(TypeTag<uint8_t>{});
    case at::kInt:
      return fn(TypeTag<int32_t>{});
    case at::kLong:
      return fn(TypeTag<int64_t>{});
    default:
      TORCH_CHECK(false, name, " must be uint8, int32 or int64, got ", dtype);
  }
}

// The sequences the bias is computed over: dense timestamps [B, N], or jagged timestamps [L] with
// seq_offsets [B + 1] and max_seq_len N, or (for gradients that need lengths only) seq_offsets
// alone. Offsets are copied to int64 (B + 1 entries) so kernels see one type.
struct CheckedSequences {
  at::Tensor timestamps;  // contiguous; undefined when only lengths are known
  std::vector<int64_t> offsets;
  bool jagged = false;
  int64_t batch = 0;
  int64_t seq_len = 0;

  Lengths lengths() const { return {jagged ? offsets.data() : nullptr, seq_len}; }
};

// buckets[B, N, N] = the bucket of every (query, key) pair of the sequences, 0 at padding.
template <typename bin_t>
void compute_bucket_matrix(const CheckedSequences& seqs, int32_t num_buckets, double bucket_divisor,
                           bool query_time_shift, bin_t* buckets) {
  const LogBucketizer bucketizer(bucket_divisor, num_buckets);
  dispatch_timestamp_type(seqs.timestamps.scalar_type(), [&](auto ts_tag) {
    using ts_t = typename decltype(ts_tag)::type;
    kernels::compute_buckets(seqs.timestamps.const_data_ptr<ts_t>(), seqs.lengths(), seqs.batch,
                             query_time_shift, bucketizer, buckets);
  });
}

[[noreturn]] void raise_bucket_out_of_range(const at::Tensor& index, int64_t num_buckets,
                                            int64_t position) {
  TORCH_CHECK_VALUE(false, "bucket_index entries must be in [0, num_buckets] = [0, ", num_buckets,
                    "], got bucket_index.flatten()[", position,
                    "] = ", index.reshape(-1)[position].item<int64_t>());
}

// Every entry of a given bucket index, padding positions included: the kernel reads only the
// valid ones, but an entry that names no bucket is a bad index wherever it stands.
void check_bucket_range(const at::Tensor& index, int64_t num_buckets) {
  if (index.numel() == 0 || (index.scalar_type() == at::kByte && num_buckets >= 255)) return;
  const auto [low, high] = at::aminmax(index);
  if (low.item<int64_t>() >= 0 && high.item<int64_t>() <= num_buckets) return;
  const at::Tensor outside = at::logical_or(index.lt(0), index.gt(num_buckets)).reshape(-1);
  raise_bucket_out_of_range(index, num_buckets, outside.nonzero()[0][0].item<int64_t>());
}

void check_offsets(const at::Tensor& seq_offsets, CheckedSequences& seqs) {
  check_cpu(seq_offsets, "seq_offsets");
  check_dim(seq_offsets, 1, "seq_offsets");
  check_index_dtype(seq_offsets, "seq_offsets");
  TORCH_CHECK(seq_offsets.numel() >= 1, "seq_offsets must have B + 1 >= 1 entries, got none");
  const at::Tensor offsets = seq_offsets.contiguous();
  check_offsets_monotonic(offsets, "seq_offsets");
  seqs.jagged = true;
  seqs.batch = offsets.numel() - 1;
  seqs.offsets.resize(offsets.numel());
  for (int64_t b = 0; b < offsets.numel(); ++b) seqs.offsets[b] = index_at(offsets, b);
}

CheckedSequences check_timestamps(const at::Tensor& timestamps,
                                  const std::optional<at::Tensor>& seq_offsets,
                                  std::optional<int64_t> max_seq_len) {
  check_cpu(timestamps, "timestamps");
  TORCH_CHECK(is_timestamp_type(timestamps.scalar_type()),
              "timestamps must be int32, int64, float or double, got ", timestamps.scalar_type());
  CheckedSequences seqs;
  seqs.timestamps = timestamps.contiguous();
  if (!seq_offsets.has_value()) {
    TORCH_CHECK(timestamps.dim() == 2,
                "timestamps must be 2-D [B, N] (or 1-D jagged values with seq_offsets), got shape ",
                timestamps.sizes());
    seqs.batch = timestamps.size(0);
    seqs.seq_len = timestamps.size(1);
    TORCH_CHECK(!max_seq_len.has_value() || *max_seq_len == seqs.seq_len,
                "max_seq_len = ", max_seq_len.value_or(0),
                " must match timestamps' N = ", seqs.seq_len, " for dense timestamps [B, N]");
    return seqs;
  }
  TORCH_CHECK(timestamps.dim() == 1,
              "timestamps must be 1-D jagged values [L] when seq_offsets is given, got shape ",
              timestamps.sizes());
  TORCH_CHECK(max_seq_len.has_value(), "max_seq_len is required with jagged timestamps");
  TORCH_CHECK_VALUE(*max_seq_len >= 0, "max_seq_len must be >= 0, got ", *max_seq_len);
  check_offsets(*seq_offsets, seqs);
  seqs.seq_len = *max_seq_len;
  TORCH_CHECK(seqs.offsets.back() <= timestamps.numel(), "seq_offsets[-1] = ", seqs.offsets.back(),
              " must be <= the number of timestamps, ", timestamps.numel());
  return seqs;
}

// A table is [entries] or [layers, entries]; returns the layers (1 for a 1-D table).
int64_t table_layers(const at::Tensor& table, const char* name) {
  check_cpu(table, name);
  TORCH_CHECK(table.dim() == 1 || table.dim() == 2, name,
              " must be 1-D [entries] or 2-D [layers, entries], got shape ", table.sizes());
  return table.dim() == 1 ? 1 : table.size(0);
}

void check_position_table(const at::Tensor& pos_w, int64_t seq_len) {
  TORCH_CHECK(pos_w.size(-1) == 2 * seq_len - 1, "pos_w must have 2N - 1 = ", 2 * seq_len - 1,
              " entries for sequence length N = ", seq_len, ", got ", pos_w.size(-1));
}

}  // namespace

at::ScalarType compact_bucket_type(int64_t num_buckets) {
  return kernels::buckets_fit_uint8(num_buckets) ? at::kByte : at::kInt;
}

int32_t checked_num_buckets(int64_t num_buckets) {
  TORCH_CHECK_VALUE(num_buckets >= 0 && num_buckets < std::numeric_limits<int32_t>::max(),
                    "num_buckets must be in [0, 2^31 - 1), got ", num_buckets);
  return static_cast<int32_t>(num_buckets);
}

void check_bucket_divisor(double bucket_divisor) {
  TORCH_CHECK_VALUE(bucket_divisor > 0 && std::isfinite(bucket_divisor),
                    "bucket_divisor must be a positive finite number, got ", bucket_divisor);
}

std::tuple<at::Tensor, at::Tensor> relative_attn_bias_time_forward(
    const at::Tensor& timestamps, const at::Tensor& ts_w, const std::optional<at::Tensor>& pos_w,
    const std::optional<at::Tensor>& seq_offsets, std::optional<int64_t> max_seq_len,
    double bucket_divisor, bool query_time_shift, at::ScalarType index_dtype) {
  const CheckedSequences seqs = check_timestamps(timestamps, seq_offsets, max_seq_len);
  check_bucket_divisor(bucket_divisor);
  const int64_t layers = table_layers(ts_w, "ts_w");
  TORCH_CHECK(ts_w.size(-1) >= 1, "ts_w must have num_buckets + 1 >= 1 entries, got none");
  const BiasShape shape{layers, seqs.batch, seqs.seq_len, ts_w.size(-1) - 1};
  const int32_t nb = checked_num_buckets(shape.num_buckets);
  TORCH_CHECK(index_dtype != at::kByte || kernels::buckets_fit_uint8(nb),
              "a uint8 bucket index holds at most 255 buckets, got num_buckets = ", nb);
  const at::Tensor ts_w_c = ts_w.contiguous();
  at::Tensor pos_w_c;
  if (pos_w.has_value()) {
    check_same_dtype(*pos_w, "pos_w", ts_w, "ts_w");
    TORCH_CHECK(pos_w->dim() == ts_w.dim() && table_layers(*pos_w, "pos_w") == layers,
                "pos_w must be stacked like ts_w (", layers, " layers, ", ts_w.dim(),
                "-D), got shape ", pos_w->sizes());
    check_position_table(*pos_w, shape.seq_len);
    pos_w_c = pos_w->contiguous();
  }
  std::vector<int64_t> out_shape = {shape.batch, shape.seq_len, shape.seq_len};
  if (ts_w.dim() == 2) out_shape.insert(out_shape.begin(), layers);
  at::Tensor out = at::empty(out_shape, ts_w_c.options());
  at::Tensor index =
      at::empty({shape.batch, shape.seq_len, shape.seq_len}, ts_w_c.options().dtype(index_dtype));
  dispatch_bucket_type(index_dtype, "index_dtype", [&](auto bin_tag) {
    using bin_t = typename decltype(bin_tag)::type;
    compute_bucket_matrix(seqs, nb, bucket_divisor, query_time_shift,
                          index.mutable_data_ptr<bin_t>());
    dispatch_float_kind(float_kind(ts_w_c.scalar_type(), "ts_w"), [&](auto scalar_tag) {
      using scalar_t = typename decltype(scalar_tag)::type;
      kernels::lookup<accumulate_t<scalar_t>>(
          index.const_data_ptr<bin_t>(), seqs.lengths(), data_as<scalar_t>(ts_w_c),
          pos_w_c.defined() ? data_as<scalar_t>(pos_w_c) : nullptr, shape,
          mutable_data_as<scalar_t>(out));
    });
  });
  return {out, index};
}

at::Tensor relative_attn_bias_pos(const at::Tensor& pos_w, std::optional<int64_t> max_seq_len) {
  const int64_t layers = table_layers(pos_w, "pos_w");
  const int64_t entries = pos_w.size(-1);
  TORCH_CHECK(entries % 2 == 1, "pos_w must have 2N - 1 entries (an odd number), got ", entries);
  const int64_t seq_len = (entries + 1) / 2;
  if (max_seq_len.has_value()) check_position_table(pos_w, *max_seq_len);
  const at::Tensor pos_w_c = pos_w.contiguous();
  std::vector<int64_t> out_shape = {1, seq_len, seq_len};
  if (pos_w.dim() == 2) out_shape.insert(out_shape.begin(), layers);
  at::Tensor out = at::empty(out_shape, pos_w_c.options());
  dispatch_float_kind(float_kind(pos_w_c.scalar_type(), "pos_w"), [&](auto scalar_tag) {
    using scalar_t = typename decltype(scalar_tag)::type;
    kernels::position_bias(data_as<scalar_t>(pos_w_c), layers, seq_len,
                           mutable_data_as<scalar_t>(out));
  });
  return out;
}

std::tuple<std::optional<at::Tensor>, std::optional<at::Tensor>> relative_attn_bias_backward(
    const at::Tensor& grad_bias, const std::optional<at::Tensor>& timestamps,
    const std::optional<at::Tensor>& bucket_index, const std::optional<at::Tensor>& seq_offsets,
    int64_t num_buckets, double bucket_divisor, bool query_time_shift, bool pos_grad) {
  check_cpu(grad_bias, "grad_bias");
  TORCH_CHECK(grad_bias.dim() == 3 || grad_bias.dim() == 4,
              "grad_bias must be 3-D [B, N, N] or 4-D [layers, B, N, N], got shape ",
              grad_bias.sizes());
  TORCH_CHECK(!(timestamps.has_value() && bucket_index.has_value()),
              "pass timestamps or bucket_index, not both");
  const bool stacked = grad_bias.dim() == 4;
  const int64_t layers = stacked ? grad_bias.size(0) : 1;
  const int64_t batch = grad_bias.size(-3);
  const int64_t seq_len = grad_bias.size(-1);
  TORCH_CHECK(grad_bias.size(-2) == seq_len, "grad_bias must end in [N, N], got shape ",
              grad_bias.sizes());
  const BiasShape shape{layers, batch, seq_len, num_buckets};
  const int32_t nb = checked_num_buckets(num_buckets);

  // The sequences give the valid lengths (and the timestamps, when buckets are recomputed).
  CheckedSequences seqs;
  if (timestamps.has_value()) {
    seqs = check_timestamps(*timestamps, seq_offsets, seq_len);
    check_bucket_divisor(bucket_divisor);
  } else {
    if (seq_offsets.has_value()) check_offsets(*seq_offsets, seqs);
    seqs.batch = seq_offsets.has_value() ? seqs.batch : batch;
    seqs.seq_len = seq_len;
  }
  TORCH_CHECK(seqs.batch == batch, "grad_bias has batch size ", batch, " but ",
              timestamps.has_value() ? "timestamps" : "seq_offsets", " describe ", seqs.batch,
              " sequences");
  at::Tensor index;
  if (bucket_index.has_value()) {
    check_cpu(*bucket_index, "bucket_index");
    TORCH_CHECK(bucket_index->sizes() == at::IntArrayRef({batch, seq_len, seq_len}),
                "bucket_index must be [B, N, N] = [", batch, ", ", seq_len, ", ", seq_len,
                "] like grad_bias, got shape ", bucket_index->sizes());
    index = bucket_index->contiguous();
    check_bucket_range(index, nb);
  }

  const bool time_grad = timestamps.has_value() || bucket_index.has_value();
  const at::Tensor grad_c = grad_bias.contiguous();
  std::optional<at::Tensor> grad_ts;
  std::optional<at::Tensor> grad_pos;
  if (time_grad) {
    grad_ts = stacked ? at::empty({layers, shape.time_entries()}, grad_c.options())
                      : at::empty({shape.time_entries()}, grad_c.options());
  }
  if (pos_grad) {
    grad_pos = stacked ? at::empty({layers, shape.position_entries()}, grad_c.options())
                       : at::empty({shape.position_entries()}, grad_c.options());
  }
  int64_t bad = -1;
  dispatch_float_kind(float_kind(grad_c.scalar_type(), "grad_bias"), [&](auto tag) {
    using scalar_t = typename decltype(tag)::type;
    using acc_t = accumulate_t<scalar_t>;
    const scalar_t* grad = data_as<scalar_t>(grad_c);
    scalar_t* ts_sink = time_grad ? mutable_data_as<scalar_t>(*grad_ts) : nullptr;
    scalar_t* pos_sink = pos_grad ? mutable_data_as<scalar_t>(*grad_pos) : nullptr;
    if (timestamps.has_value()) {
      const LogBucketizer bucketizer(bucket_divisor, nb);
      dispatch_timestamp_type(seqs.timestamps.scalar_type(), [&](auto ts_tag) {
        using ts_t = typename decltype(ts_tag)::type;
        bad = kernels::relative_bias_backward_from_timestamps<acc_t>(
            grad, shape, seqs.lengths(), seqs.timestamps.const_data_ptr<ts_t>(), query_time_shift,
            bucketizer, ts_sink, pos_sink);
      });
    } else if (index.defined()) {
      dispatch_bucket_type(index.scalar_type(), "bucket_index", [&](auto bin_tag) {
        using bin_t = typename decltype(bin_tag)::type;
        bad = kernels::relative_bias_backward<acc_t>(
            grad, shape, seqs.lengths(), index.const_data_ptr<bin_t>(), ts_sink, pos_sink);
      });
    } else {
      bad = kernels::relative_bias_backward<acc_t>(
          grad, shape, seqs.lengths(), static_cast<const uint8_t*>(nullptr), ts_sink, pos_sink);
    }
  });
  if (bad >= 0) raise_bucket_out_of_range(index, nb, bad);
  return {grad_ts, grad_pos};
}

}  // namespace recops::attention

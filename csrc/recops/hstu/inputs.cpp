#include "recops/hstu/inputs.h"

#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>

#include "recops/common/checks.h"
#include "recops/common/partials.h"

namespace recops::attention {

using namespace kernels;

PreparedSequences prepare_sequences(int64_t rows, const at::Tensor& seq_offsets,
                                    const std::optional<at::Tensor>& seq_lengths,
                                    int64_t max_seq_len) {
  check_cpu(seq_offsets, "seq_offsets");
  check_dim(seq_offsets, 1, "seq_offsets");
  check_index_dtype(seq_offsets, "seq_offsets");
  TORCH_CHECK(seq_offsets.numel() >= 1, "seq_offsets must have B + 1 >= 1 entries, got none");
  TORCH_CHECK_VALUE(max_seq_len >= 0, "max_seq_len must be >= 0, got ", max_seq_len);
  const at::Tensor offsets = seq_offsets.to(at::kLong).contiguous();
  check_offsets_monotonic(offsets, "seq_offsets");
  const int64_t batch = offsets.numel() - 1;
  PreparedSequences p;
  p.row_begin = offsets.slice(0, 0, batch).contiguous();
  if (seq_lengths.has_value()) {
    check_cpu(*seq_lengths, "seq_lengths");
    check_dim(*seq_lengths, 1, "seq_lengths");
    check_index_dtype(*seq_lengths, "seq_lengths");
    TORCH_CHECK(seq_lengths->numel() == batch, "seq_lengths must have B = ", batch,
                " entries, got ", seq_lengths->numel());
    p.length = seq_lengths->to(at::kLong).contiguous();
    check_lengths_non_negative(p.length, "seq_lengths");
  } else {
    const int64_t last = offsets.const_data_ptr<int64_t>()[batch];
    TORCH_CHECK(last == rows, "seq_offsets[-1] = ", last, " must equal the number of rows of q (",
                rows, ")");
    p.length = at::sub(offsets.slice(0, 1), offsets.slice(0, 0, batch)).contiguous();
  }
  const int64_t* begin = p.row_begin.const_data_ptr<int64_t>();
  const int64_t* length = p.length.const_data_ptr<int64_t>();
  const char* length_source = seq_lengths.has_value() ? "seq_lengths" : "seq_offsets";
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(length[b] <= max_seq_len, "sequence ", b, " has length ", length[b], " (from ",
                length_source, ") > max_seq_len = ", max_seq_len);
    TORCH_CHECK(begin[b] + length[b] <= rows, "sequence ", b, " (seq_offsets[", b,
                "] + seq_lengths[", b, "]) ends at row ", begin[b] + length[b], " past the ", rows,
                " rows of q");
  }
  p.key_rows = p.query_rows = rows;
  p.view = Sequences::same_rows(batch, begin, length, max_seq_len);
  return p;
}

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    check_cpu(*t, name);
    check_dim(*t, 3, name);
    check_floating(*t, name);
  }
  check_same_dtype(q, "q", k, "k");
  check_same_dtype(q, "q", v, "v");
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0),
              "q, k and v must have the same number of rows L, got ", q.size(0), ", ", k.size(0),
              " and ", v.size(0));
  TORCH_CHECK(k.size(1) == q.size(1) && v.size(1) == q.size(1),
              "q, k and v must have the same number of heads, got ", q.size(1), ", ", k.size(1),
              " and ", v.size(1));
  TORCH_CHECK(k.size(2) == q.size(2), "q and k must have the same head dim, got ", q.size(2),
              " and ", k.size(2));
}

PreparedMask prepare_mask(const HstuOptions& o, const Sequences& seqs, int64_t heads,
                          at::ScalarType compute) {
  PreparedMask p;
  PreparedMask& m = p;
  TORCH_CHECK(o.mask_type == "causal" || o.mask_type == "none" || o.mask_type == "custom",
              "mask_type must be 'causal', 'none' or 'custom', got '", o.mask_type, "'");
  m.kind = o.mask_type == "causal" ? MaskKind::kCausal
           : o.mask_type == "none" ? MaskKind::kNone
                                   : MaskKind::kCustom;
  TORCH_CHECK_VALUE(o.contextual_seq_len >= 0, "contextual_seq_len must be >= 0, got ",
                    o.contextual_seq_len);
  TORCH_CHECK_VALUE(o.max_attn_len >= 0, "max_attn_len must be >= 0, got ", o.max_attn_len);
  TORCH_CHECK_VALUE(o.target_group_size >= 1, "target_group_size must be >= 1, got ",
                    o.target_group_size);
  m.contextual_len = o.contextual_seq_len;
  m.max_attn_len = o.max_attn_len;
  m.target_group_size = o.target_group_size;
  if (o.num_targets.has_value()) {
    check_cpu(*o.num_targets, "num_targets");
    check_dim(*o.num_targets, 1, "num_targets");
    check_index_dtype(*o.num_targets, "num_targets");
    TORCH_CHECK(o.num_targets->numel() == seqs.count, "num_targets must have B = ", seqs.count,
                " entries, got ", o.num_targets->numel());
    p.num_targets = o.num_targets->to(at::kLong).contiguous();
    check_lengths_non_negative(p.num_targets, "num_targets");
    const int64_t* t = p.num_targets.const_data_ptr<int64_t>();
    for (int64_t b = 0; b < seqs.count; ++b) {
      TORCH_CHECK(t[b] <= seqs.keys.length[b], "num_targets[", b, "] = ", t[b],
                  " exceeds the length of sequence ", b, " (", seqs.keys.length[b], ")");
    }
  }
  TORCH_CHECK(m.kind == MaskKind::kCustom || !o.custom_mask.has_value(),
              "custom_mask contradicts mask_type '", o.mask_type,
              "': pass mask_type 'custom' to apply it, or no custom_mask");
  if (m.kind != MaskKind::kCustom) return p;
  TORCH_CHECK(o.custom_mask.has_value(), "mask_type 'custom' needs custom_mask");
  const at::Tensor& cm = *o.custom_mask;
  check_cpu(cm, "custom_mask");
  const int64_t n = seqs.max_len;
  TORCH_CHECK(cm.dim() == 4 && (cm.size(0) == 1 || cm.size(0) == seqs.count) &&
                  (cm.size(1) == 1 || cm.size(1) == heads) && cm.size(2) == n && cm.size(3) == n,
              "custom_mask must have shape [B or 1, H or 1, N, N] = [", seqs.count, ", ", heads,
              ", ", n, ", ", n, "], got ", cm.sizes());
  p.custom = cm.to(compute).contiguous();
  p.custom_stride_b = cm.size(0) == 1 ? 0 : p.custom.stride(0);
  p.custom_stride_h = cm.size(1) == 1 ? 0 : p.custom.stride(1);
  p.max_len = n;
  return p;
}

PreparedAttention prepare_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& seq_offsets,
                                    const std::optional<at::Tensor>& seq_lengths,
                                    const HstuOptions& options) {
  check_qkv(q, k, v);
  PreparedAttention a;
  a.rows = q.size(0);
  a.heads = q.size(1);
  a.compute = compute_dtype(q);
  check_finite(options.alpha, "alpha", a.compute);
  check_finite(options.silu_scale, "silu_scale", a.compute);
  a.seqs = prepare_sequences(a.rows, seq_offsets, seq_lengths, options.max_seq_len);
  a.mask = prepare_mask(options, a.seqs.view, a.heads, a.compute);
  return a;
}

PreparedBias prepare_dense_bias(const at::Tensor& bias, const char* name, const Sequences& seqs,
                                int64_t heads, at::ScalarType compute) {
  check_cpu(bias, name);
  check_floating(bias, name);
  const int64_t n = seqs.max_len;
  TORCH_CHECK(bias.dim() <= 4, name, " must be broadcastable to [B, H, N, N], got shape ",
              bias.sizes());
  std::vector<int64_t> shape(4 - bias.dim(), 1);
  shape.insert(shape.end(), bias.sizes().begin(), bias.sizes().end());
  const std::vector<int64_t> full{seqs.count, heads, n, n};
  for (int d = 0; d < 4; ++d) {
    TORCH_CHECK(shape[d] == 1 || shape[d] == full[d], name, " of shape ", bias.sizes(),
                " is not broadcastable to [B, H, N, N] = ", at::IntArrayRef(full));
  }
  const int64_t bb = shape[0], hb = shape[1];
  PreparedBias p;
  p.kind = BiasKind::kDense;
  p.dense = bias.reshape(shape).expand({bb, hb, n, n}).to(compute).contiguous();
  p.dense_stride_b = bb == 1 ? 0 : n * n * hb;
  p.dense_stride_h = hb == 1 ? 0 : n * n;
  p.max_len = n;
  return p;
}

namespace {

// The bucketizer of (divisor, num_buckets), built once per process: its tables take longer to
// build (a log per threshold search) than a serving step's whole attention. Bucketizers are
// immutable once built, so callers on any thread share them.
std::shared_ptr<const LogBucketizer> shared_bucketizer(double divisor, int32_t num_buckets) {
  static std::mutex mutex;
  static std::map<std::pair<double, int32_t>, std::shared_ptr<const LogBucketizer>> built;
  const std::lock_guard<std::mutex> lock(mutex);
  if (built.size() >= 64) built.clear();  // bounded, whatever divisors callers pass
  auto& bucketizer = built[{divisor, num_buckets}];
  if (!bucketizer) bucketizer = std::make_shared<const LogBucketizer>(divisor, num_buckets);
  return bucketizer;
}

}  // namespace

PreparedBias prepare_relative_bias(const std::optional<at::Tensor>& timestamps,
                                   const std::optional<at::Tensor>& ts_w,
                                   const std::optional<at::Tensor>& pos_w, bool query_time_shift,
                                   double bucket_divisor, const PreparedSequences& ps,
                                   at::ScalarType compute) {
  const Sequences& seqs = ps.view;
  const int64_t n = seqs.max_len;
  PreparedBias p;
  p.kind = BiasKind::kRelative;
  p.max_len = n;
  if (ts_w.has_value()) {
    check_cpu(*ts_w, "ts_w");
    check_dim(*ts_w, 1, "ts_w");
    check_floating(*ts_w, "ts_w");
    TORCH_CHECK(ts_w->numel() >= 1, "ts_w must have num_buckets + 1 >= 1 entries");
    check_bucket_divisor(bucket_divisor);
    p.ts_w = ts_w->to(compute).contiguous();
    p.buckets = shared_bucketizer(bucket_divisor, checked_num_buckets(ts_w->numel() - 1));
  }
  if (pos_w.has_value()) {
    check_cpu(*pos_w, "pos_w");
    check_dim(*pos_w, 1, "pos_w");
    check_floating(*pos_w, "pos_w");
    TORCH_CHECK(pos_w->numel() == 2 * n - 1, "pos_w must have 2 * max_seq_len - 1 = ", 2 * n - 1,
                " entries, got ", pos_w->numel());
    p.pos_w = pos_w->to(compute).contiguous();
  }
  TORCH_CHECK(ts_w.has_value() || !timestamps.has_value(),
              "timestamps are used only with ts_w (the time bias table): pass ts_w or drop "
              "timestamps");
  if (!ts_w.has_value()) return p;
  TORCH_CHECK(timestamps.has_value(), "ts_w needs timestamps");
  const at::Tensor& ts = *timestamps;
  check_cpu(ts, "timestamps");
  // Per-row key times; timestamps are [rows] aligned with k or [B, >= max length].
  const int64_t rows = ps.key_rows;
  if (ts.dim() == 1) {
    TORCH_CHECK(ts.numel() == rows, "1-D timestamps must have one entry per row of k (", rows,
                "), got ", ts.numel());
    p.key_time = ts.to(at::kDouble).contiguous();
  } else {
    TORCH_CHECK(ts.dim() == 2 && ts.size(0) == seqs.count,
                "timestamps must be [L] or [B, N] with B = ", seqs.count, ", got shape ",
                ts.sizes());
    const at::Tensor dense_ts = ts.to(at::kDouble).contiguous();
    p.key_time = at::zeros({rows}, dense_ts.options());
    double* out = p.key_time.mutable_data_ptr<double>();
    for (int64_t b = 0; b < seqs.count; ++b) {
      TORCH_CHECK(seqs.keys.length[b] <= ts.size(1), "timestamps has ", ts.size(1),
                  " columns but sequence ", b, " has length ", seqs.keys.length[b]);
      for (int64_t j = 0; j < seqs.keys.length[b]; ++j) {
        out[seqs.keys.row(b, j)] = dense_ts.const_data_ptr<double>()[b * ts.size(1) + j];
      }
    }
  }
  p.query_time = at::zeros({ps.query_rows}, p.key_time.options());
  query_times(seqs, p.key_time.const_data_ptr<double>(), query_time_shift,
              p.query_time.mutable_data_ptr<double>());
  return p;
}

BiasGradBuffers allocate_bias_grads(const PreparedBias& bias, at::ScalarType compute) {
  BiasGradBuffers b;
  const int64_t threads = at::get_num_threads();
  const auto options = at::TensorOptions().dtype(compute);
  if (bias.kind == BiasKind::kDense) {
    const bool one_copy = bias.dense_stride_b != 0;
    b.dense = at::zeros({one_copy ? 1 : threads, bias.dense.numel()}, options);
  } else if (bias.kind == BiasKind::kRelative) {
    const auto f64 = options.dtype(at::kDouble);
    if (bias.ts_w.defined()) b.ts_w = at::zeros({threads, bias.ts_w.numel()}, f64);
    if (bias.pos_w.defined()) b.pos_w = at::zeros({threads, bias.pos_w.numel()}, f64);
  }
  return b;
}

at::Tensor reduce_dense_bias_grad(const BiasGradBuffers& buffers, const PreparedBias& bias,
                                  const at::Tensor& original) {
  const at::Tensor summed = buffers.dense.sum(0).view(bias.dense.sizes());
  return at::sum_to(summed, original.sizes()).to(original.scalar_type());
}

at::Tensor reduce_table_grad(const at::Tensor& buffer, const at::Tensor& table) {
  return sum_partials(buffer, table.scalar_type());
}

namespace {

// An uninitialised tensor whose rows along `dim` in `gaps` are zero (the rows the kernels write
// no value to); zero throughout without gaps (nullopt: the kernels add into it).
at::Tensor zero_at_gaps(at::IntArrayRef shape, const at::TensorOptions& options,
                        const std::optional<kernels::RowGaps>& gaps, int64_t dim) {
  if (!gaps.has_value()) return at::zeros(shape, options);
  at::Tensor out = at::empty(shape, options);
  for (const auto& [begin, end] : *gaps) out.narrow(dim, begin, end - begin).zero_();
  return out;
}

}  // namespace

at::Tensor query_rows_output(at::IntArrayRef shape, const at::TensorOptions& options,
                             const kernels::Sequences& seqs) {
  return zero_at_gaps(shape, options, kernels::unwritten_query_rows(seqs, shape[0]), 0);
}

QkvGradBuffers::QkvGradBuffers(const at::Tensor& q, const at::Tensor& v, int64_t chunks,
                               const kernels::Sequences& seqs) {
  const int64_t rows = q.size(0), heads = q.size(1);
  const auto options = q.options().dtype(compute_dtype(q));
  dq = query_rows_output({rows, heads, q.size(2)}, options, seqs);
  const auto gaps = chunks == 1 ? kernels::unwritten_key_rows(seqs, rows) : std::nullopt;
  write_keys = gaps.has_value();
  dk = zero_at_gaps({chunks, rows, heads, q.size(2)}, options, gaps, 1);
  dv = zero_at_gaps({chunks, rows, heads, v.size(2)}, options, gaps, 1);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> QkvGradBuffers::reduce(const at::Tensor& q,
                                                                      const at::Tensor& k,
                                                                      const at::Tensor& v) const {
  return {dq.to(q.scalar_type()), sum_partials(dk, k.scalar_type()),
          sum_partials(dv, v.scalar_type())};
}

at::Tensor with_contiguous_rows(const at::Tensor& t) {
  // Size-1 dims may carry any stride. Rows closer than their width (broadcast or overlapping)
  // are copied: the BLAS takes no leading dimension below a row's width.
  const bool rows_contiguous =
      (t.size(2) <= 1 || t.stride(2) == 1) && (t.size(1) <= 1 || t.stride(1) == t.size(2));
  const bool rows_apart = t.size(0) <= 1 || t.stride(0) >= t.size(1) * t.size(2);
  return rows_contiguous && rows_apart ? t : t.contiguous();
}

bool Bf16Inputs::applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 &&
         v.scalar_type() == at::kBFloat16 && q.size(2) > 0 && v.size(2) > 0 &&
         kernels::bf16_tiles_available();
}

}  // namespace recops::attention

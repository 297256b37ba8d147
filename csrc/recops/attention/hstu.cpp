#include <ATen/Parallel.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/zeros.h>
#include <ATen/ExpandUtils.h>

#include <cmath>
#include <memory>

#include "recops/attention/kernels/hstu_attention.h"
#include "recops/attention/ops.h"
#include "recops/common/checks.h"
#include "recops/common/dispatch.h"

namespace recops::attention {
namespace {

using namespace kernels;

// Sequence b occupies rows [row_begin[b], row_begin[b] + length[b]) of q, k, v and the output.
struct PreparedSequences {
  at::Tensor row_begin, length;  // int64 [B]
  Sequences view;
};

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
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(length[b] <= max_seq_len, "sequence ", b, " has length ", length[b],
                " > max_seq_len = ", max_seq_len);
    TORCH_CHECK(begin[b] + length[b] <= rows, "sequence ", b, " ends at row ",
                begin[b] + length[b], " past the ", rows, " rows of q");
  }
  p.view = Sequences{batch, begin, length, max_seq_len};
  return p;
}

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    check_cpu(*t, name);
    check_dim(*t, 3, name);
    TORCH_CHECK(at::isFloatingType(t->scalar_type()), name,
                " must be float32, bfloat16, float16 or float64, got ", t->scalar_type());
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

template <typename T>
struct PreparedMask {
  at::Tensor num_targets, custom;
  MaskSource<T> source;
};

template <typename T>
PreparedMask<T> prepare_mask(const HstuOptions& o, const Sequences& seqs, int64_t heads) {
  PreparedMask<T> p;
  MaskSource<T>& m = p.source;
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
    const int64_t* t = p.num_targets.template const_data_ptr<int64_t>();
    for (int64_t b = 0; b < seqs.count; ++b) {
      TORCH_CHECK(t[b] <= seqs.length[b], "num_targets[", b, "] = ", t[b],
                  " exceeds the length of sequence ", b, " (", seqs.length[b], ")");
    }
    m.num_targets = t;
  }
  if (m.kind != MaskKind::kCustom) return p;
  TORCH_CHECK(o.custom_mask.has_value(), "mask_type 'custom' needs custom_mask");
  const at::Tensor& cm = *o.custom_mask;
  check_cpu(cm, "custom_mask");
  const int64_t n = seqs.max_len;
  TORCH_CHECK(cm.dim() == 4 && (cm.size(0) == 1 || cm.size(0) == seqs.count) &&
                  (cm.size(1) == 1 || cm.size(1) == heads) && cm.size(2) == n && cm.size(3) == n,
              "custom_mask must have shape [B or 1, H or 1, N, N] = [", seqs.count, ", ", heads,
              ", ", n, ", ", n, "], got ", cm.sizes());
  p.custom = cm.to(c10::CppTypeToScalarType<T>::value).contiguous();
  m.custom = p.custom.template const_data_ptr<T>();
  m.custom_stride_b = cm.size(0) == 1 ? 0 : p.custom.stride(0);
  m.custom_stride_h = cm.size(1) == 1 ? 0 : p.custom.stride(1);
  m.custom_stride_row = n;
  return p;
}

// HSTU's log bucketing as generative-recommenders computes it: torch.log on float32 |dt|
// (clamped to >= 1), divided by the divisor, truncated, clamped to [0, num_buckets].
int64_t log_time_bucket(double abs_dt, double divisor, int64_t num_buckets) {
  const float x = static_cast<float>(abs_dt < 1.0 ? 1.0 : abs_dt);
  const float bucket = std::log(x) / static_cast<float>(divisor);
  return std::clamp<int64_t>(static_cast<int64_t>(bucket), 0, num_buckets);
}

template <typename T>
struct PreparedBias {
  at::Tensor dense, key_time, query_time, ts_w, pos_w;
  std::unique_ptr<TimeBucketTable> table;
  BiasSource<T> source;
};

template <typename T>
PreparedBias<T> prepare_bias(const HstuOptions& o, const PreparedSequences& ps, int64_t rows,
                             int64_t heads) {
  constexpr at::ScalarType compute = c10::CppTypeToScalarType<T>::value;
  PreparedBias<T> p;
  BiasSource<T>& src = p.source;
  const Sequences& seqs = ps.view;
  const int64_t n = seqs.max_len;
  const bool fused = o.timestamps.has_value() || o.ts_w.has_value() || o.pos_w.has_value();
  TORCH_CHECK(!(fused && o.attn_bias.has_value()),
              "pass either attn_bias or the fused relative bias (timestamps, ts_w, pos_w), not both");
  if (o.attn_bias.has_value()) {
    const at::Tensor& bias = *o.attn_bias;
    check_cpu(bias, "attn_bias");
    TORCH_CHECK(bias.dim() <= 4, "attn_bias must be broadcastable to [B, H, N, N], got shape ",
                bias.sizes());
    std::vector<int64_t> shape(4 - bias.dim(), 1);
    shape.insert(shape.end(), bias.sizes().begin(), bias.sizes().end());
    const std::vector<int64_t> full{seqs.count, heads, n, n};
    for (int d = 0; d < 4; ++d) {
      TORCH_CHECK(shape[d] == 1 || shape[d] == full[d], "attn_bias of shape ", bias.sizes(),
                  " is not broadcastable to [B, H, N, N] = ", at::IntArrayRef(full));
    }
    const int64_t bb = shape[0], hb = shape[1];
    p.dense = bias.reshape(shape).expand({bb, hb, n, n}).to(compute).contiguous();
    src.kind = BiasKind::kDense;
    src.dense = p.dense.template const_data_ptr<T>();
    src.dense_stride_b = bb == 1 ? 0 : n * n * hb;
    src.dense_stride_h = hb == 1 ? 0 : n * n;
    src.dense_stride_row = n;
    return p;
  }
  if (!fused) return p;
  TORCH_CHECK(o.timestamps.has_value() && o.ts_w.has_value() && o.pos_w.has_value(),
              "the fused relative bias needs all of timestamps, ts_w and pos_w");
  const at::Tensor& ts = *o.timestamps;
  check_cpu(ts, "timestamps");
  check_dim(*o.ts_w, 1, "ts_w");
  check_dim(*o.pos_w, 1, "pos_w");
  TORCH_CHECK(o.ts_w->numel() >= 1, "ts_w must have num_buckets + 1 >= 1 entries");
  TORCH_CHECK(o.pos_w->numel() == 2 * n - 1, "pos_w must have 2 * max_seq_len - 1 = ", 2 * n - 1,
              " entries, got ", o.pos_w->numel());
  TORCH_CHECK_VALUE(o.bucket_divisor > 0, "bucket_divisor must be > 0, got ", o.bucket_divisor);
  // Per-row key times; timestamps are [rows] aligned with q or [B, >= max length].
  at::Tensor key_time;
  if (ts.dim() == 1) {
    TORCH_CHECK(ts.numel() == rows, "1-D timestamps must have one entry per row of q (", rows,
                "), got ", ts.numel());
    key_time = ts.to(at::kDouble).contiguous();
  } else {
    TORCH_CHECK(ts.dim() == 2 && ts.size(0) == seqs.count,
                "timestamps must be [L] or [B, N] with B = ", seqs.count, ", got shape ",
                ts.sizes());
    const at::Tensor dense_ts = ts.to(at::kDouble).contiguous();
    key_time = at::zeros({rows}, dense_ts.options());
    double* out = key_time.mutable_data_ptr<double>();
    for (int64_t b = 0; b < seqs.count; ++b) {
      TORCH_CHECK(seqs.length[b] <= ts.size(1), "timestamps has ", ts.size(1),
                  " columns but sequence ", b, " has length ", seqs.length[b]);
      std::copy_n(dense_ts.const_data_ptr<double>() + b * ts.size(1), seqs.length[b],
                  out + seqs.row_begin[b]);
    }
  }
  // Query times: the next item's time (HSTU / FuXi-alpha), the last position its own.
  at::Tensor query_time = key_time.clone();
  if (o.query_time_shift) {
    double* tq = query_time.mutable_data_ptr<double>();
    const double* t = key_time.const_data_ptr<double>();
    for (int64_t b = 0; b < seqs.count; ++b) {
      for (int64_t i = 0; i + 1 < seqs.length[b]; ++i) {
        tq[seqs.row_begin[b] + i] = t[seqs.row_begin[b] + i + 1];
      }
    }
  }
  p.key_time = key_time;
  p.query_time = query_time;
  p.ts_w = o.ts_w->to(compute).contiguous();
  p.pos_w = o.pos_w->to(compute).contiguous();
  const int64_t num_buckets = o.ts_w->numel() - 1;
  const double divisor = o.bucket_divisor;
  p.table = std::make_unique<TimeBucketTable>(
      [&](double x) { return log_time_bucket(x, divisor, num_buckets); });
  src.kind = BiasKind::kRelative;
  src.key_time = p.key_time.template const_data_ptr<double>();
  src.query_time = p.query_time.template const_data_ptr<double>();
  src.ts_w = p.ts_w.template const_data_ptr<T>();
  src.pos_w = p.pos_w.template const_data_ptr<T>();
  src.buckets = p.table.get();
  return p;
}

template <typename T>
HstuShape<T> make_shape(const at::Tensor& q, const at::Tensor& v, const HstuOptions& o) {
  return HstuShape<T>{q.size(1), q.size(2), v.size(2), static_cast<T>(o.alpha),
                      static_cast<T>(o.silu_scale)};
}

// q, k, v converted to the compute type (float64 stays float64, everything else runs in fp32).
template <typename T>
struct ComputeInputs {
  at::Tensor q, k, v;
  HstuTensors<T> view() const {
    return HstuTensors<T>{q.const_data_ptr<T>(), k.const_data_ptr<T>(), v.const_data_ptr<T>()};
  }
};

template <typename T>
ComputeInputs<T> to_compute(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  constexpr at::ScalarType compute = c10::CppTypeToScalarType<T>::value;
  return {q.to(compute).contiguous(), k.to(compute).contiguous(), v.to(compute).contiguous()};
}

}  // namespace

at::Tensor hstu_dense_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& seq_offsets,
                              const std::optional<at::Tensor>& seq_lengths,
                              const HstuOptions& options) {
  check_qkv(q, k, v);
  const int64_t rows = q.size(0);
  const PreparedSequences seqs =
      prepare_sequences(rows, seq_offsets, seq_lengths, options.max_seq_len);
  return dispatch_compute_type(q.scalar_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const PreparedMask<T> mask = prepare_mask<T>(options, seqs.view, q.size(1));
    const PreparedBias<T> bias = prepare_bias<T>(options, seqs, rows, q.size(1));
    const ComputeInputs<T> in = to_compute<T>(q, k, v);
    at::Tensor out = at::zeros({rows, q.size(1), v.size(2)}, in.q.options());
    hstu_forward(seqs.view, make_shape<T>(q, v, options), in.view(), mask.source, bias.source,
                 choose_chunks(seqs.view.count, at::get_num_threads()), out.mutable_data_ptr<T>());
    return out.to(q.scalar_type());
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>,
           std::optional<at::Tensor>, std::optional<at::Tensor>>
hstu_dense_backward(const at::Tensor& grad_output, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v, const at::Tensor& seq_offsets,
                    const std::optional<at::Tensor>& seq_lengths, const HstuOptions& options) {
  check_qkv(q, k, v);
  check_cpu(grad_output, "grad_output");
  TORCH_CHECK(grad_output.dim() == 3 && grad_output.size(0) == q.size(0) &&
                  grad_output.size(1) == q.size(1) && grad_output.size(2) == v.size(2),
              "grad_output must have the output's shape [L, H, Dv] = [", q.size(0), ", ",
              q.size(1), ", ", v.size(2), "], got ", grad_output.sizes());
  const int64_t rows = q.size(0), heads = q.size(1);
  const PreparedSequences seqs =
      prepare_sequences(rows, seq_offsets, seq_lengths, options.max_seq_len);
  return dispatch_compute_type(q.scalar_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const PreparedMask<T> mask = prepare_mask<T>(options, seqs.view, heads);
    const PreparedBias<T> bias = prepare_bias<T>(options, seqs, rows, heads);
    const ComputeInputs<T> in = to_compute<T>(q, k, v);
    const at::Tensor grad_out = grad_output.to(in.q.scalar_type()).contiguous();
    const int64_t chunks = choose_chunks(seqs.view.count, at::get_num_threads());
    const int64_t threads = at::get_num_threads();
    const auto opts = in.q.options();
    at::Tensor dq = at::zeros({rows, heads, q.size(2)}, opts);
    at::Tensor dk = at::zeros({chunks, rows, heads, q.size(2)}, opts);
    at::Tensor dv = at::zeros({chunks, rows, heads, v.size(2)}, opts);
    HstuGrads<T> grads{dq.mutable_data_ptr<T>(), dk.mutable_data_ptr<T>(),
                       dv.mutable_data_ptr<T>(), rows, {}};
    at::Tensor d_dense, d_ts, d_pos;  // per-thread partial sums
    if (bias.source.kind == BiasKind::kDense) {
      d_dense = at::zeros({threads, bias.dense.numel()}, opts);
      grads.bias.dense = d_dense.mutable_data_ptr<T>();
      grads.bias.dense_thread_stride = bias.dense.numel();
    } else if (bias.source.kind == BiasKind::kRelative) {
      d_ts = at::zeros({threads, bias.ts_w.numel()}, opts.dtype(at::kDouble));
      d_pos = at::zeros({threads, bias.pos_w.numel()}, opts.dtype(at::kDouble));
      grads.bias.ts_w = d_ts.mutable_data_ptr<double>();
      grads.bias.ts_thread_stride = bias.ts_w.numel();
      grads.bias.pos_w = d_pos.mutable_data_ptr<double>();
      grads.bias.pos_thread_stride = bias.pos_w.numel();
    }
    hstu_backward(seqs.view, make_shape<T>(q, v, options), in.view(),
                  grad_out.const_data_ptr<T>(), mask.source, bias.source, chunks, grads);

    std::optional<at::Tensor> grad_bias, grad_ts_w, grad_pos_w;
    if (d_dense.defined()) {
      const at::Tensor& b = *options.attn_bias;
      grad_bias =
          at::sum_to(d_dense.sum(0).view(bias.dense.sizes()), b.sizes()).to(b.scalar_type());
    }
    if (d_ts.defined()) {
      grad_ts_w = d_ts.sum(0).to(options.ts_w->scalar_type());
      grad_pos_w = d_pos.sum(0).to(options.pos_w->scalar_type());
    }
    return std::make_tuple(dq.to(q.scalar_type()), dk.sum(0).to(k.scalar_type()),
                           dv.sum(0).to(v.scalar_type()), grad_bias, grad_ts_w, grad_pos_w);
  });
}

}  // namespace recops::attention

#include <ATen/Parallel.h>

#include <type_traits>
#include <utility>

#include "recops/common/checks.h"
#include "recops/hstu/delta.h"
#include "recops/hstu/inputs.h"
#include "recops/hstu/kernels/hstu_attention.h"
#include "recops/hstu/ops.h"

namespace recops::attention {
namespace {

using namespace kernels;

// The time and position channels' sources: dense ts_bias [B, N, N] / pos_bias [1, N, N], or the
// fused tables; an absent source drops its channel.
struct FuxiBiases {
  PreparedBias time, position;
};

PreparedBias prepare_channel_bias(const std::optional<at::Tensor>& dense, const char* dense_name,
                                  const char* table_name, const std::optional<at::Tensor>& table,
                                  bool is_time, const FuxiOptions& o, const PreparedSequences& seqs,
                                  at::ScalarType compute) {
  TORCH_CHECK(!(dense.has_value() && table.has_value()), "pass either ", dense_name, " or ",
              table_name, ", not both");
  if (dense.has_value()) {
    // The position bias depends on positions only: one [N, N] table for the whole batch. The
    // channel's [N, N] is never broadcast: a [1, 1, N] bias is not a bias of N query rows.
    const int64_t n = seqs.view.max_len;
    TORCH_CHECK(dense->dim() == 3 && (is_time || dense->size(0) == 1) && dense->size(1) == n &&
                    dense->size(2) == n,
                dense_name, " must be 3-D ", is_time ? "[B or 1, N, N]" : "[1, N, N]",
                ", got shape ", dense->sizes(), " (N = max_seq_len = ", n, ")");
    return prepare_dense_bias(dense->unsqueeze(1), dense_name, seqs.view, 1, compute);
  }
  if (!table.has_value()) return PreparedBias{};
  const HstuOptions& b = o.base;
  return is_time ? prepare_relative_bias(b.timestamps, table, std::nullopt, b.query_time_shift,
                                         b.bucket_divisor, seqs, compute)
                 : prepare_relative_bias(std::nullopt, std::nullopt, table, b.query_time_shift,
                                         b.bucket_divisor, seqs, compute);
}

FuxiBiases prepare_fuxi_biases(const FuxiOptions& o, const PreparedSequences& seqs,
                               at::ScalarType compute) {
  TORCH_CHECK(!o.base.attn_bias.has_value(),
              "FuXi-alpha attention takes ts_bias / pos_bias or "
              "ts_w / pos_w, not attn_bias");
  TORCH_CHECK(o.base.ts_w.has_value() || !o.base.timestamps.has_value(),
              "timestamps are used only with ts_w (the time bias table): pass ts_w or drop "
              "timestamps");
  return {
      prepare_channel_bias(o.ts_bias, "ts_bias", "ts_w", o.base.ts_w, true, o, seqs, compute),
      prepare_channel_bias(o.pos_bias, "pos_bias", "pos_w", o.base.pos_w, false, o, seqs, compute)};
}

// Channel-major [semantic | time | position] (each H * Dv), or per head [position, time,
// semantic] (the FuXi-alpha reference); absent channels take no space.
ChannelLayout make_layout(const FuxiBiases& biases, int64_t heads, int64_t dv, bool reference) {
  const bool present[3] = {true, biases.time.kind != BiasKind::kNone,
                           biases.position.kind != BiasKind::kNone};
  const int64_t channels = present[0] + present[1] + present[2];
  ChannelLayout layout;
  layout.row_stride = channels * heads * dv;
  layout.head_stride = reference ? channels * dv : dv;
  const int order[3] = {2, 1, 0};  // reference order: position, time, semantic
  int64_t slot = 0;
  for (int k = 0; k < 3; ++k) {
    const int c = reference ? order[k] : k;
    layout.channel_offset[c] = present[c] ? (reference ? slot * dv : slot * heads * dv) : -1;
    slot += present[c];
  }
  return layout;
}

// The shared preparation of the FuXi-alpha forward and backward (and of a delta step's).
struct PreparedFuxi {
  PreparedAttention attention;
  FuxiBiases biases;
  ChannelLayout layout;

  PreparedFuxi(PreparedAttention prepared, const at::Tensor& v, const FuxiOptions& options)
      : attention(std::move(prepared)),
        biases(prepare_fuxi_biases(options, attention.seqs, attention.compute)),
        layout(make_layout(biases, attention.heads, v.size(-1), options.reference_layout)) {}
  PreparedFuxi(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               const at::Tensor& seq_offsets, const std::optional<at::Tensor>& seq_lengths,
               const FuxiOptions& options)
      : PreparedFuxi(prepare_attention(q, k, v, seq_offsets, seq_lengths, options.base), v,
                     options) {}
};

// The forward of prepared sequences: [query rows, channels * H * Dv].
at::Tensor fuxi_forward_of(const PreparedFuxi& prepared, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v, const FuxiOptions& options) {
  const PreparedAttention& a = prepared.attention;
  const FuxiBiases& biases = prepared.biases;
  const ChannelLayout& layout = prepared.layout;
  const int64_t rows = a.rows;
  const int64_t chunks = choose_chunks(a.seqs.view.count, at::get_num_threads());
  return with_precision(
      q, k, v, a.seqs.view, options.base, false, false, [&](const auto& prec, auto dtype) {
        using P = std::decay_t<decltype(prec)>;
        using C = typename P::Compute;
        at::Tensor out =
            query_rows_output({rows, layout.row_stride}, q.options().dtype(dtype), a.seqs.view);
        hstu_forward(prec, a.mask.source<C>(),
                     {{{}, biases.time.source<C>(), biases.position.source<C>()}}, chunks, layout,
                     elements_of<typename P::Element>(out));
        return out.to(q.scalar_type());
      });
}

}  // namespace

at::Tensor hstu_dense_forward_fuxi(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& seq_offsets,
                                   const std::optional<at::Tensor>& seq_lengths,
                                   const FuxiOptions& options) {
  return fuxi_forward_of(PreparedFuxi(q, k, v, seq_offsets, seq_lengths, options), q, k, v,
                         options);
}

at::Tensor fuxi_delta_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const DeltaKeys& keys, const FuxiOptions& options) {
  const DeltaAttention d = prepare_delta_attention(q, k, v, keys, options.base);
  FuxiOptions delta_options = options;
  delta_options.base = d.options;
  return fuxi_forward_of(PreparedFuxi(d.attention, d.v, delta_options), q, d.k, d.v, delta_options);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>,
           std::optional<at::Tensor>, std::optional<at::Tensor>>
hstu_dense_backward_fuxi(const at::Tensor& grad_output, const at::Tensor& q, const at::Tensor& k,
                         const at::Tensor& v, const at::Tensor& seq_offsets,
                         const std::optional<at::Tensor>& seq_lengths, const FuxiOptions& options) {
  check_cpu(grad_output, "grad_output");
  check_floating(grad_output, "grad_output");
  const PreparedFuxi prepared(q, k, v, seq_offsets, seq_lengths, options);
  const PreparedAttention& a = prepared.attention;
  const FuxiBiases& biases = prepared.biases;
  const ChannelLayout& layout = prepared.layout;
  const int64_t rows = a.rows;
  TORCH_CHECK(grad_output.dim() == 2 && grad_output.size(0) == rows &&
                  grad_output.size(1) == layout.row_stride,
              "grad_output must have the output's shape [L, channels * H * Dv] = [", rows, ", ",
              layout.row_stride, "], got ", grad_output.sizes());
  const BiasGradBuffers time_grads = allocate_bias_grads(biases.time, a.compute);
  const BiasGradBuffers position_grads = allocate_bias_grads(biases.position, a.compute);
  const int64_t chunks = choose_chunks(a.seqs.view.count, at::get_num_threads());
  const QkvGradBuffers qkv_grads(q, v, chunks, a.seqs.view);
  with_precision(
      q, k, v, a.seqs.view, options.base, true, false, [&](const auto& prec, auto dtype) {
        using P = std::decay_t<decltype(prec)>;
        using C = typename P::Compute;
        const at::Tensor grad_out = grad_output.to(dtype).contiguous();
        HstuGrads<C> grads;
        grads.qkv = qkv_grads.view<C>();
        grads.bias[kTime] = time_grads.sinks<C>();
        grads.bias[kPosition] = position_grads.sinks<C>();
        hstu_backward(prec, elements_of<typename P::Element>(grad_out), a.mask.source<C>(),
                      {{{}, biases.time.source<C>(), biases.position.source<C>()}}, chunks, layout,
                      grads);
      });
  auto [dq, dk, dv] = qkv_grads.reduce(q, k, v);
  std::optional<at::Tensor> d_ts_bias, d_pos_bias, d_ts_w, d_pos_w;
  if (options.ts_bias.has_value()) {
    d_ts_bias =
        reduce_dense_bias_grad(time_grads, biases.time, options.ts_bias->unsqueeze(1)).squeeze(1);
  } else if (options.base.ts_w.has_value()) {
    d_ts_w = reduce_table_grad(time_grads.ts_w, *options.base.ts_w);
  }
  if (options.pos_bias.has_value()) {
    d_pos_bias =
        reduce_dense_bias_grad(position_grads, biases.position, options.pos_bias->unsqueeze(1))
            .squeeze(1);
  } else if (options.base.pos_w.has_value()) {
    d_pos_w = reduce_table_grad(position_grads.pos_w, *options.base.pos_w);
  }
  return std::make_tuple(dq, dk, dv, d_ts_bias, d_pos_bias, d_ts_w, d_pos_w);
}

}  // namespace recops::attention

#include <ATen/Parallel.h>
#include <ATen/ops/zeros.h>

#include <type_traits>

#include "recops/common/checks.h"
#include "recops/hstu/delta.h"
#include "recops/hstu/inputs.h"
#include "recops/hstu/kernels/hstu_attention.h"
#include "recops/hstu/ops.h"

namespace recops::attention {
namespace {

using namespace kernels;

PreparedBias prepare_hstu_bias(const HstuOptions& o, const PreparedSequences& seqs, int64_t heads,
                               at::ScalarType compute) {
  const bool fused = o.timestamps.has_value() || o.ts_w.has_value() || o.pos_w.has_value();
  TORCH_CHECK(
      !(fused && o.attn_bias.has_value()),
      "pass either attn_bias or the fused relative bias (timestamps, ts_w, pos_w), not both");
  if (o.attn_bias.has_value()) {
    return prepare_dense_bias(*o.attn_bias, "attn_bias", seqs.view, heads, compute);
  }
  if (!fused) return PreparedBias{};
  TORCH_CHECK(o.timestamps.has_value() && o.ts_w.has_value() && o.pos_w.has_value(),
              "the fused relative bias needs all of timestamps, ts_w and pos_w");
  return prepare_relative_bias(*o.timestamps, o.ts_w, o.pos_w, o.query_time_shift, o.bucket_divisor,
                               seqs, compute);
}

// The forward of prepared sequences (a training step's, or a delta step's): [query rows, H, Dv].
at::Tensor hstu_forward_of(const PreparedAttention& a, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v, const HstuOptions& options) {
  const PreparedSequences& seqs = a.seqs;
  const PreparedBias bias = prepare_hstu_bias(options, seqs, a.heads, a.compute);
  const int64_t chunks = choose_chunks(seqs.view.count, at::get_num_threads());
  return with_precision(
      q, k, v, seqs.view, options, false, true, [&](const auto& prec, auto dtype) {
        using P = std::decay_t<decltype(prec)>;
        using C = typename P::Compute;
        at::Tensor out =
            query_rows_output({a.rows, a.heads, v.size(-1)}, q.options().dtype(dtype), seqs.view);
        hstu_forward(prec, a.mask.source<C>(), {bias.source<C>()}, chunks,
                     ChannelLayout::heads(a.heads, v.size(-1)),
                     elements_of<typename P::Element>(out));
        return out.to(q.scalar_type());
      });
}

}  // namespace

at::Tensor hstu_dense_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& seq_offsets,
                              const std::optional<at::Tensor>& seq_lengths,
                              const HstuOptions& options) {
  return hstu_forward_of(prepare_attention(q, k, v, seq_offsets, seq_lengths, options), q, k, v,
                         options);
}

at::Tensor hstu_delta_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const DeltaKeys& keys, const HstuOptions& options) {
  const DeltaAttention d = prepare_delta_attention(q, k, v, keys, options);
  return hstu_forward_of(d.attention, q, d.k, d.v, d.options);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>,
           std::optional<at::Tensor>>
hstu_dense_backward(const at::Tensor& grad_output, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v, const at::Tensor& seq_offsets,
                    const std::optional<at::Tensor>& seq_lengths, const HstuOptions& options) {
  check_qkv(q, k, v);
  check_cpu(grad_output, "grad_output");
  check_floating(grad_output, "grad_output");
  TORCH_CHECK(grad_output.dim() == 3 && grad_output.size(0) == q.size(0) &&
                  grad_output.size(1) == q.size(1) && grad_output.size(2) == v.size(2),
              "grad_output must have the output's shape [L, H, Dv] = [", q.size(0), ", ", q.size(1),
              ", ", v.size(2), "], got ", grad_output.sizes());
  const PreparedAttention a = prepare_attention(q, k, v, seq_offsets, seq_lengths, options);
  const PreparedSequences& seqs = a.seqs;
  const PreparedMask& mask = a.mask;
  const PreparedBias bias = prepare_hstu_bias(options, seqs, a.heads, a.compute);
  const BiasGradBuffers bias_grads = allocate_bias_grads(bias, a.compute);
  const int64_t chunks = choose_chunks(seqs.view.count, at::get_num_threads());
  const QkvGradBuffers qkv_grads(q, v, chunks, seqs.view);
  with_precision(q, k, v, seqs.view, options, true, false, [&](const auto& prec, auto dtype) {
    using P = std::decay_t<decltype(prec)>;
    using C = typename P::Compute;
    const at::Tensor grad_out = grad_output.to(dtype).contiguous();
    HstuGrads<C> grads;
    grads.qkv = qkv_grads.view<C>();
    grads.bias[kSemantic] = bias_grads.sinks<C>();
    hstu_backward(prec, elements_of<typename P::Element>(grad_out), mask.source<C>(),
                  {bias.source<C>()}, chunks, ChannelLayout::heads(a.heads, v.size(2)), grads);
  });
  auto [dq, dk, dv] = qkv_grads.reduce(q, k, v);
  std::optional<at::Tensor> grad_bias, grad_ts_w, grad_pos_w;
  if (bias.kind == BiasKind::kDense) {
    grad_bias = reduce_dense_bias_grad(bias_grads, bias, *options.attn_bias);
  } else if (bias.kind == BiasKind::kRelative) {
    grad_ts_w = reduce_table_grad(bias_grads.ts_w, *options.ts_w);
    grad_pos_w = reduce_table_grad(bias_grads.pos_w, *options.pos_w);
  }
  return std::make_tuple(dq, dk, dv, grad_bias, grad_ts_w, grad_pos_w);
}

}  // namespace recops::attention

#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>

#include "recops/attention/attention_inputs.h"
#include "recops/attention/ops.h"
#include "recops/common/checks.h"

namespace recops::attention {
namespace {

using namespace kernels;

PreparedBias prepare_hstu_bias(const HstuOptions& o, const PreparedSequences& seqs, int64_t rows,
                               int64_t heads, at::ScalarType compute) {
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
                               seqs, rows, compute);
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
  return dispatch_compute_type(q, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const PreparedMask mask = prepare_mask(options, seqs.view, q.size(1), compute_dtype(q));
    const PreparedBias bias = prepare_hstu_bias(options, seqs, rows, q.size(1), compute_dtype(q));
    const ComputeInputs<T> in = to_compute<T>(q, k, v);
    at::Tensor out = at::zeros({rows, q.size(1), v.size(2)}, in.q.options());
    hstu_forward(seqs.view, make_shape<T>(q, v, options), in.view(), mask.source<T>(),
                 bias.source<T>(), choose_chunks(seqs.view), out.mutable_data_ptr<T>());
    return out.to(q.scalar_type());
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>,
           std::optional<at::Tensor>>
hstu_dense_backward(const at::Tensor& grad_output, const at::Tensor& q, const at::Tensor& k,
                    const at::Tensor& v, const at::Tensor& seq_offsets,
                    const std::optional<at::Tensor>& seq_lengths, const HstuOptions& options) {
  check_qkv(q, k, v);
  check_cpu(grad_output, "grad_output");
  TORCH_CHECK(grad_output.dim() == 3 && grad_output.size(0) == q.size(0) &&
                  grad_output.size(1) == q.size(1) && grad_output.size(2) == v.size(2),
              "grad_output must have the output's shape [L, H, Dv] = [", q.size(0), ", ", q.size(1),
              ", ", v.size(2), "], got ", grad_output.sizes());
  const int64_t rows = q.size(0), heads = q.size(1);
  const PreparedSequences seqs =
      prepare_sequences(rows, seq_offsets, seq_lengths, options.max_seq_len);
  return dispatch_compute_type(q, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const PreparedMask mask = prepare_mask(options, seqs.view, heads, compute_dtype(q));
    const PreparedBias bias = prepare_hstu_bias(options, seqs, rows, heads, compute_dtype(q));
    const ComputeInputs<T> in = to_compute<T>(q, k, v);
    const at::Tensor grad_out = grad_output.to(in.q.scalar_type()).contiguous();
    const int64_t chunks = choose_chunks(seqs.view);
    const int64_t threads = at::get_num_threads();
    const auto opts = in.q.options();
    at::Tensor dq = at::zeros({rows, heads, q.size(2)}, opts);
    at::Tensor dk = at::zeros({chunks, rows, heads, q.size(2)}, opts);
    at::Tensor dv = at::zeros({chunks, rows, heads, v.size(2)}, opts);
    HstuGrads<T> grads{
        dq.mutable_data_ptr<T>(), dk.mutable_data_ptr<T>(), dv.mutable_data_ptr<T>(), rows, {}};
    at::Tensor d_dense, d_ts, d_pos;  // per-thread partial sums
    if (bias.kind == BiasKind::kDense) {
      // With a batch dim, each gradient row has one writer: no per-thread copies.
      const bool one_copy = bias.dense_stride_b != 0;
      d_dense = at::zeros({one_copy ? 1 : threads, bias.dense.numel()}, opts);
      grads.bias.dense = d_dense.mutable_data_ptr<T>();
      grads.bias.dense_thread_stride = one_copy ? 0 : bias.dense.numel();
    } else if (bias.kind == BiasKind::kRelative) {
      d_ts = at::zeros({threads, bias.ts_w.numel()}, opts.dtype(at::kDouble));
      d_pos = at::zeros({threads, bias.pos_w.numel()}, opts.dtype(at::kDouble));
      grads.bias.ts_w = d_ts.mutable_data_ptr<double>();
      grads.bias.ts_thread_stride = bias.ts_w.numel();
      grads.bias.pos_w = d_pos.mutable_data_ptr<double>();
      grads.bias.pos_thread_stride = bias.pos_w.numel();
    }
    hstu_backward(seqs.view, make_shape<T>(q, v, options), in.view(), grad_out.const_data_ptr<T>(),
                  mask.source<T>(), bias.source<T>(), chunks, grads);

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

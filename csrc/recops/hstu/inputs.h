// Validation and preparation of the inputs shared by the HSTU-family adapters (HSTU, FuXi-alpha):
// sequence layout, q/k/v, mask and bias sources, converted to the kernels' compute type.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <type_traits>

#include "recops/common/dispatch.h"
#include "recops/hstu/kernels/bf16_products.h"
#include "recops/hstu/kernels/fp32_products.h"
#include "recops/hstu/ops.h"

namespace recops::attention {

// Sequence b occupies rows [row_begin[b], row_begin[b] + length[b]) of q, k, v and the output;
// a delta step (delta.cpp) adds its query rows and, for a paged cache, the page table.
struct PreparedSequences {
  at::Tensor row_begin, length;          // int64 [B]
  at::Tensor q_row_begin, q_length;      // int64 [B], when queries are not the key rows
  at::Tensor pages;                      // int64 [B, pages], when the keys are paged
  int64_t key_rows = 0, query_rows = 0;  // of k / v and of q / the output
  kernels::Sequences view;
};

PreparedSequences prepare_sequences(int64_t rows, const at::Tensor& seq_offsets,
                                    const std::optional<at::Tensor>& seq_lengths,
                                    int64_t max_seq_len);

// q, k [L, H, Dqk] and v [L, H, Dv] of one floating dtype.
void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

struct PreparedMask {
  kernels::MaskKind kind = kernels::MaskKind::kCausal;
  int64_t contextual_len = 0, target_group_size = 1, max_attn_len = 0;
  at::Tensor num_targets, custom;  // int64 [B]; compute-type [Bm, Hm, N, N]
  int64_t custom_stride_b = 0, custom_stride_h = 0, max_len = 0;

  template <typename T>
  kernels::MaskSource<T> source() const {
    kernels::MaskSource<T> m;
    m.kind = kind;
    m.contextual_len = contextual_len;
    m.target_group_size = target_group_size;
    m.max_attn_len = max_attn_len;
    m.num_targets = num_targets.defined() ? num_targets.const_data_ptr<int64_t>() : nullptr;
    if (custom.defined()) {
      m.custom = custom.const_data_ptr<T>();
      m.custom_stride_b = custom_stride_b;
      m.custom_stride_h = custom_stride_h;
      m.custom_stride_row = max_len;
    }
    return m;
  }
};

PreparedMask prepare_mask(const HstuOptions& options, const kernels::Sequences& seqs, int64_t heads,
                          at::ScalarType compute);

// What every HSTU-family adapter prepares first: q, k, v checked, the sequences and the mask.
struct PreparedAttention {
  int64_t rows = 0, heads = 0;
  at::ScalarType compute = at::kFloat;
  PreparedSequences seqs;
  PreparedMask mask;
};

PreparedAttention prepare_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& seq_offsets,
                                    const std::optional<at::Tensor>& seq_lengths,
                                    const HstuOptions& options);

// A bias source: dense [Bb, Hb, N, N] or relative (time and/or position tables).
struct PreparedBias {
  kernels::BiasKind kind = kernels::BiasKind::kNone;
  at::Tensor dense;  // compute type, [Bb, Hb, N, N]
  int64_t dense_stride_b = 0, dense_stride_h = 0, max_len = 0;
  at::Tensor key_time, query_time, ts_w, pos_w;  // ts_w / pos_w undefined when unused
  std::shared_ptr<const kernels::LogBucketizer> buckets;

  template <typename T>
  kernels::BiasSource<T> source() const {
    kernels::BiasSource<T> s;
    s.kind = kind;
    if (dense.defined()) {
      s.dense = dense.const_data_ptr<T>();
      s.dense_stride_b = dense_stride_b;
      s.dense_stride_h = dense_stride_h;
      s.dense_stride_row = max_len;
    }
    if (kind == kernels::BiasKind::kRelative) {
      s.key_time = key_time.defined() ? key_time.const_data_ptr<double>() : nullptr;
      s.query_time = query_time.defined() ? query_time.const_data_ptr<double>() : nullptr;
      s.ts_w = ts_w.defined() ? ts_w.const_data_ptr<T>() : nullptr;
      s.pos_w = pos_w.defined() ? pos_w.const_data_ptr<T>() : nullptr;
      if (buckets) s.buckets = buckets->view();
    }
    return s;
  }
};

// A dense bias broadcastable to [B, H, N, N] (`name` appears in error messages).
PreparedBias prepare_dense_bias(const at::Tensor& bias, const char* name,
                                const kernels::Sequences& seqs, int64_t heads,
                                at::ScalarType compute);

// The relative bias of docs/ops.md section 3 from timestamps ([rows of k] aligned with k, or
// [B, >= N]);
// either table may be absent (FuXi-alpha's time and position channels use one each), and
// timestamps are needed only with ts_w.
PreparedBias prepare_relative_bias(const std::optional<at::Tensor>& timestamps,
                                   const std::optional<at::Tensor>& ts_w,
                                   const std::optional<at::Tensor>& pos_w, bool query_time_shift,
                                   double bucket_divisor, const PreparedSequences& seqs,
                                   at::ScalarType compute);

// Gradient buffers of one bias source: per-thread partial sums (or one shared copy for a dense
// bias with a batch dim, whose gradient rows each have one writer), reduced afterwards.
struct BiasGradBuffers {
  at::Tensor dense, ts_w, pos_w;  // [copies, numel]; ts_w / pos_w in float64

  template <typename T>
  kernels::BiasGrads<T> sinks() const {
    kernels::BiasGrads<T> g;
    if (dense.defined()) {
      g.dense = dense.mutable_data_ptr<T>();
      g.dense_thread_stride = dense.size(0) == 1 ? 0 : dense.size(1);
    }
    if (ts_w.defined()) {
      g.ts_w = ts_w.mutable_data_ptr<double>();
      g.ts_thread_stride = ts_w.size(1);
    }
    if (pos_w.defined()) {
      g.pos_w = pos_w.mutable_data_ptr<double>();
      g.pos_thread_stride = pos_w.size(1);
    }
    return g;
  }
};

BiasGradBuffers allocate_bias_grads(const PreparedBias& bias, at::ScalarType compute);

// The summed gradient of a dense bias in the shape and dtype of `original`.
at::Tensor reduce_dense_bias_grad(const BiasGradBuffers& buffers, const PreparedBias& bias,
                                  const at::Tensor& original);

// The summed gradient of a table (ts_w / pos_w buffer) in the dtype of `table`.
at::Tensor reduce_table_grad(const at::Tensor& buffer, const at::Tensor& table);

// bf16 q, k, v (contiguous) for the bf16 tile kernels, which run when every one of q, k, v is
// bf16 and bf16_tiles_available(); otherwise the adapters compute in fp32 (ComputeInputs).
// t when its rows ([H, D]) are contiguous, however far apart (a slice of a wider projection:
// the kernels read it in place, kernels::Rows), else a contiguous copy.
at::Tensor with_contiguous_rows(const at::Tensor& t);

// The kernels' view of an input with contiguous rows (with_contiguous_rows); a single row's
// stride may be anything, so it is given the row's width.
template <typename E>
kernels::Rows<E> rows_of(const at::Tensor& t, const E* data) {
  return {data, t.size(0) <= 1 ? t.size(1) * t.size(2) : t.stride(0)};
}

struct Bf16Inputs {
  at::Tensor q, k, v;
  static bool applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);
  Bf16Inputs(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in)
      : q(with_contiguous_rows(q_in)),
        k(with_contiguous_rows(k_in)),
        v(with_contiguous_rows(v_in)) {}
  kernels::Bf16Tensors view() const {
    return {rows_of(q, bits(q)), rows_of(k, bits(k)), rows_of(v, bits(v))};
  }
  kernels::HstuShape<float> shape(const HstuOptions& o) const {
    return {q.size(1), q.size(2), v.size(2), static_cast<float>(o.alpha),
            static_cast<float>(o.silu_scale)};
  }
  static const uint16_t* bits(const at::Tensor& t) {
    return reinterpret_cast<const uint16_t*>(t.const_data_ptr<at::BFloat16>());
  }
};

// q, k, v converted to the compute type T, with contiguous rows.
template <typename T>
struct ComputeInputs {
  at::Tensor q, k, v;
  ComputeInputs(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in)
      : q(with_contiguous_rows(q_in.to(c10::CppTypeToScalarType<T>::value))),
        k(with_contiguous_rows(k_in.to(c10::CppTypeToScalarType<T>::value))),
        v(with_contiguous_rows(v_in.to(c10::CppTypeToScalarType<T>::value))) {}
  kernels::HstuTensors<T> view() const {
    return {rows_of(q, q.const_data_ptr<T>()), rows_of(k, k.const_data_ptr<T>()),
            rows_of(v, v.const_data_ptr<T>())};
  }
  kernels::HstuShape<T> shape(const HstuOptions& o) const {
    return {q.size(1), q.size(2), v.size(2), static_cast<T>(o.alpha), static_cast<T>(o.silu_scale)};
  }
};

// The kernels' elements of a tensor: bf16 as bit patterns, else the tensor's own type.
template <typename E>
E* elements_of(const at::Tensor& t) {
  if constexpr (std::is_same_v<E, uint16_t>) {
    return reinterpret_cast<uint16_t*>(t.mutable_data_ptr<at::BFloat16>());
  } else {
    return t.mutable_data_ptr<E>();
  }
}

// The one place the HSTU-family adapters choose the kernels' precision: fn(precision, dtype)
// with the bf16 policy where Bf16Inputs applies, else the fp32 policy in the compute type of q
// (dtype: the precision's element dtype, of the output and of dO). may_fuse: the bf16 forward may
// run on fused AMX tiles (HSTU).
template <typename Fn>
decltype(auto) with_precision(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const kernels::Sequences& seqs, const HstuOptions& options,
                              bool backward, bool may_fuse, Fn&& fn) {
  if (Bf16Inputs::applies(q, k, v)) {
    const Bf16Inputs in(q, k, v);
    return fn(kernels::Bf16Precision(seqs, in.shape(options), in.view(), backward, may_fuse),
              at::kBFloat16);
  }
  return dispatch_compute_type(q.scalar_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ComputeInputs<T> in(q, k, v);
    return fn(kernels::Fp32Precision<T>(seqs, in.shape(options), in.view(), backward),
              c10::CppTypeToScalarType<T>::value);
  });
}

// A [query rows, ...] output of the kernels (the attention's output, dQ): uninitialised but for
// the rows no block writes (kernels::unwritten_query_rows), which are zero; zero throughout when
// two sequences share a query row.
at::Tensor query_rows_output(at::IntArrayRef shape, const at::TensorOptions& options,
                             const kernels::Sequences& seqs);

// dQ, and dK / dV as per-chunk partials, in the compute type of q.
struct QkvGradBuffers {
  at::Tensor dq, dk, dv;
  bool write_keys = false;  // kernels::QkvGrads::write_keys
  // dK and dV zeroed, or with one chunk and no key row in two sequences (unwritten_key_rows)
  // left for the items to write but for the rows none writes.
  QkvGradBuffers(const at::Tensor& q, const at::Tensor& v, int64_t chunks,
                 const kernels::Sequences& seqs);
  template <typename T>
  kernels::QkvGrads<T> view() const {
    return {dq.mutable_data_ptr<T>(),
            dk.mutable_data_ptr<T>(),
            dv.mutable_data_ptr<T>(),
            dq.size(0),
            dq.size(1),
            dq.size(2),
            dv.size(3),
            write_keys};
  }
  // (dq, dk, dv) summed over chunks, in the dtypes of q, k, v.
  std::tuple<at::Tensor, at::Tensor, at::Tensor> reduce(const at::Tensor& q, const at::Tensor& k,
                                                        const at::Tensor& v) const;
};

}  // namespace recops::attention

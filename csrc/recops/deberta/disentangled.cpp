// ATen adapter of DeBERTa disentangled attention (docs/ops.md section 6): validation, the relative-
// position index table, masks, the kernel's element type (bf16 runs the bf16-operand kernel where
// the CPU has bf16 dot products, else it computes in fp32 as fp16 and fp32 do; float64 in double)
// and the per-chunk / per-thread partial gradients of the kernel.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "recops/common/checks.h"
#include "recops/common/dispatch.h"
#include "recops/common/partials.h"
#include "recops/deberta/kernels/deberta_positions.h"
#include "recops/deberta/kernels/disentangled_attention.h"
#include "recops/deberta/kernels/disentangled_attention_bf16.h"
#include "recops/deberta/ops.h"

namespace recops::attention {
namespace {

using namespace kernels;

// Everything about a call that does not depend on the compute type.
struct Geometry {
  int64_t batch, heads, q_len, k_len, dqk, dv;
  bool c2p = false, p2c = false;
  int64_t span = 0;  // position tables have 2 * span rows
  double scale = 1.0;
};

void parse_pos_att_type(const std::string& spec, Geometry* g) {
  size_t begin = 0;
  while (begin <= spec.size()) {
    size_t end = spec.find('|', begin);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(begin, end - begin);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (item == "c2p") {
      g->c2p = true;
    } else if (item == "p2c") {
      g->p2c = true;
    } else {
      TORCH_CHECK_VALUE(item.empty(),
                        "pos_att_type must be a '|'-separated subset of {c2p, p2c}, got '", spec,
                        "'");
    }
    begin = end + 1;
  }
}

// HF's bucket of a distance beyond bucket_size / 2 divides by
// log((max_position - 1) / (bucket_size / 2)): zero or negative otherwise.
void check_log_buckets(int64_t bucket_size, int64_t max_position, const char* bucket_name,
                       const char* max_name) {
  TORCH_CHECK_VALUE(bucket_size >= 2 && max_position > bucket_size / 2 + 1,
                    "log-bucketed positions need ", bucket_name, " >= 2 and ", max_name, " > ",
                    bucket_name, " / 2 + 1, got ", bucket_size, " and ", max_position);
}

void check_position_table(const std::optional<at::Tensor>& table, const char* name,
                          const char* term, const Geometry& g, const at::Tensor& q) {
  TORCH_CHECK(table.has_value(), "pos_att_type contains '", term, "' but ", name, " is None");
  check_cpu(*table, name);
  check_same_dtype(q, "q", *table, name);
  TORCH_CHECK(table->dim() == 3 && table->size(0) == 2 * g.span && table->size(1) == g.heads &&
                  table->size(2) == g.dqk,
              name, " must have shape [2 * span, H, d] = [", 2 * g.span, ", ", g.heads, ", ", g.dqk,
              "] (span = position_buckets if > 0, else max_relative_positions), got ",
              table->sizes());
}

Geometry validate(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const std::optional<at::Tensor>& pos_key,
                  const std::optional<at::Tensor>& pos_query, const DisentangledOptions& o) {
  for (const auto& [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}}) {
    check_cpu(*t, name);
    TORCH_CHECK(t->dim() == 4, name, " must be 4-D [B, H, S, d], got shape ", t->sizes());
    check_floating(*t, name);
  }
  check_same_dtype(q, "q", k, "k");
  check_same_dtype(q, "q", v, "v");
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(1) == q.size(1) &&
                  v.size(1) == q.size(1),
              "q, k and v must share batch and head dims [B, H], got ", q.sizes(), ", ", k.sizes(),
              " and ", v.sizes());
  TORCH_CHECK(k.size(3) == q.size(3), "q and k must have the same head dim, got ", q.size(3),
              " and ", k.size(3));
  TORCH_CHECK(v.size(2) == k.size(2), "k and v must have the same length, got ", k.size(2), " and ",
              v.size(2));
  Geometry g{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
  parse_pos_att_type(o.pos_att_type, &g);
  const int terms = int(g.c2p) + int(g.p2c);
  TORCH_CHECK_VALUE(o.dropout_p >= 0.0 && o.dropout_p <= 1.0, "dropout_p must be in [0, 1], got ",
                    o.dropout_p);
  if (o.scale.has_value()) check_finite(*o.scale, "scale", compute_dtype(q));
  g.scale = o.scale.has_value() ? *o.scale : 1.0 / std::sqrt(double(g.dqk) * (1 + terms));
  if (terms == 0) return g;
  const int64_t buckets = o.position_buckets, max_pos = o.max_relative_positions;
  g.span = buckets > 0 ? buckets : max_pos;
  TORCH_CHECK_VALUE(g.span >= 1,
                    "position terms need position_buckets > 0 or max_relative_positions > 0, got ",
                    buckets, " and ", max_pos);
  // position_buckets > 0 asks for log buckets, whose formula needs max_relative_positions: HF's
  // module puts max_position_embeddings there when its config's value is below 1, so a value
  // below the precondition here is a caller's mistake, not a request for identity positions.
  if (buckets > 0)
    check_log_buckets(buckets, max_pos, "position_buckets", "max_relative_positions");
  TORCH_CHECK_VALUE(g.span < std::numeric_limits<int32_t>::max() / (2 * kKeyTile),
                    "position_buckets / max_relative_positions give a span of ", g.span,
                    " positions, too large for the kernel's int32 position index");
  if (g.c2p) check_position_table(pos_key, "pos_key", "c2p", g, q);
  if (g.p2c) check_position_table(pos_query, "pos_query", "p2c", g, q);
  return g;
}

struct PreparedMask {
  at::Tensor keep;  // uint8: [B, S] padding or [B, Sq, Sk] dense; undefined without a mask
  std::vector<int64_t> q_extent, k_extent;
  std::vector<uint8_t> padding_holes;
  DisentangledMask view;
};

// Index one past the last nonzero of each row of a [B, n] uint8 tensor.
std::vector<int64_t> extents(const at::Tensor& any) {
  const int64_t rows = any.size(0), n = any.size(1);
  const uint8_t* a = any.const_data_ptr<uint8_t>();
  std::vector<int64_t> out(rows, 0);
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t i = n; i > 0; --i) {
      if (a[b * n + i - 1] != 0) {
        out[b] = i;
        break;
      }
    }
  }
  return out;
}

PreparedMask prepare_mask(const std::optional<at::Tensor>& mask, const Geometry& g) {
  PreparedMask p;
  if (!mask.has_value()) {
    p.q_extent.assign(g.batch, g.q_len);
    p.k_extent.assign(g.batch, g.k_len);
  } else {
    const at::Tensor& m = *mask;
    check_cpu(m, "attention_mask");
    TORCH_CHECK(!at::isComplexType(m.scalar_type()),
                "attention_mask must be bool, integer or floating, got ", m.scalar_type());
    if (m.dim() == 2) {
      TORCH_CHECK(m.size(0) == g.batch && m.size(1) == g.k_len && g.q_len == g.k_len,
                  "a 2-D attention_mask is a padding mask [B, S] = [", g.batch, ", ", g.k_len,
                  "] for q and k of one length S (else pass [B, 1, Sq, Sk]), got ", m.sizes(),
                  " with Sq = ", g.q_len);
      p.keep = m.ne(0).to(at::kByte).contiguous();
      p.q_extent = extents(p.keep);
      p.k_extent = p.q_extent;
      const uint8_t* keep = p.keep.const_data_ptr<uint8_t>();
      for (int64_t b = 0; b < g.batch; ++b) {
        const uint8_t* row = keep + b * g.k_len;
        p.padding_holes.push_back(std::find(row, row + p.q_extent[b], 0) != row + p.q_extent[b]);
      }
      p.view.padding = keep;
      p.view.padding_holes = p.padding_holes.data();
    } else {
      TORCH_CHECK(m.dim() == 4 && m.size(0) == g.batch && m.size(1) == 1 && m.size(2) == g.q_len &&
                      m.size(3) == g.k_len,
                  "attention_mask must be [B, S] or [B, 1, Sq, Sk] = [", g.batch, ", 1, ", g.q_len,
                  ", ", g.k_len, "], got ", m.sizes());
      p.keep = m.ne(0).to(at::kByte).reshape({g.batch, g.q_len, g.k_len}).contiguous();
      p.q_extent = extents(p.keep.amax(2).contiguous());
      p.k_extent = extents(p.keep.amax(1).contiguous());
      p.view.dense = p.keep.const_data_ptr<uint8_t>();
    }
  }
  p.view.q_extent = p.q_extent.data();
  p.view.k_extent = p.k_extent.data();
  return p;
}

// Whether the call runs the bf16-operand kernel: bf16 inputs, head dims it can pad, and the CPU's
// bf16 micro-kernel (bf16_tiles_available: AVX512_BF16, oneDNN, and RECOPS_CPU_ISA allowing
// AVX-512). Otherwise bf16 computes in fp32, on converted copies of the inputs.
bool runs_bf16_kernel(const at::Tensor& q, const Geometry& g) {
  return q.scalar_type() == at::kBFloat16 && g.dqk > 0 && g.dv > 0 && bf16_tiles_available();
}

// Calls fn(TypeTag<E>{}) with the kernel's element type E: Bf16 (runs_bf16_kernel), else the
// compute type (float or double).
template <typename Fn>
decltype(auto) dispatch_element_type(const at::Tensor& q, const Geometry& g, Fn&& fn) {
  if (runs_bf16_kernel(q, g)) return fn(TypeTag<Bf16>{});
  return dispatch_compute_type(q.scalar_type(), fn);
}

// Inputs in the kernel's element type E with the kernel's view of them.
template <typename E>
struct Prepared {
  at::Tensor q, k, v, pos_key, pos_query;
  std::vector<int32_t> delta;  // kernels::relative_position_index
  PreparedMask mask;
  DisentangledProblem<E> problem;
};

template <typename E>
void prepare(Prepared<E>& p, const Geometry& g, const at::Tensor& q, const at::Tensor& k,
             const at::Tensor& v, const std::optional<at::Tensor>& pos_key,
             const std::optional<at::Tensor>& pos_query,
             const std::optional<at::Tensor>& attention_mask, const DisentangledOptions& o) {
  using T = accumulate_t<E>;
  constexpr at::ScalarType dtype = scalar_type_of<E>();
  p.q = q.to(dtype).contiguous();
  p.k = k.to(dtype).contiguous();
  p.v = v.to(dtype).contiguous();
  p.mask = prepare_mask(attention_mask, g);
  DisentangledProblem<E>& d = p.problem;
  d.shape = DisentangledShape<T>{g.batch, g.heads, g.q_len,    g.k_len,
                                 g.dqk,   g.dv,    2 * g.span, static_cast<T>(g.scale),
                                 g.c2p,   g.p2c};
  d.q = data_as<E>(p.q);
  d.k = data_as<E>(p.k);
  d.v = data_as<E>(p.v);
  if (g.c2p) {
    p.pos_key = pos_key->to(dtype).contiguous();
    d.pos_key = data_as<E>(p.pos_key);
  }
  if (g.p2c) {
    p.pos_query = pos_query->to(dtype).contiguous();
    d.pos_query = data_as<E>(p.pos_query);
  }
  if ((g.c2p || g.p2c) && g.q_len > 0 && g.k_len > 0) {
    const int64_t keys = position_index_keys(g.k_len);
    p.delta.resize(g.q_len + keys - 1);
    relative_position_index(g.q_len, keys, o.position_buckets, o.max_relative_positions, g.span,
                            p.delta.data());
    d.delta = p.delta.data();
  }
  d.mask = p.mask.view;
  d.dropout_p = static_cast<T>(o.dropout_p);
  d.seed = static_cast<uint64_t>(o.seed);
}

}  // namespace

at::Tensor deberta_log_bucket_position(const at::Tensor& relative_pos, int64_t bucket_size,
                                       int64_t max_position) {
  check_cpu(relative_pos, "relative_pos");
  check_index_dtype(relative_pos, "relative_pos");
  check_log_buckets(bucket_size, max_position, "bucket_size", "max_position");
  const at::Tensor rel = relative_pos.to(at::kLong).contiguous();
  at::Tensor out = at::empty(rel.sizes(), rel.options());
  log_bucket_positions(rel.const_data_ptr<int64_t>(), rel.numel(), bucket_size, max_position,
                       out.mutable_data_ptr<int64_t>());
  return out;
}

std::tuple<at::Tensor, at::Tensor, std::optional<at::Tensor>> disentangled_attention_forward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& pos_key, const std::optional<at::Tensor>& pos_query,
    const std::optional<at::Tensor>& attention_mask, const DisentangledOptions& options,
    bool return_probs) {
  const Geometry g = validate(q, k, v, pos_key, pos_query, options);
  return dispatch_element_type(q, g, [&](auto tag) {
    using E = typename decltype(tag)::type;
    using T = accumulate_t<E>;
    Prepared<E> p;
    prepare(p, g, q, k, v, pos_key, pos_query, attention_mask, options);
    const auto compute = q.options().dtype(scalar_type_of<T>());
    at::Tensor out = at::zeros({g.batch, g.heads, g.q_len, g.dv}, p.q.options());
    at::Tensor lse =
        at::full({g.batch, g.heads, g.q_len}, std::numeric_limits<double>::infinity(), compute);
    at::Tensor probs;
    if (return_probs) probs = at::zeros({g.batch, g.heads, g.q_len, g.k_len}, compute);
    DisentangledOutputs<E> o{mutable_data_as<E>(out), mutable_data_as<T>(lse),
                             return_probs ? mutable_data_as<T>(probs) : nullptr};
    disentangled_forward(p.problem, choose_chunks(g.batch * g.heads, at::get_num_threads()), o);
    std::optional<at::Tensor> probs_out;
    if (return_probs) probs_out = probs.to(q.scalar_type());
    return std::make_tuple(out.to(q.scalar_type()), lse, probs_out);
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>, std::optional<at::Tensor>>
disentangled_attention_backward(
    const at::Tensor& grad_output, const std::optional<at::Tensor>& grad_probs, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& pos_key,
    const std::optional<at::Tensor>& pos_query, const std::optional<at::Tensor>& attention_mask,
    const at::Tensor& output, const at::Tensor& softmax_lse, const std::optional<at::Tensor>& probs,
    const DisentangledOptions& options) {
  const Geometry g = validate(q, k, v, pos_key, pos_query, options);
  for (const auto& [t, name] : {std::pair{&grad_output, "grad_output"}, {&output, "output"}}) {
    check_cpu(*t, name);
    check_floating(*t, name);
  }
  check_cpu(softmax_lse, "softmax_lse");
  TORCH_CHECK(softmax_lse.scalar_type() == compute_dtype(q),
              "softmax_lse must be the forward's log-sum-exp, in ", compute_dtype(q), ", got ",
              softmax_lse.scalar_type());
  for (const auto& [t, name] : {std::pair{&grad_probs, "grad_probs"}, {&probs, "probs"}}) {
    if (!t->has_value()) continue;
    check_cpu(**t, name);
    check_floating(**t, name);
  }
  const std::vector<int64_t> out_shape{g.batch, g.heads, g.q_len, g.dv};
  TORCH_CHECK(grad_output.sizes() == at::IntArrayRef(out_shape) &&
                  output.sizes() == at::IntArrayRef(out_shape),
              "grad_output and output must have the output's shape ", at::IntArrayRef(out_shape),
              ", got ", grad_output.sizes(), " and ", output.sizes());
  TORCH_CHECK(softmax_lse.sizes() == at::IntArrayRef({g.batch, g.heads, g.q_len}),
              "softmax_lse must have shape [B, H, Sq], got ", softmax_lse.sizes());
  if (grad_probs.has_value()) {
    const std::vector<int64_t> probs_shape{g.batch, g.heads, g.q_len, g.k_len};
    TORCH_CHECK(probs.has_value() && probs->sizes() == at::IntArrayRef(probs_shape) &&
                    grad_probs->sizes() == at::IntArrayRef(probs_shape),
                "grad_probs needs the returned probs, both of shape ",
                at::IntArrayRef(probs_shape));
  }
  return dispatch_element_type(q, g, [&](auto tag) {
    using E = typename decltype(tag)::type;
    using T = accumulate_t<E>;
    constexpr at::ScalarType dtype = scalar_type_of<E>();
    Prepared<E> p;
    prepare(p, g, q, k, v, pos_key, pos_query, attention_mask, options);
    const at::Tensor go = grad_output.to(dtype).contiguous();
    const at::Tensor out = output.to(dtype).contiguous();
    const at::Tensor lse = softmax_lse.contiguous();
    at::Tensor gp, pr;
    if (grad_probs.has_value()) {
      gp = grad_probs->to(dtype).contiguous();
      pr = probs->to(dtype).contiguous();
    }
    const int64_t chunks = choose_chunks(g.batch * g.heads, at::get_num_threads());
    const int64_t threads = at::get_num_threads();
    const auto compute = q.options().dtype(scalar_type_of<T>());
    at::Tensor dq = at::zeros({g.batch, g.heads, g.q_len, g.dqk}, p.q.options());
    at::Tensor dk = at::zeros({chunks, g.batch, g.heads, g.k_len, g.dqk}, compute);
    at::Tensor dv = at::zeros({chunks, g.batch, g.heads, g.k_len, g.dv}, compute);
    at::Tensor dpk, dpq;
    DisentangledGrads<E> grads{mutable_data_as<E>(dq), mutable_data_as<T>(dk),
                               mutable_data_as<T>(dv)};
    if (g.c2p) {
      dpk = at::zeros({threads, 2 * g.span, g.heads, g.dqk}, compute);
      grads.dpos_key = mutable_data_as<T>(dpk);
    }
    if (g.p2c) {
      dpq = at::zeros({threads, 2 * g.span, g.heads, g.dqk}, compute);
      grads.dpos_query = mutable_data_as<T>(dpq);
    }
    const DisentangledBackwardInputs<E> in{.grad_out = data_as<E>(go),
                                           .grad_probs = gp.defined() ? data_as<E>(gp) : nullptr,
                                           .probs = pr.defined() ? data_as<E>(pr) : nullptr,
                                           .out = data_as<E>(out),
                                           .lse = data_as<T>(lse)};
    disentangled_backward(p.problem, chunks, in, grads);
    std::optional<at::Tensor> grad_pos_key, grad_pos_query;
    if (g.c2p) grad_pos_key = sum_partials(dpk, pos_key->scalar_type());
    if (g.p2c) grad_pos_query = sum_partials(dpq, pos_query->scalar_type());
    return std::make_tuple(dq.to(q.scalar_type()), sum_partials(dk, k.scalar_type()),
                           sum_partials(dv, v.scalar_type()), grad_pos_key, grad_pos_query);
  });
}

}  // namespace recops::attention

// The sampled softmax loss over shared negatives (loss_kernels.h's SampledSoftmaxProblem), fused:
// per block of kRowBlock query rows, one product of the block with the normalised negatives, the
// masked log-sum-exp of each row with its positive's logit, and the weighted loss; the [M, R]
// logits are never stored. Asked for the gradients too, the same pass turns a block's
// exp(logit - max) into the softmax's coefficients in place, then dq = C N^ (+ the positive's
// term), dN^ += C^T Q, and the normalisations' backwards: the training step's backward then only
// scales them (ops.cpp), instead of computing the logits a second time. The blocks' operands are
// padded to whole brgemm granules (common/blas.h's granules), so that the products take the
// micro-kernel at the models' d = 50. Float64 computes in double, every other dtype in fp32; the
// sums over rows run in fixed_chunks chunks of blocks added in chunk order, so results are the
// same bits for any thread count.
#pragma once

#include "recops/common/kernels/transpose_tile.h"
#include "recops/loss/kernels/loss_kernels.h"

namespace recops::loss::kernels::RECOPS_ISA_NS {

using ::recops::RECOPS_ISA_NS::transpose_tile;

constexpr int64_t kRowBlock = 64;

template <typename T>
RECOPS_ALWAYS_INLINE accumulate_t<T> compute_value(T v) {
  return static_cast<accumulate_t<T>>(v);
}

// A row's L2 normalisation y = x / scale, scale = max(|x|, eps), in the rows' compute type C (a
// sum of squares has no cancellation to guard against); `through` when |x| >= eps (the norm's
// gradient passes; below eps the clamp stops it).
template <typename C>
struct RowScale {
  C scale;
  bool through;
};

template <typename T, typename C = accumulate_t<T>>
RowScale<C> row_scale(const T* x, int64_t n, double eps) {
  const C norm = std::sqrt(lane_sum<C>(n, [x](int64_t j) {
    const C v = compute_value(x[j]);
    return v * v;
  }));
  const C floor = static_cast<C>(eps);
  return norm >= floor ? RowScale<C>{norm, true} : RowScale<C>{floor, false};
}

// dx of y = x / max(|x|, eps) from dy: (dy - y (y . dy)) / scale, or dy / eps below eps.
template <typename T, typename C>
void normalize_backward(const T* x, int64_t n, const RowScale<C>& s, const C* dy, T* dx) {
  const C inverse_scale = C(1) / s.scale;
  C y_dy = C(0);
  if (s.through) {
    y_dy = lane_sum<C>(n, [&](int64_t j) { return compute_value(x[j]) * inverse_scale * dy[j]; });
  }
  for (int64_t j = 0; j < n; ++j) {
    const C y = compute_value(x[j]) * inverse_scale;
    dx[j] = T((dy[j] - y * y_dy) * inverse_scale);
  }
}

// The normalised negatives N^ in C, zero-padded to granules: as rows [R, ld_dim] (the right
// operand of dq = C N^) and transposed [d, ld_count] (of the logits Q N^T).
template <typename T, typename C = accumulate_t<T>>
struct Negatives {
  int64_t ld_dim, ld_count;
  std::vector<RowScale<C>> scales;
  std::vector<C> rows, transposed;
  // (id, index) of every negative, by id: the negatives a row masks, found by its positive's id
  // (a compare per logit of the 64-bit ids ran as long as the row's product).
  std::vector<std::pair<int64_t, int64_t>> by_id;

  explicit Negatives(const SampledSoftmaxProblem<T>& p)
      : ld_dim(granules(p.dim)),
        ld_count(granules(p.negatives)),
        scales(static_cast<size_t>(p.negatives)),
        rows(static_cast<size_t>(p.negatives * ld_dim), C(0)),
        transposed(static_cast<size_t>(p.dim * ld_count), C(0)) {
    by_id.reserve(static_cast<size_t>(p.negatives));
    for (int64_t j = 0; j < p.negatives; ++j) {
      const T* n = p.negative_rows + j * p.ld_negatives;
      scales[j] = row_scale(n, p.dim, p.eps);
      for (int64_t d = 0; d < p.dim; ++d) {
        const C v = compute_value(n[d]) / scales[j].scale;
        rows[j * ld_dim + d] = v;
        transposed[d * ld_count + j] = v;
      }
      by_id.emplace_back(p.negative_ids[j], j);
    }
    std::sort(by_id.begin(), by_id.end());
  }

  // fn(j) for each negative j whose id is `id`.
  template <typename Fn>
  void for_each_with_id(int64_t id, Fn&& fn) const {
    auto it = std::lower_bound(by_id.begin(), by_id.end(), std::pair<int64_t, int64_t>{id, 0});
    for (; it != by_id.end() && it->first == id; ++it) fn(it->second);
  }
};

// What a thread keeps for its blocks: the block's queries in C, their positive logits and
// normalisations, the [rows, R] exp(logit - m) of the negatives, and for the gradients the
// block's dq and the coefficients transposed. A block's products run on granules(rows) rows,
// those past its rows zero in the queries (so zero in what the products write).
template <typename T, typename C = accumulate_t<T>>
struct Block {
  const SampledSoftmaxProblem<T>& p;
  const Negatives<T>& negatives;
  std::vector<C> queries, exps, positive_logit, max_logit, normaliser;
  std::vector<RowScale<C>> positive_scales;
  std::vector<C> dq, coefficients_t, positive_coefficient, dpos;

  Block(const SampledSoftmaxProblem<T>& problem, const Negatives<T>& n, bool gradients)
      : p(problem),
        negatives(n),
        queries(static_cast<size_t>(kRowBlock * n.ld_dim), C(0)),
        exps(static_cast<size_t>(kRowBlock * n.ld_count), C(0)),
        positive_logit(kRowBlock),
        max_logit(kRowBlock),
        normaliser(kRowBlock),
        positive_scales(kRowBlock) {
    if (!gradients) return;
    dq.resize(static_cast<size_t>(kRowBlock * n.ld_dim));
    coefficients_t.resize(static_cast<size_t>(n.ld_count * kRowBlock));
    positive_coefficient.resize(kRowBlock);
    dpos.resize(static_cast<size_t>(problem.dim));
  }

  // For rows [r0, r0 + n): exp(logit - m) of the negatives, with per row its maximum logit m (the
  // positive's included) and the sum of exp(logit - m) over the positive and the negatives.
  void compute(int64_t r0, int64_t n) {
    const int64_t dim = p.dim, count = p.negatives, ld_dim = negatives.ld_dim;
    const int64_t ld_count = negatives.ld_count;
    const C inverse_t = static_cast<C>(1.0 / p.temperature);
    for (int64_t i = 0; i < n; ++i) {
      const T* q = p.queries + (r0 + i) * p.ld_queries;
      const T* pos = p.positives + (r0 + i) * p.ld_positives;
      C* qc = queries.data() + i * ld_dim;
      for (int64_t d = 0; d < dim; ++d) qc[d] = compute_value(q[d]);
      positive_scales[i] = row_scale(pos, dim, p.eps);
      const C dot = lane_sum<C>(dim, [&](int64_t d) { return qc[d] * compute_value(pos[d]); });
      positive_logit[i] = dot / positive_scales[i].scale * inverse_t;
    }
    const int64_t padded = granules(n);
    std::fill(queries.begin() + n * ld_dim, queries.begin() + padded * ld_dim, C(0));
    gemm_nn_any_shape(padded, count, dim, queries.data(), ld_dim, negatives.transposed.data(),
                      ld_count, exps.data(), ld_count, false);
    for (int64_t i = 0; i < n; ++i) {
      C* row = exps.data() + i * ld_count;
      for (int64_t j = 0; j < count; ++j) row[j] *= inverse_t;
      negatives.for_each_with_id(p.positive_ids[r0 + i],
                                 [row](int64_t j) { row[j] = static_cast<C>(kNotANegative); });
      // Vector reductions (their lanes' order is the instruction set's, as in the attention's
      // softmax); scalar ones ran at a third of the loss's time.
      C m = positive_logit[i];
#pragma omp simd reduction(max : m)
      for (int64_t j = 0; j < count; ++j) m = row[j] > m ? row[j] : m;
      max_logit[i] = m;
      normaliser[i] = exp_row_generic(row, count, m) + softmax_exp(positive_logit[i] - m);
    }
  }

  // Row i's loss: log(sum of exp(logits)) - its positive's logit.
  double loss(int64_t i) const {
    return static_cast<double>(max_logit[i]) + std::log(static_cast<double>(normaliser[i])) -
           static_cast<double>(positive_logit[i]);
  }

  // After compute(r0, n): the gradients of the loss (grad_output 1, total weight `weight`) of the
  // block's queries and positives into grads, its negatives' (of N^, [R, ld_dim]) added into
  // dn_hat. exp(logit - m) <- C, d(loss) / d(q . n^_j) = w_i / W * softmax_j / T, 0 for a masked
  // negative; the positive's coefficient (softmax_0 - 1) scaled alike.
  void gradients(int64_t r0, int64_t n, double weight, const SampledSoftmaxGrads<T>& grads,
                 C* dn_hat) {
    const int64_t dim = p.dim, count = p.negatives, ld_dim = negatives.ld_dim;
    const int64_t ld_count = negatives.ld_count, padded = granules(n);
    for (int64_t i = 0; i < n; ++i) {
      const C scale = static_cast<C>(p.weights[r0 + i] / weight / p.temperature);
      const C m = max_logit[i], inverse_z = C(1) / normaliser[i];
      positive_coefficient[i] = scale * (softmax_exp(positive_logit[i] - m) * inverse_z - C(1));
      C* row = exps.data() + i * ld_count;
      const C coefficient = scale * inverse_z;
      for (int64_t j = 0; j < count; ++j) row[j] *= coefficient;
      negatives.for_each_with_id(p.positive_ids[r0 + i], [row](int64_t j) { row[j] = C(0); });
    }
    gemm_nn_any_shape(padded, dim, count, exps.data(), ld_count, negatives.rows.data(), ld_dim,
                      dq.data(), ld_dim, false);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = r0 + i;
      const C cp = positive_coefficient[i];
      const T* pos = p.positives + r * p.ld_positives;
      const RowScale<C>& ps = positive_scales[i];
      const C inverse_scale = C(1) / ps.scale;
      const C* qc = queries.data() + i * ld_dim;
      T* gq = grads.queries + r * dim;
      for (int64_t d = 0; d < dim; ++d) {
        const C p_hat = compute_value(pos[d]) * inverse_scale;
        gq[d] = T(dq[i * ld_dim + d] + cp * p_hat);
        dpos[d] = cp * qc[d];
      }
      normalize_backward(pos, dim, ps, dpos.data(), grads.positives + r * dim);
    }
    // The rows past the block's are zero in exps (zero queries) and in the queries.
    transpose_tile(exps.data(), padded, count, ld_count, coefficients_t.data(), kRowBlock);
    gemm_nn_any_shape(count, dim, padded, coefficients_t.data(), kRowBlock, queries.data(), ld_dim,
                      dn_hat, ld_dim, true);
  }
};

template <typename T>
LossSums sampled_softmax(const SampledSoftmaxProblem<T>& p, const SampledSoftmaxGrads<T>* grads) {
  using C = accumulate_t<T>;
  const Negatives<T> negatives(p);
  const int64_t dim = p.dim, count = p.negatives, ld_dim = negatives.ld_dim;
  double weight = 0;
  for (int64_t i = 0; i < p.rows; ++i) weight += p.weights[i];
  const int64_t blocks = (p.rows + kRowBlock - 1) / kRowBlock;
  const int64_t chunks = fixed_chunks(blocks);
  std::vector<double> losses(static_cast<size_t>(chunks), 0.0);
  // Per chunk, d(loss) / dN^ [R, ld_dim].
  std::vector<C> partial(grads == nullptr ? 0 : static_cast<size_t>(chunks * count * ld_dim), C(0));
  for_each_chunk(blocks, chunks, [&](int64_t chunk, int64_t b0, int64_t b1) {
    SingleThreadedBlas blas;
    Block<T> block(p, negatives, grads != nullptr);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kRowBlock, n = std::min(kRowBlock, p.rows - r0);
      block.compute(r0, n);
      for (int64_t i = 0; i < n; ++i) losses[chunk] += p.weights[r0 + i] * block.loss(i);
      if (grads != nullptr) {
        block.gradients(r0, n, weight, *grads, partial.data() + chunk * count * ld_dim);
      }
    }
  });
  LossSums sums{0.0, weight};
  for (const double loss : losses) sums.weighted_loss += loss;
  if (grads == nullptr) return sums;
  std::vector<C> d_hat(static_cast<size_t>(dim));
  for (int64_t j = 0; j < count; ++j) {
    for (int64_t d = 0; d < dim; ++d) {
      C s = C(0);
      for (int64_t k = 0; k < chunks; ++k) s += partial[(k * count + j) * ld_dim + d];
      d_hat[d] = s;
    }
    normalize_backward(p.negative_rows + j * p.ld_negatives, dim, negatives.scales[j], d_hat.data(),
                       grads->negatives + j * dim);
  }
  return sums;
}

}  // namespace recops::loss::kernels::RECOPS_ISA_NS

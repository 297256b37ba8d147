// The sampled softmax loss over shared negatives (loss_kernels.h's SampledSoftmaxProblem), fused:
// per block of kRowBlock query rows, one product of the block with the normalised negatives, the
// masked log-sum-exp of each row with its positive's logit, and the weighted loss; the [M, R]
// logits are never stored. The backward recomputes a block's exp(logit - max) and turns them into
// the softmax's coefficients in place, then dq = C N^ (+ the positive's term), dN^ += C^T Q, and
// the normalisations' backwards. Float64 computes in double, every other dtype in fp32; the sums
// over rows run in fixed_chunks chunks of blocks added in chunk order, so results are the same
// bits for any thread count.
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

// The normalised negatives N^ [R, d] and their transpose [d, R], in C.
template <typename T, typename C = accumulate_t<T>>
struct Negatives {
  std::vector<RowScale<C>> scales;
  std::vector<C> rows, transposed;

  explicit Negatives(const SampledSoftmaxProblem<T>& p)
      : scales(static_cast<size_t>(p.negatives)),
        rows(static_cast<size_t>(p.negatives * p.dim)),
        transposed(rows.size()) {
    for (int64_t j = 0; j < p.negatives; ++j) {
      const T* n = p.negative_rows + j * p.ld_negatives;
      scales[j] = row_scale(n, p.dim, p.eps);
      for (int64_t d = 0; d < p.dim; ++d) {
        const C v = compute_value(n[d]) / scales[j].scale;
        rows[j * p.dim + d] = v;
        transposed[d * p.negatives + j] = v;
      }
    }
  }
};

// What a thread keeps for its blocks: the block's queries in C, their positive logits and
// normalisations, and the [rows, R] exp(logit - m) of the negatives.
template <typename T, typename C = accumulate_t<T>>
struct Block {
  const SampledSoftmaxProblem<T>& p;
  const Negatives<T>& negatives;
  std::vector<C> queries, exps, positive_logit, max_logit, normaliser;
  std::vector<RowScale<C>> positive_scales;

  Block(const SampledSoftmaxProblem<T>& problem, const Negatives<T>& n)
      : p(problem),
        negatives(n),
        queries(static_cast<size_t>(kRowBlock * problem.dim)),
        exps(static_cast<size_t>(kRowBlock * problem.negatives)),
        positive_logit(kRowBlock),
        max_logit(kRowBlock),
        normaliser(kRowBlock),
        positive_scales(kRowBlock) {}

  // For rows [r0, r0 + n): exp(logit - m) of the negatives, with per row its maximum logit m (the
  // positive's included) and the sum of exp(logit - m) over the positive and the negatives.
  void compute(int64_t r0, int64_t n) {
    const int64_t dim = p.dim, count = p.negatives;
    const C inverse_t = static_cast<C>(1.0 / p.temperature);
    for (int64_t i = 0; i < n; ++i) {
      const T* q = p.queries + (r0 + i) * p.ld_queries;
      const T* pos = p.positives + (r0 + i) * p.ld_positives;
      C* qc = queries.data() + i * dim;
      for (int64_t d = 0; d < dim; ++d) qc[d] = compute_value(q[d]);
      positive_scales[i] = row_scale(pos, dim, p.eps);
      const C dot = lane_sum<C>(dim, [&](int64_t d) { return qc[d] * compute_value(pos[d]); });
      positive_logit[i] = dot / positive_scales[i].scale * inverse_t;
    }
    gemm_nn(n, count, dim, queries.data(), dim, negatives.transposed.data(), count, exps.data(),
            count, false);
    for (int64_t i = 0; i < n; ++i) {
      C* row = exps.data() + i * count;
      const int64_t positive_id = p.positive_ids[r0 + i];
      // Vector reductions (their lanes' order is the instruction set's, as in the attention's
      // softmax); scalar ones ran at a third of the loss's time.
      C m = positive_logit[i];
#pragma omp simd reduction(max : m)
      for (int64_t j = 0; j < count; ++j) {
        const C logit =
            p.negative_ids[j] == positive_id ? static_cast<C>(kNotANegative) : row[j] * inverse_t;
        row[j] = logit;
        m = logit > m ? logit : m;
      }
      max_logit[i] = m;
      normaliser[i] = exp_row_generic(row, count, m) + softmax_exp(positive_logit[i] - m);
    }
  }

  // Row i's loss: log(sum of exp(logits)) - its positive's logit.
  double loss(int64_t i) const {
    return static_cast<double>(max_logit[i]) + std::log(static_cast<double>(normaliser[i])) -
           static_cast<double>(positive_logit[i]);
  }
};

template <typename T>
LossSums sampled_softmax_forward(const SampledSoftmaxProblem<T>& p) {
  const Negatives<T> negatives(p);
  const int64_t blocks = (p.rows + kRowBlock - 1) / kRowBlock;
  const int64_t chunks = fixed_chunks(blocks);
  std::vector<LossSums> partial(static_cast<size_t>(chunks), LossSums{0.0, 0.0});
  for_each_chunk(blocks, chunks, [&](int64_t chunk, int64_t b0, int64_t b1) {
    SingleThreadedBlas blas;
    Block<T> block(p, negatives);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kRowBlock, n = std::min(kRowBlock, p.rows - r0);
      block.compute(r0, n);
      for (int64_t i = 0; i < n; ++i) {
        const double w = p.weights[r0 + i];
        partial[chunk].weighted_loss += w * block.loss(i);
        partial[chunk].weight += w;
      }
    }
  });
  LossSums sums{0.0, 0.0};
  for (const LossSums& s : partial) {
    sums.weighted_loss += s.weighted_loss;
    sums.weight += s.weight;
  }
  return sums;
}

template <typename T>
void sampled_softmax_backward(const SampledSoftmaxProblem<T>& p,
                              const SampledSoftmaxGrads<T>& grads) {
  using C = accumulate_t<T>;
  const Negatives<T> negatives(p);
  const int64_t dim = p.dim, count = p.negatives;
  double weight = 0;
  for (int64_t i = 0; i < p.rows; ++i) weight += p.weights[i];
  const int64_t blocks = (p.rows + kRowBlock - 1) / kRowBlock;
  const int64_t chunks = fixed_chunks(blocks);
  // Per chunk, d(loss) / dN^ [R, d].
  std::vector<C> partial(static_cast<size_t>(chunks * count * dim), C(0));
  for_each_chunk(blocks, chunks, [&](int64_t chunk, int64_t b0, int64_t b1) {
    SingleThreadedBlas blas;
    Block<T> block(p, negatives);
    std::vector<C> dq(static_cast<size_t>(kRowBlock * dim)), dpos(static_cast<size_t>(dim));
    std::vector<C> coefficients_t(static_cast<size_t>(count * kRowBlock));
    std::vector<C> positive_coefficient(kRowBlock);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kRowBlock, n = std::min(kRowBlock, p.rows - r0);
      block.compute(r0, n);
      // exp(logit - m) <- C: d(loss) / d(q . n^_j) = g w_i / W * softmax_j / T, 0 for a masked
      // negative; the positive's coefficient (softmax_0 - 1) scaled alike.
      std::vector<C>& c = block.exps;
      for (int64_t i = 0; i < n; ++i) {
        const C scale = static_cast<C>(grads.grad * p.weights[r0 + i] / weight / p.temperature);
        const C m = block.max_logit[i], inverse_z = C(1) / block.normaliser[i];
        positive_coefficient[i] =
            scale * (softmax_exp(block.positive_logit[i] - m) * inverse_z - C(1));
        const int64_t positive_id = p.positive_ids[r0 + i];
        C* row = c.data() + i * count;
        for (int64_t j = 0; j < count; ++j) {
          row[j] = p.negative_ids[j] == positive_id ? C(0) : scale * row[j] * inverse_z;
        }
      }
      gemm_nn(n, dim, count, c.data(), count, negatives.rows.data(), dim, dq.data(), dim, false);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = r0 + i;
        const C cp = positive_coefficient[i];
        const T* pos = p.positives + r * p.ld_positives;
        const RowScale<C>& ps = block.positive_scales[i];
        const C inverse_scale = C(1) / ps.scale;
        const C* qc = block.queries.data() + i * dim;
        T* gq = grads.queries + r * dim;
        for (int64_t d = 0; d < dim; ++d) {
          const C p_hat = compute_value(pos[d]) * inverse_scale;
          gq[d] = T(dq[i * dim + d] + cp * p_hat);
          dpos[d] = cp * qc[d];
        }
        normalize_backward(pos, dim, ps, dpos.data(), grads.positives + r * dim);
      }
      transpose_tile(c.data(), n, count, count, coefficients_t.data(), kRowBlock);
      gemm_nn(count, dim, n, coefficients_t.data(), kRowBlock, block.queries.data(), dim,
              partial.data() + chunk * count * dim, dim, true);
    }
  });
  std::vector<C> d_hat(static_cast<size_t>(dim));
  for (int64_t j = 0; j < count; ++j) {
    for (int64_t d = 0; d < dim; ++d) {
      C s = C(0);
      for (int64_t k = 0; k < chunks; ++k) s += partial[(k * count + j) * dim + d];
      d_hat[d] = s;
    }
    normalize_backward(p.negative_rows + j * p.ld_negatives, dim, negatives.scales[j], d_hat.data(),
                       grads.negatives + j * dim);
  }
}

}  // namespace recops::loss::kernels::RECOPS_ISA_NS

// DeBERTa disentangled attention on CPU (docs/ops.md section 6):
//   A[i,j] = scale * (q_i.k_j + [c2p] q_i.pos_key[d(i,j)] + [p2c] k_j.pos_query[d(i,j)]),
//   P = softmax_j(A masked), O = dropout(P) V,
// with d(i,j) the clamped (log-bucketed) relative-position index of the pair.
//
// Tiling (work_items.h): a unit is one (batch, head) pair; work items (unit, chunk) own
// interleaved blocks of kQueryBlock query rows. Every product is a gemm_nn tile product (oneDNN's
// brgemm micro-kernel, common/blas.h) on operands laid out for it. Per item, the position scores
// P2C^T = pos_query K^T [2 span, keys] are computed once; per query block,
// C2P^T = pos_key Q_block^T [2 span, rows]. Backward computes them again rather than keeping
// O(B H S span) of them between the passes. A query block then streams over key tiles of kKeyTile
// keys: one product for Q K^T, the position terms of the tile built in diagonal layout (one
// relative distance per diagonal, contiguous slices of the transposed tables, see
// softmax_tile_ops.h) and added to it, masking and an online softmax row by row (running max and
// sum per row, fp32 or float64), one product for P V into the output rows. The log-sum-exp of
// every row is saved; backward recomputes the probabilities tile by tile, shears each
// score-gradient tile into diagonals and adds them to dC2P^T / dP2C^T by the diagonal's index
// (contiguous adds, no scatter), and turns those into dq, dk, d pos_key and d pos_query with four
// more products per block / item. Tiles far from the diagonal, where the clamped distance gives
// every pair one index, skip the diagonal layout (a per-row plus a per-key term; row and column
// sums of the gradient). dq rows belong to the item; dk, dv go to per-chunk partials and
// d pos_key / d pos_query to per-thread partials that the adapter sums. Dropout regenerates its
// mask from a counter-based hash of (seed, unit, row, key). Extra memory: per thread O(kQueryBlock
// * (kKeyTile + span) + k_len * span), never [S, S] (unless the caller asks for the probabilities).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "recops/attention/kernels/tile_variants.h"
#include "recops/attention/kernels/work_items.h"
#include "recops/common/blas.h"
#include "recops/common/counter_rng.h"
#include "recops/common/parallel.h"

namespace recops::attention::kernels {

constexpr int64_t kKeyTile = 256;

template <typename T>
struct DisentangledShape {
  int64_t batch = 0, heads = 0, q_len = 0, k_len = 0, dqk = 0, dv = 0;
  int64_t positions = 0;  // rows of the position tables, 2 * span
  T scale = T(1);
  bool c2p = false, p2c = false;
};

// Which pairs take part. `padding` [B, S] (q_len == k_len) keeps (i, j) iff both are kept (HF's
// expansion of a padding mask); `dense` [B, q_len, k_len] keeps the pairs it marks. Query rows at
// or past q_extent[b] and keys at or past k_extent[b] take no part at all; a padding row that
// keeps every token before its extent (padding at the end only, the usual case) needs no other
// check: padding_holes[b] says whether row b has masked tokens before its extent.
struct DisentangledMask {
  const uint8_t* padding = nullptr;
  const uint8_t* padding_holes = nullptr;  // [B], with padding
  const uint8_t* dense = nullptr;
  const int64_t* q_extent = nullptr;  // [B]
  const int64_t* k_extent = nullptr;  // [B]

  // Key flags of query row i of batch row b (from key `first` on), null when all are kept.
  const uint8_t* keep(int64_t b, int64_t i, int64_t first, int64_t q_len, int64_t k_len) const {
    if (padding != nullptr) return padding_holes[b] != 0 ? padding + b * k_len + first : nullptr;
    return dense != nullptr ? dense + (b * q_len + i) * k_len + first : nullptr;
  }
};

template <typename T>
struct DisentangledProblem {
  DisentangledShape<T> shape;
  const T* q = nullptr;          // [B, H, q_len, dqk]
  const T* k = nullptr;          // [B, H, k_len, dqk]
  const T* v = nullptr;          // [B, H, k_len, dv]
  const T* pos_key = nullptr;    // [positions, H, dqk] (c2p)
  const T* pos_query = nullptr;  // [positions, H, dqk] (p2c)
  // delta[q_len - 1 - i + j] = d(i, j) in [0, positions); null without position terms.
  const int32_t* delta = nullptr;
  DisentangledMask mask;
  T dropout_p = T(0);
  uint64_t seed = 0;
};

template <typename T>
struct DisentangledOutputs {
  T* out = nullptr;    // [B, H, q_len, dv], zero-initialised
  T* lse = nullptr;    // [B, H, q_len], initialised to +inf (rows that see no key keep it)
  T* probs = nullptr;  // [B, H, q_len, k_len] zero-initialised, or null
};

template <typename T>
struct DisentangledGrads {
  T* dq = nullptr;          // [B, H, q_len, dqk], accumulated (zero-initialised)
  T* dk = nullptr;          // [chunks, B, H, k_len, dqk], accumulated (zero-initialised)
  T* dv = nullptr;          // [chunks, B, H, k_len, dv], accumulated (zero-initialised)
  T* dpos_key = nullptr;    // [threads, positions, H, dqk], accumulated, or null
  T* dpos_query = nullptr;  // [threads, positions, H, dqk], accumulated, or null
};

// One (batch, head) pair: its slices of the inputs.
template <typename T>
struct Unit {
  int64_t index, b, h, keys;  // keys: k_extent of the batch row
  const T *q, *k, *v, *pos_key, *pos_query;

  Unit(const DisentangledProblem<T>& p, int64_t u) : index(u), b(u / p.shape.heads) {
    const DisentangledShape<T>& s = p.shape;
    h = u % s.heads;
    keys = p.mask.k_extent[b];
    q = p.q + u * s.q_len * s.dqk;
    k = p.k + u * s.k_len * s.dqk;
    v = p.v + u * s.k_len * s.dv;
    pos_key = s.c2p ? p.pos_key + h * s.dqk : nullptr;
    pos_query = s.p2c ? p.pos_query + h * s.dqk : nullptr;
  }
};

// Per-thread scratch; the BLAS stays single-threaded while it lives. The position scores and
// their gradients are kept transposed, as the diagonal layout reads them: C2P^T
// [positions, kQueryBlock] for the block, P2C^T [positions, k_len] for the item. The tile
// products run on gemm_nn, which takes no transposes: the operands that enter transposed are
// laid out here once per item (scale K^T, V^T, pos_key^T, pos_query^T) or per query block
// (Q^T, scale Q^T, dO^T), and dK, dV are accumulated transposed over the item.
template <typename T>
struct SoftmaxScratch {
  SingleThreadedBlas blas;
  std::vector<T> scores, grads, diag, c2p_t, dc2p_t, p2c_t, dp2c_t, row_max, row_sum;
  std::vector<T> k_t, v_t, q_t, q_t_scaled, go_t, dq_t, pos_key_t, pos_query_t, dk_t, dv_t;
  int64_t slot;

  SoftmaxScratch(const DisentangledShape<T>& s, bool backward, int64_t thread_slot)
      : blas(),
        scores(kQueryBlock * kKeyTile),
        grads(backward ? kQueryBlock * kKeyTile : 0),
        diag(s.c2p || s.p2c ? (kKeyTile + kQueryBlock - 1) * kQueryBlock : 0),
        c2p_t(s.c2p ? s.positions * kQueryBlock : 0),
        dc2p_t(s.c2p && backward ? s.positions * kQueryBlock : 0),
        p2c_t(s.p2c ? s.positions * s.k_len : 0),
        dp2c_t(s.p2c && backward ? s.positions * s.k_len : 0),
        row_max(kQueryBlock),
        row_sum(kQueryBlock),
        k_t(s.dqk * s.k_len),
        v_t(backward ? s.dv * s.k_len : 0),
        q_t(backward ? s.dqk * kQueryBlock : 0),
        q_t_scaled(s.c2p ? s.dqk * kQueryBlock : 0),
        go_t(backward ? s.dv * kQueryBlock : 0),
        dq_t(s.c2p && backward ? s.dqk * kQueryBlock : 0),
        pos_key_t(s.c2p && backward ? s.dqk * s.positions : 0),
        pos_query_t(s.p2c && backward ? s.dqk * s.positions : 0),
        dk_t(backward ? s.dqk * s.k_len : 0),
        dv_t(backward ? s.dv * s.k_len : 0),
        slot(thread_slot) {}
};

template <typename T>
bool query_row_alive(const DisentangledProblem<T>& p, int64_t b, int64_t i) {
  const DisentangledMask& m = p.mask;
  return m.padding == nullptr || m.padding_holes[b] == 0 || m.padding[b * p.shape.k_len + i] != 0;
}

template <typename T>
RowDropout<T> row_dropout(const DisentangledProblem<T>& p, int64_t unit, int64_t i) {
  return RowDropout<T>{CounterRow::make(p.seed, static_cast<uint64_t>(unit * p.shape.q_len + i)),
                       keep_threshold(p.dropout_p),
                       p.dropout_p < T(1) ? T(1) / (T(1) - p.dropout_p) : T(0)};
}

// Position index of diagonal 0 of the tile (query rows [row0, row0 + rows), keys from kt0).
template <typename T>
const int32_t* tile_delta(const DisentangledProblem<T>& p, int64_t row0, int64_t rows,
                          int64_t kt0) {
  return p.delta + (p.shape.q_len - 1 - row0 + kt0 - (rows - 1));
}

// Key (column of P2C^T) of lane 0 of diagonal 0 of the tile.
inline int64_t tile_first_column(int64_t rows, int64_t kt0) {
  return kt0 - (rows - 1);
}

// Adds the (scaled) position terms to a [rows x n] tile of scaled q.k products.
template <typename T>
void add_position_terms(const TileOps<T>& passes, const DisentangledProblem<T>& p,
                        SoftmaxScratch<T>& t, int64_t row0, int64_t rows, int64_t kt0, int64_t n,
                        T* tile) {
  const DisentangledShape<T>& s = p.shape;
  const int32_t* delta = tile_delta(p, row0, rows, kt0);
  if (delta[0] == delta[n + rows - 2]) {  // one position index for the whole tile
    passes.add_uniform_position_terms(tile, rows, n,
                                      s.c2p ? t.c2p_t.data() + delta[0] * kQueryBlock : nullptr,
                                      s.p2c ? t.p2c_t.data() + delta[0] * s.k_len + kt0 : nullptr);
    return;
  }
  passes.expand_position_terms(
      t.diag.data(), rows, n, kQueryBlock, delta, s.c2p ? t.c2p_t.data() : nullptr, kQueryBlock,
      s.p2c ? t.p2c_t.data() : nullptr, s.k_len, tile_first_column(rows, kt0));
  passes.unshear_add(t.diag.data(), rows, n, kQueryBlock, tile);
}

// Adds the gradients of the position terms of a tile, from its score gradients.
template <typename T>
void add_position_grads(const TileOps<T>& passes, const DisentangledProblem<T>& p,
                        SoftmaxScratch<T>& t, int64_t row0, int64_t rows, int64_t kt0, int64_t n,
                        const T* dtile) {
  const DisentangledShape<T>& s = p.shape;
  const int32_t* delta = tile_delta(p, row0, rows, kt0);
  if (delta[0] == delta[n + rows - 2]) {
    passes.accumulate_uniform_position_grads(
        dtile, rows, n, s.c2p ? t.dc2p_t.data() + delta[0] * kQueryBlock : nullptr,
        s.p2c ? t.dp2c_t.data() + delta[0] * s.k_len + kt0 : nullptr);
    return;
  }
  passes.shear_tile(dtile, rows, n, t.diag.data(), kQueryBlock);
  passes.accumulate_position_grads(
      t.diag.data(), rows, n, kQueryBlock, delta, s.c2p ? t.dc2p_t.data() : nullptr, kQueryBlock,
      s.p2c ? t.dp2c_t.data() : nullptr, s.k_len, tile_first_column(rows, kt0));
}

// Masks row r (query i) of a tile of scores over keys [kt0, kt0 + n); returns the row max: -inf
// when the row sees none of these keys or they all score -inf, NaN when they score NaN (the max
// skips NaN, which would then leave the row at zero where torch's softmax gives NaN).
template <typename T>
T score_row(const TileOps<T>& passes, const DisentangledProblem<T>& p, const Unit<T>& unit,
            int64_t i, int64_t kt0, int64_t n, T* row) {
  const DisentangledShape<T>& s = p.shape;
  const T m = passes.mask_row(row, n, p.mask.keep(unit.b, i, kt0, s.q_len, s.k_len));
  if (m != -std::numeric_limits<T>::infinity()) return m;
  const bool any_nan = std::any_of(row, row + n, [](T x) { return std::isnan(x); });
  return any_nan ? std::numeric_limits<T>::quiet_NaN() : m;
}

// Probabilities of a row whose softmax is NaN: NaN at the keys it keeps, zero at the masked ones
// (HF zeroes those after the softmax).
template <typename T>
void nan_probabilities(const DisentangledProblem<T>& p, const Unit<T>& unit, int64_t i, T* prow) {
  const DisentangledShape<T>& s = p.shape;
  const uint8_t* keep = p.mask.keep(unit.b, i, 0, s.q_len, s.k_len);
  for (int64_t j = 0; j < unit.keys; ++j) {
    prow[j] = keep == nullptr || keep[j] != 0 ? std::numeric_limits<T>::quiet_NaN() : T(0);
  }
}

// Whether query row i keeps every key. A row that sees no key is a masked row (zero output, as
// HF, whose softmax then falls back on the masked scores' dtype minimum and zeroes them) unless
// it keeps every key: then its scores were all -inf, and softmax over them is NaN.
template <typename T>
bool keeps_every_key(const DisentangledProblem<T>& p, const Unit<T>& unit, int64_t i) {
  const DisentangledShape<T>& s = p.shape;
  if (p.mask.k_extent[unit.b] < s.k_len) return false;
  const uint8_t* keep = p.mask.keep(unit.b, i, 0, s.q_len, s.k_len);
  return keep == nullptr || std::all_of(keep, keep + s.k_len, [](uint8_t k) { return k != 0; });
}

// Lays out scale K^T [dqk, k_len] for the unit's keys (the right operand of Q K^T and of P2C^T).
template <typename T>
void unit_scaled_k_t(const DisentangledShape<T>& s, const Unit<T>& unit, SoftmaxScratch<T>& t) {
  transpose(unit.keys, s.dqk, unit.k, s.dqk, t.k_t.data(), s.k_len, s.scale);
}

// P2C^T = pos_query (scale K^T) for the unit's keys.
template <typename T>
void unit_p2c(const DisentangledShape<T>& s, const Unit<T>& unit, SoftmaxScratch<T>& t) {
  gemm_nn(s.positions, unit.keys, s.dqk, unit.pos_query, s.heads * s.dqk, t.k_t.data(), s.k_len,
          t.p2c_t.data(), s.k_len, false);
}

// C2P^T = pos_key (scale Q_block^T) for the block's rows.
template <typename T>
void block_c2p(const DisentangledShape<T>& s, const Unit<T>& unit, int64_t row0, int64_t rows,
               SoftmaxScratch<T>& t) {
  transpose(rows, s.dqk, unit.q + row0 * s.dqk, s.dqk, t.q_t_scaled.data(), kQueryBlock, s.scale);
  gemm_nn(s.positions, rows, s.dqk, unit.pos_key, s.heads * s.dqk, t.q_t_scaled.data(), kQueryBlock,
          t.c2p_t.data(), kQueryBlock, false);
}

template <typename T>
void forward_block(const TileOps<T>& passes, const DisentangledProblem<T>& p, const Unit<T>& unit,
                   int64_t row0, int64_t rows, SoftmaxScratch<T>& t,
                   const DisentangledOutputs<T>& o) {
  const DisentangledShape<T>& s = p.shape;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const T* q = unit.q + row0 * s.dqk;
  const int64_t first_row = unit.index * s.q_len + row0;
  T* out = o.out + first_row * s.dv;
  if (s.c2p) block_c2p(s, unit, row0, rows, t);
  T* m = t.row_max.data();
  T* l = t.row_sum.data();
  std::fill(m, m + rows, kNegInf);
  std::fill(l, l + rows, T(0));
  for (int64_t kt0 = 0; kt0 < unit.keys; kt0 += kKeyTile) {
    const int64_t n = std::min(kKeyTile, unit.keys - kt0);
    T* tile = t.scores.data();
    gemm_nn(rows, n, s.dqk, q, s.dqk, t.k_t.data() + kt0, s.k_len, tile, n, false);
    if (p.delta != nullptr) add_position_terms(passes, p, t, row0, rows, kt0, n, tile);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = row0 + r;
      T* row = tile + r * n;
      if (!query_row_alive(p, unit.b, i)) {
        std::fill(row, row + n, T(0));
        continue;
      }
      const T tile_max = score_row(passes, p, unit, i, kt0, n, row);
      const T m_new = std::isnan(tile_max) ? tile_max : std::max(m[r], tile_max);  // NaN sticks
      if (o.probs != nullptr) {
        std::memcpy(o.probs + (first_row + r) * s.k_len + kt0, row, n * sizeof(T));
      }
      if (m_new == kNegInf) {  // nothing seen yet: contributes nothing
        std::fill(row, row + n, T(0));
        continue;
      }
      const T correction = m[r] == kNegInf ? T(0) : std::exp(m[r] - m_new);
      l[r] = l[r] * correction + passes.exp_row(row, n, m_new);
      m[r] = m_new;
      if (correction != T(1)) {
        for (int64_t c = 0; c < s.dv; ++c) out[r * s.dv + c] *= correction;
      }
      if (p.dropout_p > T(0)) passes.dropout_row(row, n, row_dropout(p, unit.index, i), kt0);
    }
    gemm_nn(rows, s.dv, n, tile, n, unit.v + kt0 * s.dv, s.dv, out, s.dv, true);
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* prow = o.probs == nullptr ? nullptr : o.probs + (first_row + r) * s.k_len;
    if (l[r] == T(0) && !keeps_every_key(p, unit, row0 + r)) {
      // Sees no key: zero output and probabilities, lse stays +inf.
      if (prow != nullptr) std::fill(prow, prow + unit.keys, T(0));
      continue;
    }
    if (l[r] == T(0) || std::isnan(l[r])) {  // scores all -inf, or NaN: softmax is NaN
      constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();
      std::fill(out + r * s.dv, out + (r + 1) * s.dv, kNaN);
      o.lse[first_row + r] = kNaN;
      if (prow != nullptr) nan_probabilities(p, unit, row0 + r, prow);
      continue;
    }
    const T inv = T(1) / l[r];
    for (int64_t c = 0; c < s.dv; ++c) out[r * s.dv + c] *= inv;
    const T lse = m[r] + std::log(l[r]);
    o.lse[first_row + r] = lse;
    if (prow == nullptr) continue;
    passes.exp_row(prow, unit.keys, lse);
    if (p.dropout_p > T(0)) {
      passes.dropout_row(prow, unit.keys, row_dropout(p, unit.index, row0 + r), 0);
    }
  }
}

template <typename T>
std::vector<int64_t> unit_lengths(const DisentangledProblem<T>& p) {
  std::vector<int64_t> lengths(p.shape.batch * p.shape.heads);
  for (int64_t u = 0; u < static_cast<int64_t>(lengths.size()); ++u) {
    lengths[u] = p.mask.q_extent[u / p.shape.heads];
  }
  return lengths;
}

template <typename T>
void disentangled_forward(const DisentangledProblem<T>& p, int64_t chunks,
                          const DisentangledOutputs<T>& o) {
  const std::vector<int64_t> lengths = unit_lengths(p);
  const std::vector<WorkItem> items =
      make_work_items(lengths.data(), static_cast<int64_t>(lengths.size()), chunks);
  const TileOps<T>& passes = tile_ops<T>();
  parallel_for_dynamic(
      static_cast<int64_t>(items.size()),
      [&](int64_t slot) { return SoftmaxScratch<T>(p.shape, false, slot); },
      [&](SoftmaxScratch<T>& t, int64_t index) {
        const WorkItem item = items[index];
        const Unit<T> unit(p, item.sequence);
        unit_scaled_k_t(p.shape, unit, t);
        if (p.shape.p2c) unit_p2c(p.shape, unit, t);
        for_each_query_block(lengths[item.sequence], item, chunks, [&](int64_t row0, int64_t rows) {
          forward_block(passes, p, unit, row0, rows, t, o);
        });
      });
}

// Backward inputs besides the problem: dL/dO, dL/d(returned probabilities) or null, the saved
// log-sum-exp and D = rowsum(dO * O) (+ rowsum(probs * grad_probs)), all [B, H, q_len, ...].
template <typename T>
struct DisentangledBackwardInputs {
  const T* grad_out = nullptr;
  const T* grad_probs = nullptr;
  const T* lse = nullptr;
  const T* d = nullptr;
};

template <typename T>
void backward_block(const TileOps<T>& passes, const DisentangledProblem<T>& p, const Unit<T>& unit,
                    int64_t row0, int64_t rows, SoftmaxScratch<T>& t,
                    const DisentangledBackwardInputs<T>& in, const DisentangledGrads<T>& g) {
  const DisentangledShape<T>& s = p.shape;
  const T* q = unit.q + row0 * s.dqk;
  const int64_t first_row = unit.index * s.q_len + row0;
  const T* go = in.grad_out + first_row * s.dv;
  T* dq = g.dq + first_row * s.dqk;
  transpose(rows, s.dqk, q, s.dqk, t.q_t.data(), kQueryBlock);
  transpose(rows, s.dv, go, s.dv, t.go_t.data(), kQueryBlock);
  if (s.c2p) {
    block_c2p(s, unit, row0, rows, t);
    std::fill(t.dc2p_t.begin(), t.dc2p_t.end(), T(0));
  }
  for (int64_t kt0 = 0; kt0 < unit.keys; kt0 += kKeyTile) {
    const int64_t n = std::min(kKeyTile, unit.keys - kt0);
    T* tile = t.scores.data();
    T* dtile = t.grads.data();
    gemm_nn(rows, n, s.dqk, q, s.dqk, t.k_t.data() + kt0, s.k_len, tile, n, false);
    gemm_nn(rows, n, s.dv, go, s.dv, t.v_t.data() + kt0, s.k_len, dtile, n, false);
    if (p.delta != nullptr) add_position_terms(passes, p, t, row0, rows, kt0, n, tile);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = row0 + r;
      T* row = tile + r * n;
      T* drow = dtile + r * n;
      const T lse = in.lse[first_row + r];
      if (lse == std::numeric_limits<T>::infinity()) {  // a row that sees no key
        std::fill(row, row + n, T(0));
        std::fill(drow, drow + n, T(0));
        continue;
      }
      if (in.grad_probs != nullptr) {
        const T* gp = in.grad_probs + (first_row + r) * s.k_len + kt0;
        for (int64_t j = 0; j < n; ++j) drow[j] += gp[j];
      }
      score_row(passes, p, unit, i, kt0, n, row);
      const RowDropout<T> dropout = row_dropout(p, unit.index, i);
      passes.softmax_grad_row(row, drow, n, lse, in.d[first_row + r], s.scale,
                              p.dropout_p > T(0) ? &dropout : nullptr, kt0);
    }
    if (p.delta != nullptr) {
      add_position_grads(passes, p, t, row0, rows, kt0, n, dtile);
    }
    // dV^T += dO^T P, dQ += dS K, dK^T += Q^T dS.
    gemm_nn(s.dv, n, rows, t.go_t.data(), kQueryBlock, tile, n, t.dv_t.data() + kt0, s.k_len, true);
    gemm_nn(rows, s.dqk, n, dtile, n, unit.k + kt0 * s.dqk, s.dqk, dq, s.dqk, true);
    gemm_nn(s.dqk, n, rows, t.q_t.data(), kQueryBlock, dtile, n, t.dk_t.data() + kt0, s.k_len,
            true);
  }
  if (s.c2p) {
    // dQ^T = pos_key^T dC2P^T, added to dQ; d pos_key += dC2P^T Q.
    gemm_nn(s.dqk, rows, s.positions, t.pos_key_t.data(), s.positions, t.dc2p_t.data(), kQueryBlock,
            t.dq_t.data(), kQueryBlock, false);
    transpose(s.dqk, rows, t.dq_t.data(), kQueryBlock, dq, s.dqk, T(1), true);
    const int64_t ld = s.heads * s.dqk;
    T* dpk = g.dpos_key + t.slot * s.positions * ld + unit.h * s.dqk;
    gemm_nn(s.positions, s.dqk, rows, t.dc2p_t.data(), kQueryBlock, q, s.dqk, dpk, ld, true);
  }
}

// Lays out the item's transposed operands and zeroes its transposed dK, dV accumulators.
template <typename T>
void prepare_backward_item(const DisentangledShape<T>& s, const Unit<T>& unit,
                           SoftmaxScratch<T>& t) {
  const int64_t ld = s.heads * s.dqk;
  unit_scaled_k_t(s, unit, t);
  transpose(unit.keys, s.dv, unit.v, s.dv, t.v_t.data(), s.k_len);
  if (s.c2p) transpose(s.positions, s.dqk, unit.pos_key, ld, t.pos_key_t.data(), s.positions);
  if (s.p2c) {
    transpose(s.positions, s.dqk, unit.pos_query, ld, t.pos_query_t.data(), s.positions);
    unit_p2c(s, unit, t);
    std::fill(t.dp2c_t.begin(), t.dp2c_t.end(), T(0));
  }
  std::fill(t.dk_t.begin(), t.dk_t.end(), T(0));
  std::fill(t.dv_t.begin(), t.dv_t.end(), T(0));
}

template <typename T>
void disentangled_backward(const DisentangledProblem<T>& p, int64_t chunks,
                           const DisentangledBackwardInputs<T>& in, const DisentangledGrads<T>& g) {
  const DisentangledShape<T>& s = p.shape;
  const std::vector<int64_t> lengths = unit_lengths(p);
  const std::vector<WorkItem> items =
      make_work_items(lengths.data(), static_cast<int64_t>(lengths.size()), chunks);
  const int64_t units = s.batch * s.heads;
  const TileOps<T>& passes = tile_ops<T>();
  parallel_for_dynamic(
      static_cast<int64_t>(items.size()),
      [&](int64_t slot) { return SoftmaxScratch<T>(s, true, slot); },
      [&](SoftmaxScratch<T>& t, int64_t index) {
        const WorkItem item = items[index];
        const Unit<T> unit(p, item.sequence);
        T* dk = g.dk + (item.chunk * units + unit.index) * s.k_len * s.dqk;
        T* dv = g.dv + (item.chunk * units + unit.index) * s.k_len * s.dv;
        prepare_backward_item(s, unit, t);
        for_each_query_block(lengths[item.sequence], item, chunks, [&](int64_t row0, int64_t rows) {
          backward_block(passes, p, unit, row0, rows, t, in, g);
        });
        if (s.p2c) {
          // dK^T += pos_query^T dP2C^T, d pos_query += dP2C^T K.
          const int64_t ld = s.heads * s.dqk;
          gemm_nn(s.dqk, unit.keys, s.positions, t.pos_query_t.data(), s.positions, t.dp2c_t.data(),
                  s.k_len, t.dk_t.data(), s.k_len, true);
          T* dpq = g.dpos_query + t.slot * s.positions * ld + unit.h * s.dqk;
          gemm_nn(s.positions, s.dqk, unit.keys, t.dp2c_t.data(), s.k_len, unit.k, s.dqk, dpq, ld,
                  true);
        }
        // The item owns its dK, dV partial: add the transposed accumulators into it.
        transpose(s.dqk, unit.keys, t.dk_t.data(), s.k_len, dk, s.dqk, T(1), true);
        transpose(s.dv, unit.keys, t.dv_t.data(), s.k_len, dv, s.dv, T(1), true);
      });
}

}  // namespace recops::attention::kernels

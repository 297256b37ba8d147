// What DeBERTa's disentangled-attention kernels share, whatever their tile products run on
// (disentangled_attention.h: fp32 / float64 operands; disentangled_attention_bf16.h: bf16 operands
// with fp32 accumulation): the problem's description, and the fp32 (float64) arithmetic on the
// score tiles the products leave: position terms and their gradients in diagonal layout, masking,
// the online softmax, dropout, the final normalisation, and the softmax backward, row by row.
//
// Element types: a problem's inputs are E (float, double or Bf16); scores, softmax statistics,
// the log-sum-exp and partial gradients are in the compute type accumulate_t<E> (float for Bf16).
// Score tiles are [rows x n] blocks of query rows and keys with a row stride `ld` >= n; columns
// [n, ld) are padding that the helpers leave at zero.
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
#include "recops/common/half_bits.h"

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

// The keys a problem's delta table covers: k_len rounded up to kBrgemmGranule (the bf16 kernel's
// padded key tiles read the indices of their padding keys too).
inline int64_t position_index_keys(int64_t k_len) {
  return (k_len + kBrgemmGranule - 1) / kBrgemmGranule * kBrgemmGranule;
}

template <typename E>
struct DisentangledProblem {
  using Compute = accumulate_t<E>;
  DisentangledShape<Compute> shape;
  const E* q = nullptr;          // [B, H, q_len, dqk]
  const E* k = nullptr;          // [B, H, k_len, dqk]
  const E* v = nullptr;          // [B, H, k_len, dv]
  const E* pos_key = nullptr;    // [positions, H, dqk] (c2p)
  const E* pos_query = nullptr;  // [positions, H, dqk] (p2c)
  // delta[q_len - 1 - i + j] = d(i, j) in [0, positions) for j < position_index_keys(k_len);
  // null without position terms.
  const int32_t* delta = nullptr;
  DisentangledMask mask;
  Compute dropout_p = Compute(0);
  uint64_t seed = 0;
};

template <typename E>
struct DisentangledOutputs {
  using Compute = accumulate_t<E>;
  E* out = nullptr;          // [B, H, q_len, dv], zero-initialised
  Compute* lse = nullptr;    // [B, H, q_len], initialised to +inf (rows that see no key keep it)
  Compute* probs = nullptr;  // [B, H, q_len, k_len] zero-initialised, or null
};

template <typename E>
struct DisentangledGrads {
  using Compute = accumulate_t<E>;
  E* dq = nullptr;                // [B, H, q_len, dqk], zero-initialised
  Compute* dk = nullptr;          // [chunks, B, H, k_len, dqk], accumulated (zero-initialised)
  Compute* dv = nullptr;          // [chunks, B, H, k_len, dv], accumulated (zero-initialised)
  Compute* dpos_key = nullptr;    // [threads, positions, H, dqk], accumulated, or null
  Compute* dpos_query = nullptr;  // [threads, positions, H, dqk], accumulated, or null
};

// Backward inputs besides the problem, all [B, H, q_len, ...]: dL/dO, dL/d(returned
// probabilities) and those probabilities (or null), the forward's output and its saved
// log-sum-exp. The kernels form D = rowsum(dO * O) (+ rowsum(probs * grad_probs)) from them.
template <typename E>
struct DisentangledBackwardInputs {
  const E* grad_out = nullptr;
  const E* grad_probs = nullptr;
  const E* probs = nullptr;
  const E* out = nullptr;
  const accumulate_t<E>* lse = nullptr;
};

// One (batch, head) pair: its slices of the inputs.
template <typename E>
struct Unit {
  int64_t index, b, h, keys;  // keys: k_extent of the batch row
  const E *q, *k, *v, *pos_key, *pos_query;

  Unit(const DisentangledProblem<E>& p, int64_t u) : index(u), b(u / p.shape.heads) {
    const auto& s = p.shape;
    h = u % s.heads;
    keys = p.mask.k_extent[b];
    q = p.q + u * s.q_len * s.dqk;
    k = p.k + u * s.k_len * s.dqk;
    v = p.v + u * s.k_len * s.dv;
    pos_key = s.c2p ? p.pos_key + h * s.dqk : nullptr;
    pos_query = s.p2c ? p.pos_query + h * s.dqk : nullptr;
  }
};

// The tiled attention kernels' work loop (work_items.h) over a problem's units, whose query rows
// are the mask's query extent of their batch row: begin(scratch, unit) as an item starts,
// block(scratch, unit, row0, rows) per query block, end(scratch, unit, item) as it ends.
template <typename E, typename MakeScratch, typename Begin, typename BlockFn, typename End>
void for_each_unit_block(const DisentangledProblem<E>& p, int64_t chunks,
                         MakeScratch&& make_scratch, Begin&& begin, BlockFn&& block, End&& end) {
  std::vector<int64_t> lengths(p.shape.batch * p.shape.heads);
  for (int64_t u = 0; u < static_cast<int64_t>(lengths.size()); ++u) {
    lengths[u] = p.mask.q_extent[u / p.shape.heads];
  }
  for_each_work_item(
      lengths.data(), static_cast<int64_t>(lengths.size()), chunks, kQueryBlock, make_scratch,
      [&](auto& t, const WorkItem& item) { begin(t, Unit<E>(p, item.sequence)); },
      [&](auto& t, const WorkItem& item, int64_t row0, int64_t rows) {
        block(t, Unit<E>(p, item.sequence), row0, rows);
      },
      [&](auto& t, const WorkItem& item) { end(t, Unit<E>(p, item.sequence), item); });
}

template <typename E>
bool query_row_alive(const DisentangledProblem<E>& p, int64_t b, int64_t i) {
  const DisentangledMask& m = p.mask;
  return m.padding == nullptr || m.padding_holes[b] == 0 || m.padding[b * p.shape.k_len + i] != 0;
}

template <typename E, typename T = accumulate_t<E>>
RowDropout<T> row_dropout(const DisentangledProblem<E>& p, int64_t unit, int64_t i) {
  return RowDropout<T>{CounterRow::make(p.seed, static_cast<uint64_t>(unit * p.shape.q_len + i)),
                       keep_threshold(p.dropout_p),
                       p.dropout_p < T(1) ? T(1) / (T(1) - p.dropout_p) : T(0)};
}

// The position scores of the current query block and item, transposed as the diagonal layout
// reads them: C2P^T [positions, kQueryBlock] (c2p, else null) and P2C^T [positions, p2c_ld]
// (p2c, else null), with the diagonal-layout scratch of a tile; or their gradients.
template <typename T>
struct PositionTiles {
  T* diag;
  T* c2p_t;
  T* p2c_t;
  int64_t p2c_ld;
};

// The tiles between the products that both kernels keep per thread, in the compute type: the
// score and score-gradient tiles, the diagonal layout, the position scores C2P^T
// [position_rows, kQueryBlock] (per block) and P2C^T [position_rows, p2c_ld] (per item) with
// their gradients, and the rows' softmax statistics. The bf16 kernel pads position_rows and
// p2c_ld to its product granule; the fp32 kernel passes the shape's.
template <typename T>
struct SoftmaxTiles {
  SoftmaxTiles(const DisentangledShape<T>& s, bool backward, int64_t position_rows, int64_t p2c_ld)
      : p2c_ld(p2c_ld),
        scores(kQueryBlock * kKeyTile),
        grads(backward ? kQueryBlock * kKeyTile : 0),
        diag(s.c2p || s.p2c ? (kKeyTile + kQueryBlock - 1) * kQueryBlock : 0),
        c2p_t(s.c2p ? position_rows * kQueryBlock : 0),
        dc2p_t(s.c2p && backward ? position_rows * kQueryBlock : 0),
        p2c_t(s.p2c ? position_rows * p2c_ld : 0),
        dp2c_t(s.p2c && backward ? position_rows * p2c_ld : 0),
        row_max(kQueryBlock),
        row_sum(kQueryBlock),
        row_d(backward ? kQueryBlock : 0) {}

  PositionTiles<T> positions(const DisentangledShape<T>& s) {
    return {diag.data(), s.c2p ? c2p_t.data() : nullptr, s.p2c ? p2c_t.data() : nullptr, p2c_ld};
  }
  PositionTiles<T> position_grads(const DisentangledShape<T>& s) {
    return {diag.data(), s.c2p ? dc2p_t.data() : nullptr, s.p2c ? dp2c_t.data() : nullptr, p2c_ld};
  }

  int64_t p2c_ld;
  std::vector<T> scores, grads, diag, c2p_t, dc2p_t, p2c_t, dp2c_t, row_max, row_sum, row_d;
};

// Position index of diagonal 0 of the tile (query rows [row0, row0 + rows), keys from kt0).
template <typename E>
const int32_t* tile_delta(const DisentangledProblem<E>& p, int64_t row0, int64_t rows,
                          int64_t kt0) {
  return p.delta + (p.shape.q_len - 1 - row0 + kt0 - (rows - 1));
}

// Key (column of P2C^T) of lane 0 of diagonal 0 of the tile.
inline int64_t tile_first_column(int64_t rows, int64_t kt0) {
  return kt0 - (rows - 1);
}

// Adds the (scaled) position terms to a [rows x n] tile (row stride n) of scaled q.k products.
template <typename E, typename T>
void add_position_terms(const TileOps<T>& passes, const DisentangledProblem<E>& p,
                        const PositionTiles<T>& pos, int64_t row0, int64_t rows, int64_t kt0,
                        int64_t n, T* tile) {
  const int32_t* delta = tile_delta(p, row0, rows, kt0);
  if (delta[0] == delta[n + rows - 2]) {  // one position index for the whole tile
    passes.add_uniform_position_terms(
        tile, rows, n, pos.c2p_t == nullptr ? nullptr : pos.c2p_t + delta[0] * kQueryBlock,
        pos.p2c_t == nullptr ? nullptr : pos.p2c_t + delta[0] * pos.p2c_ld + kt0);
    return;
  }
  passes.expand_position_terms(pos.diag, rows, n, kQueryBlock, delta, pos.c2p_t, kQueryBlock,
                               pos.p2c_t, pos.p2c_ld, tile_first_column(rows, kt0));
  passes.unshear_add(pos.diag, rows, n, kQueryBlock, tile);
}

// Adds the gradients of the position terms of a tile (row stride n), from its score gradients.
template <typename E, typename T>
void add_position_grads(const TileOps<T>& passes, const DisentangledProblem<E>& p,
                        const PositionTiles<T>& grads, int64_t row0, int64_t rows, int64_t kt0,
                        int64_t n, const T* dtile) {
  const int32_t* delta = tile_delta(p, row0, rows, kt0);
  if (delta[0] == delta[n + rows - 2]) {
    passes.accumulate_uniform_position_grads(
        dtile, rows, n, grads.c2p_t == nullptr ? nullptr : grads.c2p_t + delta[0] * kQueryBlock,
        grads.p2c_t == nullptr ? nullptr : grads.p2c_t + delta[0] * grads.p2c_ld + kt0);
    return;
  }
  passes.shear_tile(dtile, rows, n, grads.diag, kQueryBlock);
  passes.accumulate_position_grads(grads.diag, rows, n, kQueryBlock, delta, grads.c2p_t,
                                   kQueryBlock, grads.p2c_t, grads.p2c_ld,
                                   tile_first_column(rows, kt0));
}

// Masks row r (query i) of a tile of scores over keys [kt0, kt0 + n); returns the row max: -inf
// when the row sees none of these keys or they all score -inf, NaN when they score NaN (the max
// skips NaN, which would then leave the row at zero where torch's softmax gives NaN).
template <typename E, typename T>
T score_row(const TileOps<T>& passes, const DisentangledProblem<E>& p, const Unit<E>& unit,
            int64_t i, int64_t kt0, int64_t n, T* row) {
  const auto& s = p.shape;
  const T m = passes.mask_row(row, n, p.mask.keep(unit.b, i, kt0, s.q_len, s.k_len));
  if (m != -std::numeric_limits<T>::infinity()) return m;
  const bool any_nan = std::any_of(row, row + n, [](T x) { return std::isnan(x); });
  return any_nan ? std::numeric_limits<T>::quiet_NaN() : m;
}

// Probabilities of a row whose softmax is NaN: NaN at the keys it keeps, zero at the masked ones
// (HF zeroes those after the softmax).
template <typename E, typename T>
void nan_probabilities(const DisentangledProblem<E>& p, const Unit<E>& unit, int64_t i, T* prow) {
  const auto& s = p.shape;
  const uint8_t* keep = p.mask.keep(unit.b, i, 0, s.q_len, s.k_len);
  for (int64_t j = 0; j < unit.keys; ++j) {
    prow[j] = keep == nullptr || keep[j] != 0 ? std::numeric_limits<T>::quiet_NaN() : T(0);
  }
}

// Whether query row i keeps every key. A row that sees no key is a masked row (zero output, as
// HF, whose softmax then falls back on the masked scores' dtype minimum and zeroes them) unless
// it keeps every key: then its scores were all -inf, and softmax over them is NaN.
template <typename E>
bool keeps_every_key(const DisentangledProblem<E>& p, const Unit<E>& unit, int64_t i) {
  const auto& s = p.shape;
  if (p.mask.k_extent[unit.b] < s.k_len) return false;
  const uint8_t* keep = p.mask.keep(unit.b, i, 0, s.q_len, s.k_len);
  return keep == nullptr || std::all_of(keep, keep + s.k_len, [](uint8_t k) { return k != 0; });
}

// The online softmax of a query block: running max and sum per row, and the rows' output
// accumulator (row stride ld_acc, dv values a row).
template <typename T>
struct OnlineSoftmax {
  T* max;
  T* sum;
  T* acc;
  int64_t ld_acc;
};

// Forward of one tile of scaled scores (rows of the block from row0, keys [kt0, kt0 + n), row
// stride ld): masks each row, folds it into the block's online softmax (rescaling the row's
// accumulator when its max grows) and leaves the (dropped) unnormalised probabilities in the
// tile, zero where a row contributes nothing and in the padding columns. With `probs` (the
// block's first row of the probabilities), the masked scores are kept there for the final pass.
template <typename E, typename T>
void softmax_tile_rows(const TileOps<T>& passes, const DisentangledProblem<E>& p,
                       const Unit<E>& unit, int64_t row0, int64_t rows, int64_t kt0, int64_t n,
                       T* tile, int64_t ld, const OnlineSoftmax<T>& st, T* probs) {
  const auto& s = p.shape;
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = row0 + r;
    T* row = tile + r * ld;
    std::fill(row + n, row + ld, T(0));
    if (!query_row_alive(p, unit.b, i)) {
      std::fill(row, row + n, T(0));
      continue;
    }
    const T tile_max = score_row(passes, p, unit, i, kt0, n, row);
    const T m_new = std::isnan(tile_max) ? tile_max : std::max(st.max[r], tile_max);  // NaN sticks
    if (probs != nullptr) std::memcpy(probs + r * s.k_len + kt0, row, n * sizeof(T));
    if (m_new == kNegInf) {  // nothing seen yet: contributes nothing
      std::fill(row, row + n, T(0));
      continue;
    }
    const T correction = st.max[r] == kNegInf ? T(0) : std::exp(st.max[r] - m_new);
    st.sum[r] = st.sum[r] * correction + passes.exp_row(row, n, m_new);
    st.max[r] = m_new;
    if (correction != T(1)) {
      T* acc = st.acc + r * st.ld_acc;
      for (int64_t c = 0; c < s.dv; ++c) acc[c] *= correction;
    }
    if (p.dropout_p > T(0)) passes.dropout_row(row, n, row_dropout(p, unit.index, i), kt0);
  }
}

// The end of a block's forward: per row, store(r, factor) writes the output row as its
// accumulator times factor (1 / sum, or NaN where the softmax is NaN), the log-sum-exp goes to
// lse (the block's first row) and, with probs, the kept scores become probabilities. A row that
// sees no key keeps a zero output, probabilities and lse +inf.
template <typename E, typename T, typename Store>
void finish_softmax_rows(const TileOps<T>& passes, const DisentangledProblem<E>& p,
                         const Unit<E>& unit, int64_t row0, int64_t rows, const T* max,
                         const T* sum, T* lse, T* probs, Store&& store) {
  const auto& s = p.shape;
  for (int64_t r = 0; r < rows; ++r) {
    T* prow = probs == nullptr ? nullptr : probs + r * s.k_len;
    if (sum[r] == T(0) && !keeps_every_key(p, unit, row0 + r)) {
      if (prow != nullptr) std::fill(prow, prow + unit.keys, T(0));
      continue;
    }
    if (sum[r] == T(0) || std::isnan(sum[r])) {  // scores all -inf, or NaN: softmax is NaN
      constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();
      store(r, kNaN);
      lse[r] = kNaN;
      if (prow != nullptr) nan_probabilities(p, unit, row0 + r, prow);
      continue;
    }
    store(r, T(1) / sum[r]);
    const T row_lse = max[r] + std::log(sum[r]);
    lse[r] = row_lse;
    if (prow == nullptr) continue;
    passes.exp_row(prow, unit.keys, row_lse);
    if (p.dropout_p > T(0)) {
      passes.dropout_row(prow, unit.keys, row_dropout(p, unit.index, row0 + r), 0);
    }
  }
}

// D of the block's rows (from first_row): d[r] = rowsum(dO * O) (+ rowsum(probs * grad_probs)),
// accumulated in T.
template <typename E, typename T>
void block_row_dots(const DisentangledShape<T>& s, const DisentangledBackwardInputs<E>& in,
                    int64_t first_row, int64_t rows, T* d) {
  for (int64_t r = 0; r < rows; ++r) {
    const E* go = in.grad_out + (first_row + r) * s.dv;
    const E* out = in.out + (first_row + r) * s.dv;
    T sum = T(0);
    for (int64_t c = 0; c < s.dv; ++c) sum += static_cast<T>(go[c]) * static_cast<T>(out[c]);
    if (in.grad_probs != nullptr) {
      const E* gp = in.grad_probs + (first_row + r) * s.k_len;
      const E* pr = in.probs + (first_row + r) * s.k_len;
      for (int64_t j = 0; j < s.k_len; ++j) sum += static_cast<T>(pr[j]) * static_cast<T>(gp[j]);
    }
    d[r] = sum;
  }
}

// Backward of one tile (row stride ld) from its recomputed scaled scores (tile, position terms
// included) and dP = dO V^T (dtile): adds dL/d(probabilities), then leaves the dropped
// probabilities in tile and the score gradients (times scale) in dtile, zero in rows that see no
// key and in the padding columns. lse and d are the block's.
template <typename E, typename T>
void softmax_grad_tile_rows(const TileOps<T>& passes, const DisentangledProblem<E>& p,
                            const Unit<E>& unit, const DisentangledBackwardInputs<E>& in,
                            int64_t row0, int64_t rows, int64_t kt0, int64_t n, T* tile, T* dtile,
                            int64_t ld, const T* lse, const T* d) {
  const auto& s = p.shape;
  const int64_t first_row = unit.index * s.q_len + row0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = row0 + r;
    T* row = tile + r * ld;
    T* drow = dtile + r * ld;
    std::fill(row + n, row + ld, T(0));
    std::fill(drow + n, drow + ld, T(0));
    if (lse[r] == std::numeric_limits<T>::infinity()) {  // a row that sees no key
      std::fill(row, row + n, T(0));
      std::fill(drow, drow + n, T(0));
      continue;
    }
    if (in.grad_probs != nullptr) {
      const E* gp = in.grad_probs + (first_row + r) * s.k_len + kt0;
      for (int64_t j = 0; j < n; ++j) drow[j] += static_cast<T>(gp[j]);
    }
    score_row(passes, p, unit, i, kt0, n, row);
    const RowDropout<T> dropout = row_dropout(p, unit.index, i);
    passes.softmax_grad_row(row, drow, n, lse[r], d[r], s.scale,
                            p.dropout_p > T(0) ? &dropout : nullptr, kt0);
  }
}

}  // namespace recops::attention::kernels

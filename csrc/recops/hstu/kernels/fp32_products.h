// The fp32 precision of the HSTU-family kernels (fp32 and float64 inputs): Fp32Precision, the
// policy hstu_attention.h's bodies run on, with its tile products on fp32_operands.h's per-thread
// K^T and V^T.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "recops/attention/kernels/bf16_layouts.h"
#include "recops/attention/kernels/tile_variants.h"
#include "recops/common/blas.h"
#include "recops/common/prefetch.h"
#include "recops/hstu/kernels/batch.h"
#include "recops/hstu/kernels/block_schedule.h"
#include "recops/hstu/kernels/fp32_operands.h"
#include "recops/hstu/kernels/mask_and_bias.h"

namespace recops::attention::kernels {

// Scales `rows` rows of `cols` values (row stride ld) by alpha.
template <typename T>
void scale_rows(T* x, int64_t rows, int64_t cols, int64_t ld, T alpha) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) x[r * ld + c] *= alpha;
  }
}

// Whether every sequence's queries fit one query block (a serving step's new rows). A forward
// then reads each sequence's keys in one block only, so it reads K in place: laying out K^T
// first, a write and a read of a whole copy of K, pays off only when several blocks reuse it.
inline bool one_block_per_sequence(const Sequences& seqs) {
  for (int64_t b = 0; b < seqs.count; ++b) {
    if (seqs.q_length[b] > seqs.query_block) return false;
  }
  return true;
}

// The leading dimension of the padded weights (the value product's A operand) is the block's
// keys rounded up to this. The brgemm keeps a kernel per leading dimension, and a server's
// histories grow by a few rows a request: rounded to the granule (16), nearly every request
// generated kernels anew (about 60 us each, and 24 KB kept), over the 288 leading dimensions a
// 4608-row model has; rounded to 256, 18.
constexpr int64_t kWeightsGranule = 256;

// The forward's per-thread scratch: the tiles, and either the sequence's K^T (k_t) or, when K is
// read in place (one_block_per_sequence), a block's operands padded to the brgemm granule
// (gemm_nn): Q^T [Dqk, cols] and S^T [keys, cols] with cols = rows rounded up, the weights
// [cols, keys rounded up to kWeightsGranule] and their product with V [cols, Dv]. A product with
// one query row is then a brgemm on 16 columns, not a gemv, which the BLAS runs on its generic path
// on some CPUs (MKL's on AMD).
template <typename T>
struct Fp32ForwardScratch : TileArena<T> {
  Fp32ForwardScratch(int tiles, int64_t rows, const Sequences& seqs, bool with_buckets,
                     int64_t slot, const HstuShape<T>& shape, const Rows<T>& k,
                     const TileOps<T>& passes, bool in_place)
      : TileArena<T>(tiles, rows, seqs.longest, with_buckets, slot),
        k_t(in_place
                ? nullptr
                : std::make_unique<SequenceTransposes<T>>(seqs, k, shape.heads, shape.dqk, passes)),
        q_t(in_place ? new T[kQueryBlock * shape.dqk] : nullptr),
        s_t(in_place ? new T[kQueryBlock * seqs.longest] : nullptr),
        weights(in_place ? new T[kQueryBlock * round_up(seqs.longest, kWeightsGranule)] : nullptr),
        values(in_place ? new T[kQueryBlock * shape.dv] : nullptr) {}
  std::unique_ptr<SequenceTransposes<T>> k_t;
  std::unique_ptr<T[]> q_t, s_t, weights, values;  // uninitialised: each use writes first
};

// The backward's per-thread scratch: tiles, key-side gradients and the sequence's K^T and V^T.
template <typename T>
struct Fp32BackwardScratch : BackwardScratch<TileArena<T>, KeyGradients<T>> {
  Fp32BackwardScratch(int tiles, int64_t rows, const Sequences& seqs, bool with_buckets,
                      int64_t slot, const HstuShape<T>& s, const HstuTensors<T>& in,
                      const TileOps<T>& passes)
      : BackwardScratch<TileArena<T>, KeyGradients<T>>{TileArena<T>(tiles, rows, seqs.longest,
                                                                    with_buckets, slot),
                                                       KeyGradients<T>(
                                                           s.heads, s.dqk, s.dv, s.dqk, s.dv,
                                                           unaliased_ld(seqs.longest), 1, s.alpha)},
        k_t(seqs, in.k, s.heads, s.dqk, passes),
        v_t(seqs, in.v, s.heads, s.dv, passes) {}
  SequenceTransposes<T> k_t, v_t;
};

// The fp32 precision policy: K^T (unless a forward reads K in place, one_block_per_sequence) and,
// for backward, V^T laid out per thread as blocks need them, tiles of rows_pad = rows query rows
// and `keys` keys (no padding), products on gemm_nn straight from the inputs' rows, the SiLU pass
// in place on the fp32 score tile.
template <typename T>
class Fp32Precision {
 public:
  using Element = T;  // of q, k, v, the output and its gradient
  using Compute = T;  // of the tiles and the gradients
  using Scratch = Fp32ForwardScratch<T>;
  using BackwardScratch = Fp32BackwardScratch<T>;
  using Weights = const T*;  // a tile of weights for weighted_values

  Fp32Precision(const Sequences& seqs, const HstuShape<T>& shape, const HstuTensors<T>& in,
                bool backward)
      : seqs_(seqs),
        shape_(shape),
        in_(in),
        passes_(tile_ops<T>()),
        k_in_place_(!backward && one_block_per_sequence(seqs)) {}

  const Sequences& sequences() const { return seqs_; }
  const HstuShape<T>& shape() const { return shape_; }
  const Rows<Element>& values() const { return in_.v; }
  Scratch scratch(int tiles, bool with_buckets, int64_t slot) const {
    return Scratch(tiles, tile_rows(seqs_, 1), seqs_, with_buckets, slot, shape_, in_.k, passes_,
                   k_in_place_);
  }
  BackwardScratch backward_scratch(int tiles, bool with_buckets, int64_t slot) const {
    return BackwardScratch(tiles, tile_rows(seqs_, 1), seqs_, with_buckets, slot, shape_, in_,
                           passes_);
  }
  PaddedBlock pad(const Block& blk) const { return {blk, blk.rows}; }
  // The SiLU passes run on a structured mask's visible runs (silu_on_visible_runs): only a custom
  // mask needs a tile, forward and backward.
  bool forward_mask_tile(const MaskSource<T>& mask) const { return mask.kind == MaskKind::kCustom; }
  bool backward_mask_tile(const MaskSource<T>& mask) const {
    return mask.kind == MaskKind::kCustom;
  }
  void begin_forward_block(Scratch&, const MaskSource<T>&, const PaddedBlock&) const {}
  // The weights of a tile are the fp32 tile itself.
  void round_weights(TileArena<T>&, const PaddedBlock&, int, int, bool) const {}
  Weights weights(TileArena<T>& t, int tile, int) const { return t.tile(tile); }

  // out rows (row stride ld_out) = W V for head h of the block, run by run of key rows.
  void weighted_values(Scratch& t, const PaddedBlock& pb, int64_t h, Weights w, T* out,
                       int64_t ld_out) const {
    const Block& blk = pb.blk;
    if (k_in_place_) {
      padded_weighted_values(t, blk, h, w, out, ld_out);
      return;
    }
    seqs_.keys.for_each_run(blk.b, blk.key0, blk.keys, [&](int64_t row, int64_t key, int64_t n) {
      gemm_nn(blk.rows, shape_.dv, n, w + (key - blk.key0), blk.keys, in_.v.at(row, h, shape_.dv),
              in_.v.stride, out, ld_out, key != blk.key0);
    });
  }

  // out rows = silu(alpha Q K^T + bias) * scale * mask V for head h (bias null: none), the
  // scores in s (in the brgemm path reading K in place, in the scratch's padded weights instead).
  void silu_head_forward(Scratch& t, const MaskSource<T>& mask_source, const PaddedBlock& pb,
                         int64_t h, const T* bias, const T* mask, T* s, T* out,
                         int64_t ld_out) const {
    const Block& blk = pb.blk;
    if (k_in_place_ && blk.rows > kDotRows) {
      // The SiLU pass runs on the weights' rows where the transposed scores land, so that the
      // tile is neither transposed into s nor copied back out of it.
      streamed_scores_into_weights(t, blk, h);
      silu_on_visible_runs(mask_source, blk, t.weights.get(), padded_keys(blk), nullptr, bias, mask,
                           [&](T* scores, T*, const T* b, const T* m, int64_t n) {
                             passes_.silu_scores(scores, b, m, n, shape_.alpha, shape_.silu_scale);
                           });
      padded_product(t, blk, h, out, ld_out);
      return;
    }
    if (!k_in_place_) {
      gemm_nn(blk.rows, blk.keys, shape_.dqk, in_.q.at(query_row(blk), h, shape_.dqk), in_.q.stride,
              t.k_t->columns(blk.b, h, blk.key0, blk.keys), t.k_t->ld(), s, blk.keys, false);
    } else {
      key_row_scores(blk, h, s);
    }
    silu_on_visible_runs(mask_source, blk, s, blk.keys, nullptr, bias, mask,
                         [&](T* scores, T*, const T* b, const T* m, int64_t n) {
                           passes_.silu_scores(scores, b, m, n, shape_.alpha, shape_.silu_scale);
                         });
    weighted_values(t, pb, h, s, out, ld_out);
  }

  // Backward of head h of a block of silu attention (HSTU; FuXi-alpha's semantic channel):
  // recomputes S = Q K^T and dA = dO V^T, turns them into A (in s) and dS (in ds) with the mask
  // and optional bias tiles, then dQ = alpha dS K (written to dq, row stride ld_dq),
  // dK^T += Q^T dS (alpha applied once, as the item's dK is written: the gradients' dk_scale) and
  // dV^T += dO^T A, both reading Q and dO transposed where they lie (gemm_tn). `go` is the head's
  // dO with row stride ld_go.
  void silu_head_backward(BackwardScratch& scratch, const MaskSource<T>& mask_source,
                          const PaddedBlock& pb, int64_t h, const T* go, int64_t ld_go,
                          const T* bias, const T* mask, T* s, T* ds, T* dq, int64_t ld_dq) const {
    const Block& blk = pb.blk;
    const int64_t dqk = shape_.dqk, dv = shape_.dv;
    KeyGradients<T>& tg = scratch.grads;
    const T* q = in_.q.at(query_row(blk), h, dqk);
    gemm_nn(blk.rows, blk.keys, dqk, q, in_.q.stride,
            scratch.k_t.columns(blk.b, h, blk.key0, blk.keys), scratch.k_t.ld(), s, blk.keys,
            false);
    gemm_nn(blk.rows, blk.keys, dv, go, ld_go, scratch.v_t.columns(blk.b, h, blk.key0, blk.keys),
            scratch.v_t.ld(), ds, blk.keys, false);
    silu_on_visible_runs(mask_source, blk, s, blk.keys, ds, bias, mask,
                         [&](T* scores, T* grads, const T* b, const T* m, int64_t n) {
                           passes_.silu_score_grads(scores, grads, b, m, n, shape_.alpha,
                                                    shape_.silu_scale);
                         });
    seqs_.keys.for_each_run(blk.b, blk.key0, blk.keys, [&](int64_t row, int64_t key, int64_t n) {
      gemm_nn(blk.rows, dqk, n, ds + (key - blk.key0), blk.keys, in_.k.at(row, h, dqk),
              in_.k.stride, dq, ld_dq, key != blk.key0);
    });
    scale_rows(dq, blk.rows, dqk, ld_dq, shape_.alpha);
    gemm_tn(dqk, blk.keys, blk.rows, q, in_.q.stride, ds, blk.keys, tg.dk_t(h, blk.key0), tg.ld(),
            true);
    gemm_tn(dv, blk.keys, blk.rows, go, ld_go, s, blk.keys, tg.dv_t(h, blk.key0), tg.ld(), true);
  }

  // A channel of fixed weights W (FuXi-alpha's bias channels), head h, dO_c = go (row stride
  // ld_go): dV^T += dO_c^T W, and s = dO_c V^T (the weights' gradient before the mask).
  void weights_backward(BackwardScratch& scratch, const PaddedBlock& pb, int64_t h, const T* go,
                        int64_t ld_go, Weights w, T* s) const {
    const Block& blk = pb.blk;
    KeyGradients<T>& tg = scratch.grads;
    gemm_tn(shape_.dv, blk.keys, blk.rows, go, ld_go, w, blk.keys, tg.dv_t(h, blk.key0), tg.ld(),
            true);
    gemm_nn(blk.rows, blk.keys, shape_.dv, go, ld_go,
            scratch.v_t.columns(blk.b, h, blk.key0, blk.keys), scratch.v_t.ld(), s, blk.keys,
            false);
  }

 private:
  int64_t query_row(const Block& blk) const { return seqs_.query_row(blk.b, blk.row0); }

  // pass(s, g, bias, mask, n) on each row's visible runs (for_each_row_runs) of a block's tile s
  // (row stride ld; g, a second tile at the same places, may be null), the bias and mask tiles
  // (row stride blk.stride(), either null) at the run's keys; zeros in s and g around the runs.
  // Under a structured mask no mask tile is built or read, and the hidden half of the diagonal
  // blocks costs no SiLU; a custom mask's one run is the whole row, with its tile.
  template <typename Pass>
  void silu_on_visible_runs(const MaskSource<T>& mask_source, const Block& blk, T* s, int64_t ld,
                            T* g, const T* bias, const T* mask, Pass&& pass) const {
    const int64_t tile_ld = blk.stride();
    for_each_row_run_and_gap(
        mask_source, blk, blk.keys,
        [&](int64_t r, int64_t begin, int64_t end) {
          const int64_t at = r * tile_ld + begin;
          pass(s + r * ld + begin, g == nullptr ? nullptr : g + r * ld + begin,
               bias == nullptr ? nullptr : bias + at, mask == nullptr ? nullptr : mask + at,
               end - begin);
        },
        [&](int64_t r, int64_t begin, int64_t end) {
          std::fill(s + r * ld + begin, s + r * ld + end, T(0));
          if (g != nullptr) std::fill(g + r * ld + begin, g + r * ld + end, T(0));
        });
  }

  // fn(first row, key, n) for the block's keys in pieces of n <= kStreamRows key rows of `rows`
  // (head h, `cols` values each), run by run of rows, each piece whole brgemm granules but a
  // run's last; before fn sees a piece, the first `ahead` rows of the next one (in this run or,
  // in a paged cache, on the next page) are prefetched. The keys stream from memory (a serving
  // step reads each once), and neither the brgemm nor the hardware prefetcher runs far enough
  // ahead of the products.
  static constexpr int64_t kStreamRows = 4 * kBrgemmGranule;
  template <typename Fn>
  void for_each_streamed_piece(const Block& blk, const Rows<T>& rows, int64_t h, int64_t cols,
                               int64_t ahead, Fn&& fn) const {
    const KeyRows& keys = seqs_.keys;
    const int64_t end = blk.key0 + blk.keys;
    const auto piece_end = [&](int64_t key) {
      const int64_t stop = keys.run_end(key, end);
      const int64_t whole = std::min(kStreamRows, (stop - key) / kBrgemmGranule * kBrgemmGranule);
      return whole > 0 ? key + whole : stop;
    };
    const auto first_row = [&](int64_t key) { return rows.at(keys.row(blk.b, key), h, cols); };
    for (int64_t key = blk.key0; key < end;) {
      const int64_t next = piece_end(key);
      if (next < end) {
        prefetch_rows(first_row(next), rows.stride, 0, std::min(ahead, piece_end(next) - next),
                      cols);
      }
      fn(first_row(key), key, next - key);
      key = next;
    }
  }

  // Blocks of at most this many query rows multiply vector by vector (TileOps' key_row_dots,
  // weighted_value_rows); larger ones on the brgemm, padded to whole granules of rows. With
  // key_row_dots' accumulators in registers the vector path is the faster up to 16 rows (B = 16
  // sequences of 2048 cold keys, H = 2, D = 64, AMD EPYC: 8 rows 3.5-4.0 -> 2.7-2.8 ms, 16 rows
  // 4.0-4.3 -> 3.3-3.8 ms against the brgemm path).
  static constexpr int64_t kDotRows = 16;

  static int64_t padded_rows(const Block& blk) { return round_up(blk.rows, kBrgemmGranule); }
  static int64_t padded_keys(const Block& blk) { return round_up(blk.keys, kWeightsGranule); }

  // s = Q K^T of a block of at most kDotRows rows, dot products with K's rows in place.
  void key_row_scores(const Block& blk, int64_t h, T* s) const {
    const int64_t dqk = shape_.dqk;
    for_each_streamed_piece(
        blk, in_.k, h, dqk, kPrefetchRowsAhead, [&](const T* k, int64_t key, int64_t n) {
          passes_.key_row_dots(in_.q.at(query_row(blk), h, dqk), in_.q.stride, blk.rows, k,
                               in_.k.stride, n, dqk, s + (key - blk.key0), blk.keys);
        });
  }

  // The scratch's weights [cols, padded_keys] = Q K^T of a block (cols = rows rounded up),
  // reading K's rows in place: S^T = K Q^T run by run of key rows (Q^T padded with zero columns),
  // transposed into the weights. Rows past the block's are zero (Q^T's zero columns); columns
  // past its keys are left as they are (no product reads them).
  void streamed_scores_into_weights(Scratch& t, const Block& blk, int64_t h) const {
    const int64_t dqk = shape_.dqk, rows = blk.rows, cols = padded_rows(blk);
    const int64_t ld = padded_keys(blk);
    T* q_t = t.q_t.get();
    transpose(rows, dqk, in_.q.at(query_row(blk), h, dqk), in_.q.stride, q_t, cols);
    for (int64_t d = 0; d < dqk; ++d) std::fill(q_t + d * cols + rows, q_t + (d + 1) * cols, T(0));
    T* s_t = t.s_t.get();
    for_each_streamed_piece(blk, in_.k, h, dqk, kStreamRows,
                            [&](const T* k, int64_t key, int64_t n) {
                              gemm_nn(n, cols, dqk, k, in_.k.stride, q_t, cols,
                                      s_t + (key - blk.key0) * cols, cols, false);
                            });
    passes_.transpose(s_t, blk.keys, cols, cols, t.weights.get(), ld);
  }

  // out rows = (the scratch's padded weights) V for head h, V's key rows read in place: their
  // product in a [cols, Dv] scratch, whose first rows are the output.
  void padded_product(Scratch& t, const Block& blk, int64_t h, T* out, int64_t ld_out) const {
    const int64_t dv = shape_.dv, ld = padded_keys(blk);
    const T* weights = t.weights.get();
    for_each_streamed_piece(blk, in_.v, h, dv, kStreamRows,
                            [&](const T* v, int64_t key, int64_t n) {
                              gemm_nn(padded_rows(blk), dv, n, weights + (key - blk.key0), ld, v,
                                      in_.v.stride, t.values.get(), dv, key != blk.key0);
                            });
    for (int64_t r = 0; r < blk.rows; ++r)
      std::copy_n(t.values.get() + r * dv, dv, out + r * ld_out);
  }

  // weighted_values reading V in place: row by row for a few rows; else W copied into the
  // scratch's weights (the padding rows zero; no product reads past the keys) and padded_product.
  void padded_weighted_values(Scratch& t, const Block& blk, int64_t h, const T* w, T* out,
                              int64_t ld_out) const {
    const int64_t rows = blk.rows;
    if (rows <= kDotRows) {
      for_each_streamed_piece(
          blk, in_.v, h, shape_.dv, kPrefetchRowsAhead, [&](const T* v, int64_t key, int64_t n) {
            passes_.weighted_value_rows(w + (key - blk.key0), blk.keys, rows, v, in_.v.stride, n,
                                        shape_.dv, out, ld_out, key != blk.key0);
          });
      return;
    }
    const int64_t ld = padded_keys(blk);
    T* weights = t.weights.get();
    for (int64_t r = 0; r < padded_rows(blk); ++r) {
      T* dst = weights + r * ld;
      if (r < rows) {
        std::copy_n(w + r * blk.keys, blk.keys, dst);
      } else {
        std::fill_n(dst, blk.keys, T(0));
      }
    }
    padded_product(t, blk, h, out, ld_out);
  }

  const Sequences& seqs_;
  HstuShape<T> shape_;
  HstuTensors<T> in_;
  const TileOps<T>& passes_;
  bool k_in_place_;  // a forward whose every sequence is one block reads K in place
};

}  // namespace recops::attention::kernels

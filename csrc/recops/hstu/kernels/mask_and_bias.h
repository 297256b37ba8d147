// The mask and the bias of the HSTU family's score tiles, and the tiles a query block builds from
// them. The mask: the structured HSTU mask of one sequence (docs/ops.md section 4), as
// generative-recommenders builds it (causal or two-sided, with contextual tokens, targets,
// optionally in groups, and a window), or custom multipliers; it also gives the keys a query block
// may see (MaskSource::block), so blocks skip the rest. The bias: dense, or relative (time and
// position tables, in-tile). The tiles: per block the mask tile, the bias tile (HSTU) or the
// masked bias tiles of FuXi-alpha's time and position channels, and the bias gradients scattered
// back from a tile.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "recops/attention/kernels/tile_variants.h"
#include "recops/hstu/kernels/batch.h"
#include "recops/hstu/kernels/relative_bias_math.h"

namespace recops::attention::kernels {

// ---- The mask.
//
// Every rule of the structured mask is monotone in the position ids, so each query row sees a
// union of at most four key intervals; rows are filled interval by interval instead of testing
// every key.

enum class MaskKind : int { kCausal = 0, kNone = 1, kCustom = 2 };

struct StructuredMask {
  bool causal = true;
  int64_t length = 0;             // n
  int64_t contextual_len = 0;     // c
  int64_t num_targets = 0;        // t
  int64_t target_group_size = 1;  // g
  int64_t max_attn_len = 0;       // w, 0 = no window

  int64_t top() const {
    return length - num_targets - (contextual_len > 0 ? contextual_len - 1 : 0);
  }
  // Whether row i sees exactly keys [0, i]: causal, without contextual tokens, targets or window.
  bool plain_causal() const {
    return causal && contextual_len == 0 && num_targets == 0 && max_attn_len == 0;
  }
  int64_t first_target() const { return length - num_targets; }

  // id(p): context tokens share id 0, targets share id top().
  int64_t id(int64_t p) const {
    const int64_t raw = contextual_len > 0 ? std::max<int64_t>(p - contextual_len + 1, 0) : p;
    return std::min(raw, top());
  }

  // First position whose id is >= x (length when none), in closed form (it runs a few times per
  // query row of every tile): ids start at min(0, top()), never decrease and never pass top(); in
  // between, id(p) >= x exactly when p - c + 1 >= x (p >= x without contextual tokens).
  int64_t first_with_id_at_least(int64_t x) const {
    if (std::min<int64_t>(0, top()) >= x) return 0;
    if (top() < x) return length;
    return std::min(length, contextual_len > 0 ? x + contextual_len - 1 : x);
  }

  // The key intervals [begin, end) query row i sees; returns how many (<= 4) were written.
  int visible_intervals(int64_t i, int64_t begin[4], int64_t end[4]) const {
    int count = 0;
    auto add = [&](int64_t b, int64_t e) {
      if (b < e) {
        begin[count] = b;
        end[count] = e;
        ++count;
      }
    };
    const int64_t di = id(i);
    const bool windowed = max_attn_len > 0;
    // d = id(i) - id(j) (causal) or |id(i) - id(j)|; keys with 0 < d <= w, and i itself.
    const int64_t window_begin = windowed ? first_with_id_at_least(di - max_attn_len) : 0;
    const int64_t same_id_begin = first_with_id_at_least(di);
    add(window_begin, same_id_begin);
    if (!causal) {
      const int64_t after_same_id = first_with_id_at_least(di + 1);
      const int64_t window_end = windowed ? first_with_id_at_least(di + max_attn_len + 1) : length;
      add(after_same_id, window_end);
    }
    add(i, i + 1);
    // Context tokens (id 0) see every non-target token.
    if (contextual_len > 0 && di == 0) add(0, first_with_id_at_least(top()));
    // A target sees the earlier (causal) or all (two-sided) members of its group.
    const int64_t first = first_target();
    if (target_group_size > 1 && num_targets > 0 && i >= first) {
      const int64_t group_begin = first + (i - first) / target_group_size * target_group_size;
      add(group_begin, causal ? i + 1 : std::min(group_begin + target_group_size, length));
    }
    return count;
  }

  // Keys [*begin, *end) that some row of [row_begin, row_end) may see; blocks skip the rest.
  // Interval bounds never decrease with the row's id, so the block's first row bounds every
  // begin and its last row every end, except for context rows, which see from key 0.
  void key_range(int64_t row_begin, int64_t row_end, int64_t* begin, int64_t* end) const {
    const bool has_context_rows = contextual_len > 0 && id(row_begin) == 0;
    const int64_t first_id = id(row_begin), last_id = id(row_end - 1);
    int64_t lo =
        max_attn_len > 0 ? std::min(row_begin, first_with_id_at_least(first_id - max_attn_len)) : 0;
    int64_t hi = row_end;
    if (!causal) {
      hi = max_attn_len > 0 ? std::max(hi, first_with_id_at_least(last_id + max_attn_len + 1))
                            : length;
      if (target_group_size > 1) hi = length;
    }
    if (has_context_rows) {
      lo = 0;
      hi = std::max(hi, first_with_id_at_least(top()));
    }
    *begin = lo;
    *end = std::min(hi, length);
  }
};

// A batch's mask: the structured mask's parameters, or custom multipliers.
template <typename T>
struct MaskSource {
  MaskKind kind = MaskKind::kCausal;
  int64_t contextual_len = 0, target_group_size = 1, max_attn_len = 0;
  const int64_t* num_targets = nullptr;  // [B] or null
  // kCustom: multipliers [Bm, Hm, N, N] contiguous; stride 0 on a broadcast dim.
  const T* custom = nullptr;
  int64_t custom_stride_b = 0, custom_stride_h = 0, custom_stride_row = 0;

  bool per_head() const { return kind == MaskKind::kCustom && custom_stride_h != 0; }

  StructuredMask structured(int64_t b, int64_t length) const {
    StructuredMask m;
    m.causal = kind == MaskKind::kCausal;
    m.length = length;
    m.contextual_len = contextual_len;
    m.num_targets = num_targets == nullptr ? 0 : num_targets[b];
    m.target_group_size = target_group_size;
    m.max_attn_len = max_attn_len;
    return m;
  }

  // Query rows [row0, row0 + rows) of sequence b (`length` rows) with the keys they may see: all
  // of them for a custom mask, else the structured mask's key_range.
  Block block(int64_t b, int64_t length, int64_t row0, int64_t rows) const {
    Block blk{b, length, row0, rows, 0, 0};
    int64_t key_end = length;
    if (kind != MaskKind::kCustom) {
      structured(b, length).key_range(row0, row0 + rows, &blk.key0, &key_end);
    }
    blk.keys = key_end - blk.key0;
    return blk;
  }
};

// ---- The bias.

enum class BiasKind : int { kNone = 0, kDense = 1, kRelative = 2 };

template <typename T>
struct BiasSource {
  BiasKind kind = BiasKind::kNone;
  // kDense: fp32 [Bb, Hb, N, N] contiguous; stride 0 on a broadcast dim.
  const T* dense = nullptr;
  int64_t dense_stride_b = 0, dense_stride_h = 0, dense_stride_row = 0;
  // kRelative: key times per key row, query times per query row, ts_w [num_buckets + 1] and/or
  // pos_w [2N - 1] (a null table contributes nothing: FuXi-alpha keeps time and position in
  // separate channels).
  const double* key_time = nullptr;
  const double* query_time = nullptr;
  const T* ts_w = nullptr;
  const T* pos_w = nullptr;
  LogBucketizer::View buckets{};
  const TileOps<T>* passes = &tile_ops<T>();  // the time term's per-key passes

  bool per_head() const { return kind == BiasKind::kDense && dense_stride_h != 0; }
};

// The query time of every query row of the sequences (Sequences::query_row): the key time at
// query_time_index (the next item's with the shift, as HSTU / FuXi-alpha; the last its own).
inline void query_times(const Sequences& seqs, const double* key_time, bool query_time_shift,
                        double* query_time) {
  const KeyRows& keys = seqs.keys;
  for (int64_t b = 0; b < seqs.count; ++b) {
    for (int64_t i = seqs.first_query(b); i < keys.length[b]; ++i) {
      query_time[seqs.query_row(b, i)] =
          key_time[keys.row(b, query_time_index(i, keys.length[b], query_time_shift))];
    }
  }
}

// Gradient sinks for the bias: slices per thread slot, summed by the adapter. A dense bias with a
// batch dim needs no per-thread copies (items of one sequence own disjoint query rows): its
// thread stride is 0. Null sinks are skipped.
template <typename T>
struct BiasGrads {
  T* dense = nullptr;  // [threads, Bb, Hb, N, N]
  int64_t dense_thread_stride = 0;
  double* ts_w = nullptr;  // [threads, num_buckets + 1]
  int64_t ts_thread_stride = 0;
  double* pos_w = nullptr;  // [threads, 2N - 1]
  int64_t pos_thread_stride = 0;
};

// ---- The tiles of a query block.

// Zeroes rows [blk.rows, rows_pad) of a tile (rows of blk.stride() values): the query rows the
// bf16 kernels pad a block with.
template <typename T>
void zero_padded_rows(T* tile, const Block& blk, int64_t rows_pad) {
  std::fill(tile + blk.rows * blk.stride(), tile + rows_pad * blk.stride(), T(0));
}

template <typename T>
void build_mask_tile(const MaskSource<T>& src, const Block& blk, int64_t head, T* tile) {
  const StructuredMask structured = src.structured(blk.b, blk.length);
  for (int64_t r = 0; r < blk.rows; ++r) {
    T* row = tile + r * blk.stride();
    const int64_t i = blk.row0 + r;
    std::fill(row + blk.keys, row + blk.stride(), T(0));
    if (src.kind == MaskKind::kCustom) {
      const T* m = src.custom + blk.b * src.custom_stride_b + head * src.custom_stride_h +
                   i * src.custom_stride_row + blk.key0;
      std::memcpy(row, m, blk.keys * sizeof(T));
      continue;
    }
    std::fill(row, row + blk.keys, T(0));
    int64_t begin[4], end[4];
    const int n = structured.visible_intervals(i, begin, end);
    for (int k = 0; k < n; ++k) {
      const int64_t b = std::max(begin[k], blk.key0), e = std::min(end[k], blk.key0 + blk.keys);
      if (b < e) std::fill(row + (b - blk.key0), row + (e - blk.key0), T(1));
    }
  }
}

// The keys query row r of a block sees under a structured mask, as sorted, disjoint runs
// [begin[k], end[k]) of tile columns (keys relative to blk.key0, within [0, blk.keys)); returns
// their count (<= 4). The runs say what build_mask_tile's row would: ones inside, zeros outside.
inline int visible_runs(const StructuredMask& mask, const Block& blk, int64_t r, int64_t begin[4],
                        int64_t end[4]) {
  if (mask.plain_causal()) {  // the training masks: one run, without the intervals' case analysis
    begin[0] = 0;
    end[0] = std::min(blk.row0 + r + 1 - blk.key0, blk.keys);
    return end[0] > 0 ? 1 : 0;
  }
  int64_t b[4], e[4];
  const int n = mask.visible_intervals(blk.row0 + r, b, e);
  for (int k = 1; k < n; ++k) {  // insertion sort by begin (at most four intervals)
    for (int m = k; m > 0 && b[m] < b[m - 1]; --m) {
      std::swap(b[m], b[m - 1]);
      std::swap(e[m], e[m - 1]);
    }
  }
  int runs = 0;
  for (int k = 0; k < n; ++k) {
    const int64_t lo = std::max(b[k], blk.key0) - blk.key0;
    const int64_t hi = std::min(e[k], blk.key0 + blk.keys) - blk.key0;
    if (lo >= hi) continue;
    if (runs > 0 && lo <= end[runs - 1]) {  // overlaps or touches the previous run
      end[runs - 1] = std::max(end[runs - 1], hi);
    } else {
      begin[runs] = lo;
      end[runs] = hi;
      ++runs;
    }
  }
  return runs;
}

// fn(r, begin, end, runs) for each query row r of a block, with the `runs` runs of tile columns
// [begin[k], end[k]) it sees: a structured mask's visible_runs, or every key of the block under a
// custom mask (whose tile then gives the multipliers).
template <typename T, typename Fn>
void for_each_row_runs(const MaskSource<T>& mask, const Block& blk, Fn&& fn) {
  const StructuredMask structured = mask.structured(blk.b, blk.length);
  for (int64_t r = 0; r < blk.rows; ++r) {
    int64_t begin[4] = {0}, end[4] = {blk.keys};
    const int runs = mask.kind == MaskKind::kCustom ? (blk.keys > 0 ? 1 : 0)
                                                    : visible_runs(structured, blk, r, begin, end);
    fn(r, static_cast<const int64_t*>(begin), static_cast<const int64_t*>(end), runs);
  }
}

// run(r, begin, end) on each visible run of each query row r of a block (for_each_row_runs, in
// order) and hidden(r, begin, end) on the tile columns of [0, cols) around them (possibly empty
// ranges): a pass over the keys a row sees that writes what the mask hides itself, without a
// mask tile.
template <typename T, typename Run, typename Hidden>
void for_each_row_run_and_gap(const MaskSource<T>& mask, const Block& blk, int64_t cols, Run&& run,
                              Hidden&& hidden) {
  for_each_row_runs(mask, blk, [&](int64_t r, const int64_t* begin, const int64_t* end, int runs) {
    int64_t done = 0;
    for (int k = 0; k < runs; ++k) {
      hidden(r, done, begin[k]);
      run(r, begin[k], end[k]);
      done = end[k];
    }
    hidden(r, done, cols);
  });
}

// Bit j % 32 of visible[r * (ld / 32) + j / 32] is set when query row r of a block (ld a multiple
// of 32) sees tile column j; rows [blk.rows, rows_pad) see none.
template <typename T>
void fill_visibility(const MaskSource<T>& mask, const Block& blk, int64_t rows_pad,
                     uint32_t* visible) {
  const int64_t words = blk.ld / 32;
  std::fill(visible, visible + rows_pad * words, 0u);
  for_each_row_runs(mask, blk, [&](int64_t r, const int64_t* begin, const int64_t* end, int runs) {
    uint32_t* row = visible + r * words;
    for (int k = 0; k < runs; ++k) {
      for (int64_t w = begin[k] / 32; w * 32 < end[k]; ++w) {
        const int64_t lo = std::max(begin[k] - w * 32, int64_t{0});
        const int64_t hi = std::min(end[k] - w * 32, int64_t{32});
        row[w] |= static_cast<uint32_t>(((uint64_t{1} << hi) - 1) & ~((uint64_t{1} << lo) - 1));
      }
    }
  });
}

// bias tile; for the relative bias also the time bucket of every pair (reused by backward). The
// time term, a bucket lookup per pair, is computed for the keys each row sees under `mask` only
// (for_each_row_runs; half the tile under a causal mask): the others hold the position term and
// bucket 0, which the mask multiplies and the backward's zero gradient adds nothing to. A `masked`
// tile (M * bias, FuXi-alpha's weight channels) under a structured mask is written as such: the
// bias on the keys each row sees, zero elsewhere, with no mask tile to multiply it by.
template <typename T>
void build_bias_tile(const BiasSource<T>& src, const MaskSource<T>& mask, const Sequences& seqs,
                     const Block& blk, int64_t head, bool masked, T* tile, int32_t* bucket_tile) {
  const bool only_visible = masked && mask.kind != MaskKind::kCustom;
  // Row r of the tile: values[j] (key blk.key0 + j) where it counts, zeros elsewhere.
  const auto copy_row = [&](T* row, const T* values, int runs, const int64_t* begin,
                            const int64_t* end) {
    std::fill(row + blk.keys, row + blk.stride(), T(0));
    if (!only_visible) {
      std::memcpy(row, values, blk.keys * sizeof(T));
      return;
    }
    std::fill(row, row + blk.keys, T(0));
    for (int k = 0; k < runs; ++k) std::copy(values + begin[k], values + end[k], row + begin[k]);
  };
  if (src.kind == BiasKind::kDense) {
    for_each_row_runs(
        mask, blk, [&](int64_t r, const int64_t* begin, const int64_t* end, int runs) {
          copy_row(tile + r * blk.stride(),
                   src.dense + blk.b * src.dense_stride_b + head * src.dense_stride_h +
                       (blk.row0 + r) * src.dense_stride_row + blk.key0,
                   runs, begin, end);
        });
    return;
  }
  // Relative: ts_w[bucket(tq_i - t_j)] + pos_w[N - 1 + j - i].
  for_each_row_runs(mask, blk, [&](int64_t r, const int64_t* begin, const int64_t* end, int runs) {
    T* row = tile + r * blk.stride();
    const int64_t i = blk.row0 + r;
    if (src.pos_w != nullptr) {
      copy_row(row, src.pos_w + (seqs.max_len - 1 - i + blk.key0), runs, begin, end);
    } else {
      std::fill(row, row + blk.stride(), T(0));
    }
    if (src.ts_w == nullptr) return;
    int32_t* bucket_row = bucket_tile + r * blk.stride();
    std::fill(bucket_row, bucket_row + blk.keys, 0);
    const double query_time = src.query_time[seqs.query_row(blk.b, i)];
    for (int k = 0; k < runs; ++k) {
      seqs.keys.for_each_run(blk.b, blk.key0 + begin[k], end[k] - begin[k],
                             [&](int64_t key_row, int64_t key, int64_t n) {
                               src.passes->add_time_bias(
                                   src.key_time + key_row, n, query_time, src.buckets, src.ts_w,
                                   row + (key - blk.key0), bucket_row + (key - blk.key0));
                             });
    }
  });
}

// A bias tile of a block: its bias and the tile (null: none) that holds the bias (HSTU's, added
// to the scores) or, `masked`, M * bias (FuXi-alpha's weight channels).
template <typename T>
struct BiasTile {
  const BiasSource<T>& bias;
  T* tile;
  bool masked;
};

// The mask tile (unless mask_tile is null) and the bias tiles of head h, built for h == 0 and again
// for the heads they differ in (a per-head mask or bias; a masked bias changes with the mask);
// returns whether it rebuilt a masked bias tile. Rows [blk.rows, rows_pad) are zero (the bf16
// kernels' padding; rows_pad is blk.rows in the fp32 kernels); buckets receives the relative
// bias's time buckets.
template <typename T, size_t N>
bool build_head_tiles(const MaskSource<T>& mask, const Sequences& seqs, const Block& blk,
                      int64_t rows_pad, int64_t h, T* mask_tile,
                      const std::array<BiasTile<T>, N>& tiles, int32_t* buckets) {
  const bool new_mask = h == 0 || mask.per_head();
  if (mask_tile != nullptr && new_mask) {
    build_mask_tile(mask, blk, h, mask_tile);
    zero_padded_rows(mask_tile, blk, rows_pad);
  }
  bool rebuilt_masked = false;
  for (const BiasTile<T>& b : tiles) {
    if (b.tile == nullptr || !(h == 0 || b.bias.per_head() || (b.masked && new_mask))) continue;
    build_bias_tile(b.bias, mask, seqs, blk, h, b.masked, b.tile, buckets);
    zero_padded_rows(b.tile, blk, rows_pad);
    if (!b.masked) continue;
    if (mask.kind == MaskKind::kCustom) {  // a structured mask's is built masked
      multiply_into(b.tile, static_cast<const T*>(mask_tile), rows_pad * blk.stride());
    }
    rebuilt_masked = true;
  }
  return rebuilt_masked;
}

// g = M * g, a weight channel's gradient tile (`tile` values) masked: by a custom mask's
// multipliers; under a structured mask zero on the keys a row does not see, unless the bias reads
// its gradient on the visible keys alone (a relative bias: accumulate_bias_grads).
template <typename T>
void mask_bias_grads(const BiasSource<T>& bias, const MaskSource<T>& mask, const Block& blk,
                     const T* mask_tile, T* g, int64_t tile) {
  if (mask.kind == MaskKind::kCustom) {
    multiply_into(g, mask_tile, tile);
  } else if (bias.kind == BiasKind::kDense) {
    for_each_row_run_and_gap(
        mask, blk, blk.stride(), [](int64_t, int64_t, int64_t) {},
        [&](int64_t r, int64_t begin, int64_t end) {
          std::fill(g + r * blk.stride() + begin, g + r * blk.stride() + end, T(0));
        });
  }
}

// Adds the bias gradient of one tile (dS summed over the heads sharing the bias). A relative
// bias's gradient is added over the keys each row sees under `mask` only (for_each_row_runs): the
// tile is the mask's product there, zero elsewhere (half of it under a causal mask).
template <typename T>
void accumulate_bias_grads(const BiasSource<T>& src, const MaskSource<T>& mask,
                           const Sequences& seqs, const Block& blk, int64_t head,
                           const T* grad_tile, const int32_t* bucket_tile, const BiasGrads<T>& sink,
                           int64_t slot) {
  if (src.kind == BiasKind::kDense) {
    for (int64_t r = 0; r < blk.rows; ++r) {
      T* d = sink.dense + slot * sink.dense_thread_stride + blk.b * src.dense_stride_b +
             head * src.dense_stride_h + (blk.row0 + r) * src.dense_stride_row + blk.key0;
      add_into(d, grad_tile + r * blk.stride(), blk.keys);
    }
    return;
  }
  for_each_row_runs(mask, blk, [&](int64_t r, const int64_t* begin, const int64_t* end, int runs) {
    const T* g = grad_tile + r * blk.stride();
    const int64_t i = blk.row0 + r;
    for (int k = 0; k < runs; ++k) {
      const int64_t j0 = begin[k], n = end[k] - begin[k];
      if (sink.pos_w != nullptr) {
        double* pos =
            sink.pos_w + slot * sink.pos_thread_stride + (seqs.max_len - 1 - i + blk.key0 + j0);
        for (int64_t j = 0; j < n; ++j) pos[j] += g[j0 + j];
      }
      if (sink.ts_w != nullptr) {
        src.passes->add_by_bucket(g + j0, bucket_tile + r * blk.stride() + j0, n,
                                  sink.ts_w + slot * sink.ts_thread_stride);
      }
    }
  });
}

}  // namespace recops::attention::kernels

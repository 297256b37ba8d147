// HSTU attention on CPU: O_i = sum_j silu(alpha q_i.k_j + bias_ij) * scale * M_ij * v_j.
//
// Tiling: a work item is (sequence, chunk); chunk c of a sequence owns its query blocks
// c, c + C, c + 2C, ... (interleaved so causal chunks cost the same). A query block of
// kQueryBlock rows meets only the keys its mask can reach (key_range), in one [rows x keys] fp32
// tile per head: two BLAS calls (Q K^T, then A V) around an element-wise pass. The mask and bias
// tiles are built once per block and shared by the heads unless they have a head dim. Backward
// recomputes the tile (never storing [N, N]); dQ rows belong to the item, dK/dV accumulate in
// per-chunk fp32 partials that the adapter sums. Extra memory: per-thread tiles
// O(kQueryBlock * N) plus O(C * L * H * D) partials.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "recops/attention/kernels/hstu_mask.h"
#include "recops/attention/kernels/tile_ops.h"
#include "recops/attention/kernels/time_bucket_table.h"
#include "recops/attention/kernels/work_items.h"
#include "recops/common/blas.h"
#include "recops/common/parallel.h"

namespace recops::attention::kernels {

// Where each sequence lives in the [rows, H, D] fp32 tensors.
struct Sequences {
  int64_t count = 0;                  // B
  const int64_t* row_begin = nullptr;  // [B]
  const int64_t* length = nullptr;     // [B]
  int64_t max_len = 0;                 // N
};

template <typename T>
struct HstuShape {
  int64_t heads = 1, dqk = 0, dv = 0;
  T alpha = T(1), silu_scale = T(1);
};

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
};

enum class BiasKind : int { kNone = 0, kDense = 1, kRelative = 2 };

template <typename T>
struct BiasSource {
  BiasKind kind = BiasKind::kNone;
  // kDense: fp32 [Bb, Hb, N, N] contiguous; stride 0 on a broadcast dim.
  const T* dense = nullptr;
  int64_t dense_stride_b = 0, dense_stride_h = 0, dense_stride_row = 0;
  // kRelative: per-row key and query times, ts_w [num_buckets + 1], pos_w [2N - 1].
  const double* key_time = nullptr;
  const double* query_time = nullptr;
  const T* ts_w = nullptr;
  const T* pos_w = nullptr;
  const TimeBucketTable* buckets = nullptr;

  bool per_head() const { return kind == BiasKind::kDense && dense_stride_h != 0; }
};

// Gradient sinks for the bias, one slice per thread slot (summed by the adapter).
template <typename T>
struct BiasGrads {
  T* dense = nullptr;  // [threads, Bb, Hb, N, N]
  int64_t dense_thread_stride = 0;
  double* ts_w = nullptr;  // [threads, num_buckets + 1]
  int64_t ts_thread_stride = 0;
  double* pos_w = nullptr;  // [threads, 2N - 1]
  int64_t pos_thread_stride = 0;
};

// Per-thread tiles, each kQueryBlock x N; the BLAS stays single-threaded while they live.
template <typename T>
struct TileScratch {
  SingleThreadedBlas blas;
  std::vector<T> mask, bias, scores, grads, grad_sum;
  std::vector<int32_t> bucket;
  int64_t slot;  // this thread's index into per-thread partial results
  TileScratch(int64_t max_len, bool backward, bool relative_bias, int64_t thread_slot)
      : blas(),
        mask(kQueryBlock * max_len),
        bias(kQueryBlock * max_len),
        scores(kQueryBlock * max_len),
        grads(backward ? kQueryBlock * max_len : 0),
        grad_sum(backward ? kQueryBlock * max_len : 0),
        bucket(relative_bias ? kQueryBlock * max_len : 0),
        slot(thread_slot) {}
};

// One query block of one sequence: rows [row0, row0 + rows) meet keys [key0, key0 + keys).
struct Block {
  int64_t b, length, row0, rows, key0, keys;
};

template <typename T>
void build_mask_tile(const MaskSource<T>& src, const StructuredMask& structured,
                            const Block& blk, int64_t head, T* tile) {
  for (int64_t r = 0; r < blk.rows; ++r) {
    T* row = tile + r * blk.keys;
    const int64_t i = blk.row0 + r;
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

// bias tile; for the relative bias also the time bucket of every pair (reused by backward).
template <typename T>
void build_bias_tile(const BiasSource<T>& src, const Sequences& seqs, const Block& blk,
                            int64_t head, T* tile, int32_t* bucket_tile) {
  const int64_t first_row = seqs.row_begin[blk.b];
  for (int64_t r = 0; r < blk.rows; ++r) {
    T* row = tile + r * blk.keys;
    const int64_t i = blk.row0 + r;
    if (src.kind == BiasKind::kDense) {
      const T* bias = src.dense + blk.b * src.dense_stride_b + head * src.dense_stride_h +
                          i * src.dense_stride_row + blk.key0;
      std::memcpy(row, bias, blk.keys * sizeof(T));
      continue;
    }
    // Relative: ts_w[bucket(tq_i - t_j)] + pos_w[N - 1 + j - i].
    const double query_time = src.query_time[first_row + i];
    const double* key_time = src.key_time + first_row + blk.key0;
    const T* pos = src.pos_w + (seqs.max_len - 1 - i + blk.key0);
    int32_t* buckets = bucket_tile + r * blk.keys;
    for (int64_t j = 0; j < blk.keys; ++j) {
      buckets[j] = src.buckets->bucket(std::abs(query_time - key_time[j]));
      row[j] = src.ts_w[buckets[j]] + pos[j];
    }
  }
}

// Adds the bias gradient of one tile (dS summed over the heads sharing the bias).
template <typename T>
void accumulate_bias_grads(const BiasSource<T>& src, const Sequences& seqs, const Block& blk,
                                  int64_t head, const T* grad_tile,
                                  const int32_t* bucket_tile, const BiasGrads<T>& sink,
                                  int64_t slot) {
  for (int64_t r = 0; r < blk.rows; ++r) {
    const T* g = grad_tile + r * blk.keys;
    const int64_t i = blk.row0 + r;
    if (src.kind == BiasKind::kDense) {
      T* d = sink.dense + slot * sink.dense_thread_stride + blk.b * src.dense_stride_b +
                 head * src.dense_stride_h + i * src.dense_stride_row + blk.key0;
      add_into(d, g, blk.keys);
      continue;
    }
    double* ts = sink.ts_w + slot * sink.ts_thread_stride;
    double* pos = sink.pos_w + slot * sink.pos_thread_stride + (seqs.max_len - 1 - i + blk.key0);
    const int32_t* buckets = bucket_tile + r * blk.keys;
    for (int64_t j = 0; j < blk.keys; ++j) {
      ts[buckets[j]] += g[j];
      pos[j] += g[j];
    }
  }
}

// Calls fn(block, structured_mask) for every non-empty query block of an item.
template <typename T, typename Fn>
void for_each_block(const Sequences& seqs, const MaskSource<T>& mask, const WorkItem& item,
                    int64_t chunks, Fn&& fn) {
  const int64_t b = item.sequence, length = seqs.length[b];
  const StructuredMask structured = mask.structured(b, length);
  for_each_query_block(length, item, chunks, [&](int64_t row0, int64_t rows) {
    Block blk{b, length, row0, rows, 0, 0};
    int64_t key_end = length;
    if (mask.kind == MaskKind::kCustom) {
      blk.key0 = 0;
    } else {
      structured.key_range(blk.row0, blk.row0 + blk.rows, &blk.key0, &key_end);
    }
    blk.keys = key_end - blk.key0;
    if (blk.keys > 0) fn(blk, structured);
  });
}

template <typename T>
struct HstuTensors {
  const T* q = nullptr;  // [rows, H, Dqk]
  const T* k = nullptr;  // [rows, H, Dqk]
  const T* v = nullptr;  // [rows, H, Dv]
};

// out [rows, H, Dv] (zero-initialised by the caller).
template <typename T>
void hstu_forward(const Sequences& seqs, const HstuShape<T>& shape, const HstuTensors<T>& in,
                         const MaskSource<T>& mask, const BiasSource<T>& bias, int64_t chunks,
                         T* out) {
  const int64_t H = shape.heads, dqk = shape.dqk, dv = shape.dv;
  const std::vector<WorkItem> items = make_work_items(seqs.length, seqs.count, chunks);
  parallel_for_dynamic(
      static_cast<int64_t>(items.size()),
      [&](int64_t slot) {
        return TileScratch<T>(seqs.max_len, false, bias.kind == BiasKind::kRelative, slot);
      },
      [&](TileScratch<T>& t, int64_t index) {
        for_each_block(seqs, mask, items[index], chunks, [&](const Block& blk,
                                                             const StructuredMask& sm) {
          const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
          const int64_t key0 = seqs.row_begin[blk.b] + blk.key0;
          for (int64_t h = 0; h < H; ++h) {
            if (h == 0 || mask.per_head()) build_mask_tile(mask, sm, blk, h, t.mask.data());
            if (bias.kind != BiasKind::kNone && (h == 0 || bias.per_head())) {
              build_bias_tile(bias, seqs, blk, h, t.bias.data(), t.bucket.data());
            }
            T* s = t.scores.data();
            gemm(false, true, blk.rows, blk.keys, dqk, T(1), in.q + (row0 * H + h) * dqk,
                     H * dqk, in.k + (key0 * H + h) * dqk, H * dqk, T(0), s, blk.keys);
            silu_scores(s, bias.kind == BiasKind::kNone ? nullptr : t.bias.data(), t.mask.data(),
                        blk.rows * blk.keys, shape.alpha, shape.silu_scale);
            gemm(false, false, blk.rows, dv, blk.keys, T(1), s, blk.keys,
                     in.v + (key0 * H + h) * dv, H * dv, T(0), out + (row0 * H + h) * dv, H * dv);
          }
        });
      });
}

template <typename T>
struct HstuGrads {
  T* dq = nullptr;  // [rows, H, Dqk], written
  T* dk = nullptr;  // [chunks, rows, H, Dqk], accumulated (zero-initialised)
  T* dv = nullptr;  // [chunks, rows, H, Dv], accumulated (zero-initialised)
  int64_t rows = 0;
  BiasGrads<T> bias;
};

template <typename T>
void hstu_backward(const Sequences& seqs, const HstuShape<T>& shape, const HstuTensors<T>& in,
                          const T* grad_out, const MaskSource<T>& mask, const BiasSource<T>& bias,
                          int64_t chunks, const HstuGrads<T>& grads) {
  const int64_t H = shape.heads, dqk = shape.dqk, dv = shape.dv;
  const bool has_bias = bias.kind != BiasKind::kNone;
  const bool shared_bias_grad = has_bias && !bias.per_head();
  const std::vector<WorkItem> items = make_work_items(seqs.length, seqs.count, chunks);
  parallel_for_dynamic(
      static_cast<int64_t>(items.size()),
      [&](int64_t slot) {
        return TileScratch<T>(seqs.max_len, true, bias.kind == BiasKind::kRelative, slot);
      },
      [&](TileScratch<T>& t, int64_t index) {
        const int64_t slot = t.slot;
        const WorkItem item = items[index];
        T* dk = grads.dk + item.chunk * grads.rows * H * dqk;
        T* dvp = grads.dv + item.chunk * grads.rows * H * dv;
        for_each_block(seqs, mask, item, chunks, [&](const Block& blk, const StructuredMask& sm) {
          const int64_t row0 = seqs.row_begin[blk.b] + blk.row0;
          const int64_t key0 = seqs.row_begin[blk.b] + blk.key0;
          const int64_t tile = blk.rows * blk.keys;
          if (shared_bias_grad) std::fill(t.grad_sum.begin(), t.grad_sum.begin() + tile, T(0));
          for (int64_t h = 0; h < H; ++h) {
            if (h == 0 || mask.per_head()) build_mask_tile(mask, sm, blk, h, t.mask.data());
            if (has_bias && (h == 0 || bias.per_head())) {
              build_bias_tile(bias, seqs, blk, h, t.bias.data(), t.bucket.data());
            }
            T* s = t.scores.data();
            T* ds = t.grads.data();
            const T* q = in.q + (row0 * H + h) * dqk;
            const T* k = in.k + (key0 * H + h) * dqk;
            const T* go = grad_out + (row0 * H + h) * dv;
            gemm(false, true, blk.rows, blk.keys, dqk, T(1), q, H * dqk, k, H * dqk, T(0), s,
                     blk.keys);
            gemm(false, true, blk.rows, blk.keys, dv, T(1), go, H * dv,
                     in.v + (key0 * H + h) * dv, H * dv, T(0), ds, blk.keys);
            silu_score_grads(s, ds, has_bias ? t.bias.data() : nullptr, t.mask.data(), tile,
                             shape.alpha, shape.silu_scale);
            // dQ = alpha dS K, dK += alpha dS^T Q, dV += A^T dO.
            gemm(false, false, blk.rows, dqk, blk.keys, shape.alpha, ds, blk.keys, k,
                     H * dqk, T(0), grads.dq + (row0 * H + h) * dqk, H * dqk);
            gemm(true, false, blk.keys, dqk, blk.rows, shape.alpha, ds, blk.keys, q, H * dqk,
                     T(1), dk + (key0 * H + h) * dqk, H * dqk);
            gemm(true, false, blk.keys, dv, blk.rows, T(1), s, blk.keys, go, H * dv, T(1),
                     dvp + (key0 * H + h) * dv, H * dv);
            if (shared_bias_grad) {
              add_into(t.grad_sum.data(), ds, tile);
            } else if (has_bias) {
              accumulate_bias_grads(bias, seqs, blk, h, ds, t.bucket.data(), grads.bias, slot);
            }
          }
          if (shared_bias_grad) {
            accumulate_bias_grads(bias, seqs, blk, 0, t.grad_sum.data(), t.bucket.data(),
                                  grads.bias, slot);
          }
        });
      });
}

}  // namespace recops::attention::kernels

// The tiling machinery shared by the attention kernels of the HSTU family (HSTU, FuXi-alpha):
// where sequences live, per-thread tile scratch, and building the mask / bias tiles of a query
// block together with scattering their gradients. Work items (sequence, chunk) are those of
// work_items.h; a query block meets only the keys its mask can reach (StructuredMask::key_range),
// as [rows x keys] tiles.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "recops/attention/kernels/tile_variants.h"
#include "recops/attention/kernels/work_items.h"
#include "recops/common/blas.h"
#include "recops/hstu/kernels/hstu_mask.h"
#include "recops/hstu/kernels/relative_bias_math.h"

namespace recops::attention::kernels {

// Where each sequence lives in the [rows, H, D] fp32 tensors.
struct Sequences {
  int64_t count = 0;                   // B
  const int64_t* row_begin = nullptr;  // [B]
  const int64_t* length = nullptr;     // [B]
  int64_t max_len = 0;                 // N
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
  // kRelative: per-row key and query times, ts_w [num_buckets + 1] and/or pos_w [2N - 1] (a null
  // table contributes nothing: FuXi-alpha keeps time and position in separate channels).
  const double* key_time = nullptr;
  const double* query_time = nullptr;
  const T* ts_w = nullptr;
  const T* pos_w = nullptr;
  LogBucketizer::View buckets{};

  bool per_head() const { return kind == BiasKind::kDense && dense_stride_h != 0; }
};

// The query time of every row of the sequences: the key time at query_time_index (the next
// item's with the shift, as HSTU / FuXi-alpha; the last row its own). Other rows are left as
// they are.
inline void query_times(const Sequences& seqs, const double* key_time, bool query_time_shift,
                        double* query_time) {
  for (int64_t b = 0; b < seqs.count; ++b) {
    const double* t = key_time + seqs.row_begin[b];
    double* tq = query_time + seqs.row_begin[b];
    for (int64_t i = 0; i < seqs.length[b]; ++i) {
      tq[i] = t[query_time_index(i, seqs.length[b], query_time_shift)];
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

// Gradients of q, k, v: dQ rows belong to the work item that owns their query block; dK and dV
// accumulate in one partial per chunk (the adapter sums them), so items never share a row.
template <typename T>
struct QkvGrads {
  T* dq = nullptr;  // [rows, H, Dqk], written
  T* dk = nullptr;  // [chunks, rows, H, Dqk], accumulated (zero-initialised)
  T* dv = nullptr;  // [chunks, rows, H, Dv], accumulated (zero-initialised)
  int64_t rows = 0, heads = 1, dqk = 0, dv_dim = 0;

  T* dk_partial(int64_t chunk) const { return dk + chunk * rows * heads * dqk; }
  T* dv_partial(int64_t chunk) const { return dv + chunk * rows * heads * dv_dim; }
};

// Per-thread scratch: `count` tiles of kQueryBlock x N values (a kernel names them with its own
// enum), time-bucket indices for the relative bias, and this thread's slot for per-thread partial
// results. The BLAS stays single-threaded while it lives.
template <typename T>
class TileArena {
 public:
  TileArena(int count, int64_t max_len, bool with_buckets, int64_t thread_slot)
      : tile_size_(kQueryBlock * max_len),
        values_(count * tile_size_),
        buckets_(with_buckets ? tile_size_ : 0),
        slot_(thread_slot) {}
  T* tile(int index) { return values_.data() + index * tile_size_; }
  int32_t* buckets() { return buckets_.data(); }
  int64_t slot() const { return slot_; }

 private:
  SingleThreadedBlas blas_;
  int64_t tile_size_;
  std::vector<T> values_;
  std::vector<int32_t> buckets_;
  int64_t slot_;
};

// One query block of one sequence: rows [row0, row0 + rows) meet keys [key0, key0 + keys). Its
// tiles have rows of stride() values: `keys`, or `ld` when the bf16 kernels pad them (columns
// [keys, ld) of the mask and bias tiles are then zero).
struct Block {
  int64_t b, length, row0, rows, key0, keys;
  int64_t ld = 0;

  int64_t stride() const { return ld > 0 ? ld : keys; }
};

// Zeroes rows [blk.rows, rows_pad) of a tile (rows of blk.stride() values): the query rows the
// bf16 kernels pad a block with.
template <typename T>
void zero_padded_rows(T* tile, const Block& blk, int64_t rows_pad) {
  std::fill(tile + blk.rows * blk.stride(), tile + rows_pad * blk.stride(), T(0));
}

template <typename T>
void build_mask_tile(const MaskSource<T>& src, const StructuredMask& structured, const Block& blk,
                     int64_t head, T* tile) {
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

// bias tile; for the relative bias also the time bucket of every pair (reused by backward).
template <typename T>
void build_bias_tile(const BiasSource<T>& src, const Sequences& seqs, const Block& blk,
                     int64_t head, T* tile, int32_t* bucket_tile) {
  const int64_t first_row = seqs.row_begin[blk.b];
  for (int64_t r = 0; r < blk.rows; ++r) {
    T* row = tile + r * blk.stride();
    const int64_t i = blk.row0 + r;
    std::fill(row + blk.keys, row + blk.stride(), T(0));
    if (src.kind == BiasKind::kDense) {
      const T* bias = src.dense + blk.b * src.dense_stride_b + head * src.dense_stride_h +
                      i * src.dense_stride_row + blk.key0;
      std::memcpy(row, bias, blk.keys * sizeof(T));
      continue;
    }
    // Relative: ts_w[bucket(tq_i - t_j)] + pos_w[N - 1 + j - i].
    if (src.pos_w != nullptr) {
      std::memcpy(row, src.pos_w + (seqs.max_len - 1 - i + blk.key0), blk.keys * sizeof(T));
    } else {
      std::fill(row, row + blk.keys, T(0));
    }
    if (src.ts_w == nullptr) continue;
    const double query_time = src.query_time[first_row + i];
    const double* key_time = src.key_time + first_row + blk.key0;
    int32_t* buckets = bucket_tile + r * blk.stride();
    for (int64_t j = 0; j < blk.keys; ++j) {
      buckets[j] = src.buckets(std::abs(query_time - key_time[j]));
      row[j] += src.ts_w[buckets[j]];
    }
  }
}

// Adds the bias gradient of one tile (dS summed over the heads sharing the bias).
template <typename T>
void accumulate_bias_grads(const BiasSource<T>& src, const Sequences& seqs, const Block& blk,
                           int64_t head, const T* grad_tile, const int32_t* bucket_tile,
                           const BiasGrads<T>& sink, int64_t slot) {
  for (int64_t r = 0; r < blk.rows; ++r) {
    const T* g = grad_tile + r * blk.stride();
    const int64_t i = blk.row0 + r;
    if (src.kind == BiasKind::kDense) {
      T* d = sink.dense + slot * sink.dense_thread_stride + blk.b * src.dense_stride_b +
             head * src.dense_stride_h + i * src.dense_stride_row + blk.key0;
      add_into(d, g, blk.keys);
      continue;
    }
    if (sink.pos_w != nullptr) {
      double* pos = sink.pos_w + slot * sink.pos_thread_stride + (seqs.max_len - 1 - i + blk.key0);
      for (int64_t j = 0; j < blk.keys; ++j) pos[j] += g[j];
    }
    if (sink.ts_w != nullptr) {
      double* ts = sink.ts_w + slot * sink.ts_thread_stride;
      const int32_t* buckets = bucket_tile + r * blk.stride();
      for (int64_t j = 0; j < blk.keys; ++j) ts[buckets[j]] += g[j];
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
    if (mask.kind != MaskKind::kCustom) {
      structured.key_range(row0, row0 + rows, &blk.key0, &key_end);
    }
    blk.keys = key_end - blk.key0;
    if (blk.keys > 0) fn(blk, structured);
  });
}

}  // namespace recops::attention::kernels

// Forward lookup and the per-sample-weight gradient. Parallel over (feature, chunk of bags); each
// bag is accumulated in fp32 and written once; rows are prefetched kPrefetchDistance indices
// ahead. Compiled per instruction set.
#pragma once

#ifndef RECOPS_ISA_NS
#error "compiled once per instruction set: include through recops/embedding/kernels/variant.h"
#endif

#include "recops/embedding/kernels/bags.h"

namespace recops::embedding::kernels::RECOPS_ISA_NS {

// One feature's table, by value so the hot loops keep it in registers: rows of row_bytes bytes
// that Decoder reads, its add<W>(acc, row, c, D, scale) adding scale * the row's columns
// [c, c + W) to acc in fp32. StoredRows is the training TBE's decoder (rows of one element type);
// quantized_lookup.h has the inference TBE's, one per storage type, whose tables skip an index
// of -1 (a pruned row: kSkipsMinusOne) where every other index outside the table is an error.
template <typename Decoder, bool kSkipsMinusOne = false>
struct FeatureTable {
  using Row = const uint8_t*;
  const uint8_t* rows_data;
  int64_t rows;
  int64_t D;
  int64_t row_bytes;
  Decoder decoder;

  // One unsigned comparison checks 0 <= r < rows.
  bool contains(int64_t r) const { return static_cast<uint64_t>(r) < static_cast<uint64_t>(rows); }
  static bool rejects(int64_t r) { return !kSkipsMinusOne || r != -1; }
  Row row(int64_t r) const { return rows_data + r * row_bytes; }
  // Prefetching needs no bounds check: a prefetch never faults, and the address is formed as an
  // integer, so an out-of-range index is harmless.
  __attribute__((always_inline)) void prefetch(int64_t r) const {
    const uintptr_t address = reinterpret_cast<uintptr_t>(rows_data) + r * row_bytes;
    prefetch_bytes(reinterpret_cast<const void*>(address), row_bytes);
  }
  template <int64_t kWidth>
  void add_block(float* __restrict acc, Row row, int64_t c, float scale) const {
    decoder.template add<kWidth>(acc, row, c, D, scale);
  }
};

// Rows of weight_t: fp32, fp16, bf16, or Int8Rowwise (codes, then a float32 scale and bias).
template <typename weight_t>
struct StoredRows {
  static constexpr int64_t row_bytes(int64_t D) {
    return stored_row_size<weight_t>(D) * static_cast<int64_t>(sizeof(weight_t));
  }
  template <int64_t kWidth>
  static void add(float* __restrict acc, const uint8_t* row, int64_t c, int64_t D, float scale) {
    add_row_block<kWidth>(acc, reinterpret_cast<const weight_t*>(row), c, D, scale);
  }
};

// block[0, W) += psw[p] * row(indices[p])[c, c + W) over the bag's positions [begin, end),
// prefetching rows kPrefetchDistance positions ahead (below prefetch_end) on the first block.
// An index outside the table adds `zeros` (all zero bytes, as long as a stored row, which every
// row format reads as zeros) instead; returns the first such position the table rejects, or -1.
// Everything is passed by value and only `block` is written, so the loop's loads never wait on
// possibly aliasing stores, and every row is added unconditionally, which keeps the accumulator
// in registers.
template <int64_t kWidth, typename Table, typename index_t>
inline int64_t sum_bag_block(const index_t* indices, const float* per_sample_weights, int64_t begin,
                             int64_t end, int64_t prefetch_end, Table table, const void* zeros,
                             int64_t c, float* block) {
  using Row = typename Table::Row;
  int64_t bad = -1;
  for (int64_t p = begin; p < end; ++p) {
    if (c == 0 && p + kPrefetchDistance < prefetch_end) {
      table.prefetch(indices[p + kPrefetchDistance]);
    }
    const int64_t r = indices[p];
    const bool valid = table.contains(r);
    if (!valid && bad < 0 && table.rejects(r)) bad = p;
    const Row row = valid ? table.row(r) : static_cast<Row>(zeros);
    const float scale = per_sample_weights != nullptr ? per_sample_weights[p] : 1.0f;
    table.template add_block<kWidth>(block, row, c, scale);
  }
  return bad;
}

inline int64_t first_bad(int64_t a, int64_t b) {
  return a < 0 ? b : b < 0 ? a : std::min(a, b);
}

// Pooling::kNone: out[p, :D] = psw[p] * row(indices[p]) for p in [begin, end), output rows
// `out_stride` elements apart, a column block at a time through a local accumulator (kept in
// registers, as sum_bag_block's: accumulated in a row buffer in memory, GCC left the adds scalar
// and the buffer cost a memset and a memcpy per row, 6x an index_select of the same rows); with a
// `stream_buffer` (D elements) converted into it and copied out by streaming stores (the caller
// fences).
// Returns the first position the table rejects, or -1; the output row of an index outside the
// table is left unwritten.
template <typename Table, typename out_t, typename index_t>
int64_t copy_rows(const index_t* indices, const float* per_sample_weights, int64_t begin,
                  int64_t end, int64_t prefetch_end, Table table, out_t* out, int64_t out_stride,
                  out_t* stream_buffer) {
  int64_t bad = -1;
  for (int64_t p = begin; p < end; ++p) {
    if (p + kPrefetchDistance < prefetch_end) table.prefetch(indices[p + kPrefetchDistance]);
    const int64_t r = indices[p];
    if (!table.contains(r)) {
      if (bad < 0 && table.rejects(r)) bad = p;
      continue;
    }
    const float scale = per_sample_weights != nullptr ? per_sample_weights[p] : 1.0f;
    out_t* dst = stream_buffer != nullptr ? stream_buffer : out + p * out_stride;
    for_each_column_block(table.D, [&](auto width, int64_t c) {
      constexpr int64_t kWidth = decltype(width)::value;
      float block[kWidth] = {};
      table.template add_block<kWidth>(block, table.row(r), c, scale);
      from_float(block, dst + c, kWidth);
    });
    if (stream_buffer != nullptr) {
      copy_bytes_streamed(out + p * out_stride, stream_buffer, table.D * sizeof(out_t));
    }
  }
  return bad;
}

// Whether a lookup writes its output rows by streaming stores: a sequence (Pooling::kNone)
// lookup's [num_indices, max_D] rows when they exceed the last-level cache (common/streaming.h).
// Pooled outputs are written a bag at a time between row reads and stay cached.
template <typename out_t, typename index_t>
bool streams_rows(const FeatureLayout& layout, const TypedBags<index_t>& bags) {
  return bags.pooling == Pooling::kNone &&
         should_stream(bags.num_indices * layout.max_D * static_cast<int64_t>(sizeof(out_t)));
}

// The bags [b_begin, b_end) of feature t, whose rows `table` holds (a work item of
// for_each_bag_chunk). Pooled: out[b, D_offsets[t]:+D] = pooling_scale * sum_i psw[i] *
// row(indices[i]) over bag (t, b). Pooling::kNone: out[i, :D] = psw[i] * row(indices[i]), rows
// max_D apart, by streaming stores if `stream_rows` (streams_rows). `scratch` is the task's
// (for_each_bag_chunk).
template <typename Table, typename out_t, typename index_t>
int64_t pool_bags(const FeatureLayout& layout, const TypedBags<index_t>& bags, Table table,
                  int64_t t, int64_t b_begin, int64_t b_end, bool continued, ScratchRows& scratch,
                  out_t* out, bool stream_rows) {
  const void* zeros = scratch.zeros();
  out_t* stream_buffer = stream_rows ? reinterpret_cast<out_t*>(scratch.row(1)) : nullptr;
  const index_t* indices = bags.indices;
  const float* sample_weights = bags.per_sample_weights;
  // Rows are prefetched kPrefetchDistance indices ahead, up to the end of the feature; a task's
  // first chunk of a feature prefetches its own first rows.
  const index_t* offsets = bags.offsets + layout.first_bag(t);  // the feature's bags
  const int64_t first = offsets[b_begin];
  const int64_t feature_end = offsets[layout.bags_of(t)];
  if (!continued) {
    for (int64_t p = first; p < std::min(feature_end, first + kPrefetchDistance); ++p) {
      table.prefetch(indices[p]);
    }
  }
  int64_t bad = -1;
  for (int64_t b = b_begin; b < b_end; ++b) {
    const int64_t begin = offsets[b];
    const int64_t end = offsets[b + 1];
    if (bags.pooling == Pooling::kNone) {
      bad = first_bad(bad, copy_rows(indices, sample_weights, begin, end, feature_end, table, out,
                                     layout.max_D, stream_buffer));
      continue;
    }
    out_t* out_row = out + layout.output_offset(t, b);
    const float bag_scale = bags.pooling_scale(end - begin);
    for_each_column_block(table.D, [&](auto width, int64_t c) {
      constexpr int64_t kWidth = decltype(width)::value;
      float block[kWidth] = {};
      bad = first_bad(bad, sum_bag_block<kWidth>(indices, sample_weights, begin, end, feature_end,
                                                 table, zeros, c, block));
      for (int64_t i = 0; i < kWidth; ++i) block[i] *= bag_scale;
      from_float(block, out_row + c, kWidth);
    });
  }
  if (stream_rows) store_fence();
  return bad;
}

template <typename weight_t, typename out_t, typename index_t>
int64_t forward(const ForwardArgs& args) {
  const FeatureLayout& layout = args.layout;
  const TypedBags<index_t> bags(args.bags);
  const auto* weights = static_cast<const weight_t*>(args.weights);
  auto* out = static_cast<out_t*>(args.out);
  const int64_t bytes_per_index = layout.max_D * static_cast<int64_t>(sizeof(weight_t));
  const bool stream_rows = streams_rows<out_t>(layout, bags);
  return for_each_bag_chunk(
      layout, bags.num_indices, bytes_per_index,
      [&](ScratchRows& scratch, int64_t t, int64_t b_begin, int64_t b_end,
          bool continued) -> int64_t {
        const int64_t D = layout.D_offsets[t + 1] - layout.D_offsets[t];
        const FeatureTable<StoredRows<weight_t>> table{
            reinterpret_cast<const uint8_t*>(weights + layout.weights_offsets[t]),
            layout.rows[t],
            D,
            StoredRows<weight_t>::row_bytes(D),
            {}};
        return pool_bags(layout, bags, table, t, b_begin, b_end, continued, scratch, out,
                         stream_rows);
      });
}

// grad[i] = <clip(g), row(indices[i])> * pooling_scale, where g is grad_output's row of i's bag
// (its own row for Pooling::kNone); 0 for features that do not require the gradient.
template <typename weight_t, typename index_t>
int64_t sample_weights_grad(const SampleWeightsGradArgs& args) {
  const FeatureLayout& layout = args.layout;
  const TypedBags<index_t> bags(args.bags);
  const auto* weights = static_cast<const weight_t*>(args.weights);
  const bool pooled = bags.pooling != Pooling::kNone;
  const float bound = args.max_gradient;
  const int64_t bytes_per_index = layout.max_D * static_cast<int64_t>(sizeof(weight_t));

  return for_each_bag_chunk(
      layout, bags.num_indices, bytes_per_index,
      [&](ScratchRows& scratch, int64_t t, int64_t b_begin, int64_t b_end, bool) -> int64_t {
        float* g = scratch.row(0);
        float* converted = scratch.row(1);
        const int64_t D = layout.D_offsets[t + 1] - layout.D_offsets[t];
        const weight_t* table = weights + layout.weights_offsets[t];
        const int64_t rows = layout.rows[t];
        const index_t* offsets = bags.offsets + layout.first_bag(t);  // the feature's bags
        const int64_t first = offsets[b_begin];
        const int64_t last = offsets[b_end];
        if (args.feature_requires_grad != nullptr && args.feature_requires_grad[t] == 0) {
          std::fill(args.grad + first, args.grad + last, 0.0f);
          return -1;
        }
        // g = clip(src) * scale, the gradient row the bag's (or index's) rows are dotted with.
        const auto load_grad = [&](const float* src, float scale) {
          for (int64_t d = 0; d < D; ++d) g[d] = std::min(std::max(src[d], -bound), bound) * scale;
        };
        int64_t bad = -1;
        for (int64_t b = b_begin; b < b_end; ++b) {
          const int64_t begin = offsets[b];
          const int64_t end = offsets[b + 1];
          if (pooled) {
            load_grad(args.grad_output + layout.output_offset(t, b),
                      bags.pooling_scale(end - begin));
          }
          for (int64_t p = begin; p < end; ++p) {
            const int64_t r = bags.indices[p];
            if (r < 0 || r >= rows) {
              if (bad < 0) bad = p;
              args.grad[p] = 0.0f;
              continue;
            }
            if (!pooled) load_grad(args.grad_output + p * D, 1.0f);
            args.grad[p] = dot(g, row_as_float(table + r * D, converted, D), D);
          }
        }
        return bad;
      });
}

}  // namespace recops::embedding::kernels::RECOPS_ISA_NS

// What the HSTU-family kernels (HSTU, FuXi-alpha; fp32 and bf16) are given: where the jagged
// sequences live, the attention's shape, q / k / v, and the query blocks a sequence is cut into.
#pragma once

#include <algorithm>
#include <cstdint>

#include "recops/attention/kernels/work_items.h"

namespace recops::attention::kernels {

// Query rows per block when the queries are the sequences' own rows (training; a recompute). A
// causal block's tiles reach the keys of its last row, so the scores above the diagonal that it
// computes and masks grow with the block: over ML-100K's batches (mean length 80) blocks of 64
// rows held 1.42x the causal pairs, of 16 rows 1.11x (one layer's attention backward and forward
// 9% and 10% shorter on one thread, AMD EPYC, timed beside a fixed matmul; unchanged at N = 1024).
// A serving step's few new rows over cached keys keep kQueryBlock: there the triangle is a sliver
// of each block, and one block per sequence lets the forward read K in place.
constexpr int64_t kOwnRowsQueryBlock = 16;

// Where sequence b's keys live in k and v (and their times): key j, at position j of the
// sequence, is row row(b, j). Either one run of rows from row_begin[b] (the jagged layout), or
// pages of page_rows rows (a paged key cache: row_begin null, key j of sequence b in page
// pages[b * page_stride + j / page_rows]). The kernels read ranges of keys through for_each_run
// only; paged runs break at page ends, so each starts at a multiple of page_rows (even, as the
// bf16 kernels pair keys).
struct KeyRows {
  const int64_t* row_begin = nullptr;  // [B]
  const int64_t* length = nullptr;     // [B]: the keys of sequence b, positions [0, length[b])
  const int64_t* pages = nullptr;      // [B, page_stride] when paged
  int64_t page_stride = 0, page_rows = 0;

  int64_t row(int64_t b, int64_t key) const {
    if (row_begin != nullptr) return row_begin[b] + key;
    return pages[b * page_stride + key / page_rows] * page_rows + key % page_rows;
  }
  // Where the run of consecutive rows holding key `key` of sequence b ends, `end` at the latest.
  int64_t run_end(int64_t key, int64_t end) const {
    return row_begin != nullptr ? end : std::min(end, (key / page_rows + 1) * page_rows);
  }
  // fn(row, key, count) for the runs of consecutive rows that hold keys [key0, key0 + keys) of
  // sequence b, in key order.
  template <typename Fn>
  void for_each_run(int64_t b, int64_t key0, int64_t keys, Fn&& fn) const {
    for (int64_t key = key0, end = key0 + keys; key < end;) {
      const int64_t n = run_end(key, end) - key;
      fn(row(b, key), key, n);
      key += n;
    }
  }
};

// Where each sequence's query rows and keys live. A sequence's queries are its last q_length[b]
// positions (all of them when queries and keys are the same rows, as in training; the new rows
// of a step over cached keys); the query at position p is row query_row(b, p) of q, the output
// and their gradients.
struct Sequences {
  int64_t count = 0;                     // B
  const int64_t* q_row_begin = nullptr;  // [B]
  const int64_t* q_length = nullptr;     // [B]
  KeyRows keys;
  int64_t max_len = 0;  // N (max_seq_len): no sequence is longer; the position bias centres on it
  // The most keys of any of these sequences: what the scratch and packed operands are sized by.
  // A serving step's few new rows of short sequences under a large max_seq_len would otherwise
  // allocate (and zero) tiles of query_block x max_len values per thread on every call.
  int64_t longest = 0;
  int64_t most_queries = 0;  // the most query rows of any sequence: a block has at most these
  int64_t query_block = kQueryBlock;  // query rows per block (work_items.h), at most kQueryBlock

  // Queries and keys on the same rows [row_begin[b], row_begin[b] + length[b]).
  static Sequences same_rows(int64_t count, const int64_t* row_begin, const int64_t* length,
                             int64_t max_len) {
    Sequences seqs = with_keys(count, row_begin, length, {row_begin, length}, max_len);
    seqs.query_block = kOwnRowsQueryBlock;
    return seqs;
  }
  // Queries at the last q_length[b] positions of the keys `keys`.
  static Sequences with_keys(int64_t count, const int64_t* q_row_begin, const int64_t* q_length,
                             KeyRows keys, int64_t max_len) {
    int64_t longest = 0, most_queries = 0;
    for (int64_t b = 0; b < count; ++b) {
      longest = std::max(longest, keys.length[b]);
      most_queries = std::max(most_queries, q_length[b]);
    }
    return {count, q_row_begin, q_length, keys, max_len, longest, most_queries};
  }
  int64_t first_query(int64_t b) const { return keys.length[b] - q_length[b]; }
  int64_t query_row(int64_t b, int64_t position) const {
    return q_row_begin[b] + position - first_query(b);
  }
};

template <typename T>
struct HstuShape {
  int64_t heads = 1, dqk = 0, dv = 0;
  T alpha = T(1), silu_scale = T(1);
};

// A [rows, H, D] input whose rows are [H, D] contiguous, `stride` values apart: H * D when the
// tensor is contiguous, more when it is a slice of a wider projection (HSTU splits U, V, Q, K
// out of one linear layer's output), which the kernels then read in place.
template <typename E>
struct Rows {
  const E* data = nullptr;
  int64_t stride = 0;

  // Head h (of d values) of row `row`.
  const E* at(int64_t row, int64_t h, int64_t d) const { return data + row * stride + h * d; }
};

// q, k [rows, H, Dqk] and v [rows, H, Dv]; bf16 as bit patterns (Bf16Tensors).
template <typename T>
struct HstuTensors {
  Rows<T> q, k, v;
};
using Bf16Tensors = HstuTensors<uint16_t>;

// One query block of one sequence (`length` keys): the queries at positions [row0, row0 + rows)
// meet keys [key0, key0 + keys). Its
// tiles have rows of stride() values: `keys`, or `ld` when the bf16 kernels pad them (columns
// [keys, ld) of the mask and bias tiles are then zero).
struct Block {
  int64_t b, length, row0, rows, key0, keys;
  int64_t ld = 0;

  int64_t stride() const { return ld > 0 ? ld : keys; }
};

// A block as a precision's products see it: its key range and tile rows (blk.ld) possibly padded,
// and rows_pad >= blk.rows query rows (the rows past blk.rows are zero in every tile).
struct PaddedBlock {
  Block blk;
  int64_t rows_pad;
};

}  // namespace recops::attention::kernels

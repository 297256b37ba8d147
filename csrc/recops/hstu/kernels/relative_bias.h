// Relative attention bias tensors [layers, B, N, N] (docs/ops.md section 3) on raw pointers, in two
// passes over a bucket matrix buckets[B, N, N] (the bucket of every query/key pair):
//  1. compute_buckets: the bucket of (query i, key j) only depends on |ts[q(i)] - ts[j]| with
//     q(i) the query's timestamp position, and that is symmetric, so per sequence the square
//     matrix M[a][c] = bucket(|ts[a] - ts[c]|) is computed a tile pair at a time (upper triangle
//     only) and each value written to both bucket-matrix entries it serves. Half the bucket
//     evaluations, which dominate the cost.
//  2. lookup (forward): out[l, b, i, j] = ts_w[l, bucket] (+ pos_w[l, N - 1 + j - i]) row by row;
//     or relative_bias_backward: the time table's gradient is a histogram over the nb + 1
//     buckets, accumulated per chunk of rows into private partial tables (common/histogram.h),
//     and the position table's gradient a sum along diagonals, i.e. row i of the gradient added
//     into the window of the [2N - 1] table shifted by i, into per-chunk partials too; the partials
//     are summed at the end. No atomics, no locks.
// The bucket matrix is also the op's bucket-index output (uint8 when the buckets fit), which the
// backward reuses.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "recops/common/histogram.h"
#include "recops/common/kinds.h"
#include "recops/common/parallel.h"
#include "recops/hstu/kernels/relative_bias_math.h"

namespace recops::attention::kernels {

constexpr int64_t kBucketTile = 64;  // query/key tile edge of compute_buckets

// Whether a uint8 bucket matrix holds num_buckets (the narrowest bucket type; int32 otherwise).
inline bool buckets_fit_uint8(int64_t num_buckets) {
  return num_buckets <= 255;
}

// Sequence lengths: dense (offsets == nullptr, every sequence seq_len long) or jagged, sequence b
// spanning [offsets[b], offsets[b + 1]). Positions i, j < valid(b) exist; the others are padding
// (zero bias, ignored gradient).
struct Lengths {
  const int64_t* offsets;
  int64_t seq_len;

  int64_t start(int64_t b) const { return offsets ? offsets[b] : b * seq_len; }
  int64_t length(int64_t b) const { return offsets ? offsets[b + 1] - offsets[b] : seq_len; }
  int64_t valid(int64_t b) const { return std::min(length(b), seq_len); }
};

struct BiasShape {
  int64_t layers;       // tables stacked along dim 0 (1 for 1-D tables)
  int64_t batch;        // B
  int64_t seq_len;      // N
  int64_t num_buckets;  // time tables hold num_buckets + 1 entries; position tables 2N - 1

  int64_t time_entries() const { return num_buckets + 1; }
  int64_t position_entries() const { return 2 * seq_len - 1; }
  // Offset of row (b, i) of layer l in a [layers, B, N, N] tensor.
  int64_t row_offset(int64_t l, int64_t b, int64_t i) const {
    return ((l * batch + b) * seq_len + i) * seq_len;
  }
};

// The symmetric bucket matrix of one sequence and where its entries go. Query row i of the output
// uses timestamp q(i) = query_time_index(i, length, shift); the bucket of (i, j) is M[q(i)][j].
// Conversely M[a][c] is written to rows rows_of(a): a - 1 when shifted (q(a - 1) = a), and a
// itself when unshifted or when a is the sequence's last position (which uses its own time).
template <typename ts_t, typename bin_t>
class SequenceBuckets {
 public:
  SequenceBuckets(const ts_t* ts, int64_t length, int64_t valid, int64_t seq_len, bool shift,
                  const LogBucketizer& bucketizer, bin_t* out)
      : ts_(ts),
        length_(length),
        valid_(valid),
        seq_len_(seq_len),
        shift_(shift),
        bucketizer_(bucketizer),
        out_(out) {}

  int64_t num_tiles() const { return (valid_ + kBucketTile - 1) / kBucketTile; }

  // Tiles (t, u) for u >= t: M restricted to rows of tile t and columns of tile u, with its mirror.
  void tile_row(int64_t t, bin_t* tile) const {
    const int64_t a0 = t * kBucketTile;
    const int64_t a1 = std::min(valid_, a0 + kBucketTile);
    for (int64_t u = t; u < num_tiles(); ++u) {
      const int64_t c0 = u * kBucketTile;
      const int64_t c1 = std::min(valid_, c0 + kBucketTile);
      for (int64_t a = a0; a < a1; ++a) {
        bucket_span(ts_[a], c0, c1, tile + (a - a0) * kBucketTile);
      }
      for (int64_t a = a0; a < a1; ++a) {
        const bin_t* values = tile + (a - a0) * kBucketTile;
        for_rows_of(a, [&](int64_t i) { std::copy(values, values + (c1 - c0), row(i) + c0); });
      }
      if (u == t) continue;
      for (int64_t c = c0; c < c1; ++c) {
        for_rows_of(c, [&](int64_t i) {
          bin_t* dst = row(i);
          for (int64_t a = a0; a < a1; ++a) dst[a] = tile[(a - a0) * kBucketTile + (c - c0)];
        });
      }
    }
  }

  // Row valid - 1 when the sequence continues past the output (length > N, shifted): its query
  // timestamp ts[valid] lies outside the square matrix.
  void overflow_row(bin_t* scratch) const {
    if (!shift_ || length_ <= valid_ || valid_ == 0) return;
    bucket_span(ts_[valid_], 0, valid_, scratch);
    std::copy(scratch, scratch + valid_, row(valid_ - 1));
  }

  // Zeroes the padding (rows and columns past valid).
  void clear_padding() const {
    for (int64_t i = 0; i < seq_len_; ++i) {
      std::fill(row(i) + (i < valid_ ? valid_ : 0), row(i) + seq_len_, bin_t(0));
    }
  }

 private:
  bin_t* row(int64_t i) const { return out_ + i * seq_len_; }

  void bucket_span(ts_t query, int64_t c0, int64_t c1, bin_t* dst) const {
    const ts_t* ts = ts_;
    const LogBucketizer::View bucket = bucketizer_.view();
    for (int64_t c = c0; c < c1; ++c) dst[c - c0] = bucket(time_delta_magnitude(query, ts[c]));
  }

  template <typename Fn>
  void for_rows_of(int64_t a, const Fn& fn) const {
    if (!shift_) {
      fn(a);
      return;
    }
    if (a >= 1) fn(a - 1);
    if (a == length_ - 1) fn(a);
  }

  const ts_t* ts_;
  int64_t length_;
  int64_t valid_;
  int64_t seq_len_;
  bool shift_;
  const LogBucketizer& bucketizer_;
  bin_t* out_;
};

// buckets[b, i, j] = bucket(|ts[q(i)] - ts[j]|) of sequence b for valid i, j, else 0.
// Work items are (sequence, tile row) pairs; a sequence's tile rows are visited outside-in
// (0, last, 1, last - 1, ...) so that contiguous ranges of items carry similar work.
template <typename ts_t, typename bin_t>
void compute_buckets(const ts_t* timestamps, const Lengths& lengths, int64_t batch,
                     bool query_time_shift, const LogBucketizer& bucketizer, bin_t* buckets) {
  const int64_t n = lengths.seq_len;
  const int64_t tiles = (n + kBucketTile - 1) / kBucketTile;
  const auto sequence = [&](int64_t b) {
    return SequenceBuckets<ts_t, bin_t>(timestamps + lengths.start(b), lengths.length(b),
                                        lengths.valid(b), n, query_time_shift, bucketizer,
                                        buckets + b * n * n);
  };
  parallel_for(0, batch * tiles, 1, [&](int64_t w0, int64_t w1) {
    std::vector<bin_t> tile(std::max(kBucketTile * kBucketTile, n));
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / tiles;
      const int64_t k = w % tiles;
      const int64_t t = k % 2 == 0 ? k / 2 : tiles - 1 - k / 2;
      const SequenceBuckets<ts_t, bin_t> seq = sequence(b);
      if (t < seq.num_tiles()) seq.tile_row(t, tile.data());
      if (k == 0) {
        seq.overflow_row(tile.data());
        seq.clear_padding();
      }
    }
  });
}

// out[j] = time[buckets[j]] (+ position[j]) for j < n; `position` is the table shifted to the row.
template <typename acc_t, typename scalar_t, typename bin_t>
void lookup_row(const scalar_t* time, const scalar_t* position, const bin_t* buckets, int64_t n,
                scalar_t* out) {
  if (position == nullptr) {
    for (int64_t j = 0; j < n; ++j) out[j] = time[buckets[j]];
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    out[j] = static_cast<scalar_t>(static_cast<acc_t>(time[buckets[j]]) +
                                   static_cast<acc_t>(position[j]));
  }
}

// out[l, b, i, j] = ts_w[l, buckets[b, i, j]] (+ pos_w[l, N - 1 + j - i] when pos_w is given) for
// valid i, j, else 0. Buckets must lie in [0, num_buckets].
template <typename acc_t, typename scalar_t, typename bin_t>
void lookup(const bin_t* buckets, const Lengths& lengths, const scalar_t* ts_w,
            const scalar_t* pos_w, const BiasShape& shape, scalar_t* out) {
  const int64_t n = shape.seq_len;
  const int64_t row_bytes = n * shape.layers * static_cast<int64_t>(sizeof(scalar_t));
  parallel_for(0, shape.batch * n, grain_for_bytes(row_bytes), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / n;
      const int64_t i = r % n;
      const int64_t filled = i < lengths.valid(b) ? lengths.valid(b) : 0;
      for (int64_t l = 0; l < shape.layers; ++l) {
        scalar_t* o = out + shape.row_offset(l, b, i);
        const scalar_t* position =
            pos_w ? pos_w + l * shape.position_entries() + position_index(i, 0, n) : nullptr;
        lookup_row<acc_t>(ts_w + l * shape.time_entries(), position, buckets + r * n, filled, o);
        std::fill(o + filled, o + n, scalar_t(0));
      }
    }
  });
}

// out[l, 0, i, :] = pos_w[l, N - 1 - i : 2N - 1 - i]: each row is a contiguous window.
template <typename scalar_t>
void position_bias(const scalar_t* pos_w, int64_t layers, int64_t n, scalar_t* out) {
  const int64_t row_bytes = n * static_cast<int64_t>(sizeof(scalar_t));
  parallel_for(0, layers * n, grain_for_bytes(row_bytes), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t l = r / n;
      const int64_t i = r % n;
      std::memcpy(out + r * n, pos_w + l * (2 * n - 1) + position_index(i, 0, n), row_bytes);
    }
  });
}

// acc[j] += row[j] for j < n.
template <typename acc_t, typename scalar_t>
void add_row(const scalar_t* row, int64_t n, acc_t* acc) {
  for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<acc_t>(row[j]);
}

// grad_ts[l, k] = sum of grad[l, b, i, j] over valid (i, j) with buckets[b, i, j] == k (skipped
// when grad_ts is null); grad_pos[l, N - 1 + j - i] = sum over b of grad[l, b, i, j] over valid
// (i, j) (skipped when grad_pos is null). Returns the flat position (b * N + i) * N + j of the
// first bucket outside [0, num_buckets] (results then undefined), or -1.
template <typename acc_t, typename scalar_t, typename bin_t>
int64_t relative_bias_backward(const scalar_t* grad, const BiasShape& shape, const Lengths& lengths,
                               const bin_t* buckets, scalar_t* grad_ts, scalar_t* grad_pos) {
  const int64_t n = shape.seq_len;
  const int64_t rows = shape.batch * n;
  const int64_t bins = shape.time_entries();
  const int64_t positions = shape.position_entries();
  return dispatch_histogram_lanes<acc_t>(bins, [&](auto lanes) -> int64_t {
    constexpr int kLanes = decltype(lanes)::value;
    const int64_t hist_size = grad_ts ? shape.layers * kLanes * bins : 0;
    const int64_t per_chunk =
        chunk_table_stride<acc_t>(hist_size + (grad_pos ? shape.layers * positions : 0));
    const int64_t chunks = num_chunks(
        rows, grain_for_bytes(n * shape.layers * static_cast<int64_t>(sizeof(scalar_t))));
    std::unique_ptr<acc_t[]> partials(new acc_t[chunks * per_chunk]);
    std::vector<int64_t> bad(chunks, -1);
    for_each_chunk(rows, chunks, [&](int64_t c, int64_t r0, int64_t r1) {
      acc_t* hist = partials.get() + c * per_chunk;
      acc_t* diagonals = hist + hist_size;
      std::fill(hist, hist + per_chunk, acc_t(0));
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t b = r / n;
        const int64_t i = r % n;
        const int64_t valid = lengths.valid(b);
        if (i >= valid) continue;
        for (int64_t l = 0; l < shape.layers; ++l) {
          const scalar_t* g = grad + shape.row_offset(l, b, i);
          if (grad_ts) {
            const int64_t j =
                histogram_add<kLanes>(g, buckets + r * n, valid, bins, hist + l * kLanes * bins);
            if (j >= 0) {
              bad[c] = r * n + j;
              return;
            }
          }
          if (grad_pos) {
            add_row(g, valid, diagonals + l * positions + position_index(i, 0, n));
          }
        }
      }
    });
    for (int64_t bad_position : bad) {
      if (bad_position >= 0) return bad_position;
    }
    if (grad_ts) {
      for (int64_t l = 0; l < shape.layers; ++l) {
        for (int64_t k = 0; k < bins; ++k) {
          acc_t sum = 0;
          for (int64_t c = 0; c < chunks; ++c) {
            sum += sum_lanes<kLanes>(partials.get() + c * per_chunk + l * kLanes * bins, k);
          }
          grad_ts[l * bins + k] = static_cast<scalar_t>(sum);
        }
      }
    }
    if (grad_pos) {
      const int64_t total = shape.layers * positions;
      parallel_for(0, total, grain_for_bytes(chunks * static_cast<int64_t>(sizeof(acc_t))),
                   [&](int64_t p0, int64_t p1) {
                     for (int64_t p = p0; p < p1; ++p) {
                       acc_t sum = 0;
                       for (int64_t c = 0; c < chunks; ++c) {
                         sum += partials[c * per_chunk + hist_size + p];
                       }
                       grad_pos[p] = static_cast<scalar_t>(sum);
                     }
                   });
    }
    return -1;
  });
}

// relative_bias_backward with the bucket matrix computed first from the timestamps
// (compute_buckets, into scratch of the narrowest bucket type): both passes of the gradient when
// the caller kept no bucket index.
template <typename acc_t, typename scalar_t, typename ts_t>
int64_t relative_bias_backward_from_timestamps(const scalar_t* grad, const BiasShape& shape,
                                               const Lengths& lengths, const ts_t* timestamps,
                                               bool query_time_shift,
                                               const LogBucketizer& bucketizer, scalar_t* grad_ts,
                                               scalar_t* grad_pos) {
  const auto run = [&](auto bin_tag) {
    using bin_t = typename decltype(bin_tag)::type;
    // Uninitialised: compute_buckets writes every entry.
    std::unique_ptr<bin_t[]> buckets(new bin_t[shape.batch * shape.seq_len * shape.seq_len]);
    compute_buckets(timestamps, lengths, shape.batch, query_time_shift, bucketizer, buckets.get());
    return relative_bias_backward<acc_t>(grad, shape, lengths, buckets.get(), grad_ts, grad_pos);
  };
  return buckets_fit_uint8(shape.num_buckets) ? run(TypeTag<uint8_t>{}) : run(TypeTag<int32_t>{});
}

}  // namespace recops::attention::kernels

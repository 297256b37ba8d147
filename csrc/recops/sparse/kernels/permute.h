// Segment permutation on raw bytes: output segment i is a copy of input segment permute[i].
// Segments are contiguous runs of rows, so each one moves with a single copy whatever the dtype
// (a fixed-size one for short runs); segments are independent and copied in parallel.
// permute_sparse is the whole of permute_1D / permute_2D_sparse_data: lengths, offsets, then the
// values and weights.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>

#include "recops/common/function_ref.h"
#include "recops/common/parallel.h"
#include "recops/common/prefix_sum.h"
#include "recops/common/streaming.h"

namespace recops::sparse::kernels {

// One tensor moved by a segment permutation (values, weights): its source and destination bytes,
// whose segments are runs of rows of `row_bytes` bytes; `src_bytes` bounds copy_run's over-reads.
struct PermutedStream {
  const char* src = nullptr;
  int64_t src_bytes = 0;
  char* dst = nullptr;
  int64_t row_bytes = 0;
};

// Runs of at most this many bytes are moved with one fixed-size copy (a few vector moves) instead
// of a memcpy call whose cost, on runs of a few ids, exceeds the copy.
constexpr int64_t kShortRunBytes = 128;

// Copies `bytes` bytes. A short run copies 64 or kShortRunBytes bytes when both ends allow it: the
// excess written past the run lands in [dst + bytes, dst_limit), which the caller rewrites
// afterwards (later runs of the same task, in order); the excess read stays inside the source.
// Long runs bypass the cache when `streaming` (common/streaming.h).
inline void copy_run(char* dst, const char* src, int64_t bytes, const char* dst_limit,
                     const char* src_limit, bool streaming = false) {
  if (bytes <= kShortRunBytes && dst_limit - dst >= kShortRunBytes &&
      src_limit - src >= kShortRunBytes) {
    if (bytes <= kShortRunBytes / 2) {
      std::memcpy(dst, src, kShortRunBytes / 2);
    } else {
      std::memcpy(dst, src, kShortRunBytes);
    }
  } else if (bytes > 0) {
    copy_bytes(dst, src, bytes, streaming);
  }
}

// Segments ahead of the current one whose source is prefetched: a permuted segment's offsets and
// data sit at unpredictable addresses (two dependent cache misses), which the hardware prefetcher
// cannot anticipate. The offsets are fetched twice as far ahead as the data they locate.
constexpr int64_t kPrefetchSegments = 8;

inline void prefetch(const void* address) {
#if defined(__GNUC__)
  __builtin_prefetch(address);
#else
  (void)address;
#endif
}

// For every stream: dst segment i (rows [dst_offsets[i], dst_offsets[i+1])) = src segment
// permute[i] (rows [src_offsets[p], src_offsets[p+1])). Segments of all streams share the offsets
// (values and weights), so one pass over the segments moves them all. At most kMaxStreams streams.
constexpr int kMaxStreams = 2;

template <typename perm_t>
void permute_segments(const perm_t* permute, int64_t num_out, const int64_t* src_offsets,
                      const int64_t* dst_offsets, const PermutedStream* streams, int num_streams) {
  int64_t total_row_bytes = 0;
  for (int s = 0; s < num_streams; ++s) total_row_bytes += streams[s].row_bytes;
  const int64_t avg_bytes = num_out > 0 ? dst_offsets[num_out] * total_row_bytes / num_out : 0;
  const bool streaming = should_stream(dst_offsets[num_out] * total_row_bytes);
  parallel_for(0, num_out, grain_for_bytes(avg_bytes + 16), [&](int64_t i0, int64_t i1) {
    const char* dst_limits[kMaxStreams];  // end of this task's output, per stream
    for (int s = 0; s < num_streams; ++s) {
      dst_limits[s] = streams[s].dst + dst_offsets[i1] * streams[s].row_bytes;
    }
    for (int64_t i = i0; i < i1;) {
      if (i + 2 * kPrefetchSegments < i1)
        prefetch(src_offsets + permute[i + 2 * kPrefetchSegments]);
      if (i + kPrefetchSegments < i1) {
        const int64_t p_ahead = permute[i + kPrefetchSegments];
        const int64_t ahead = src_offsets[p_ahead];
        const int64_t ahead_rows = src_offsets[p_ahead + 1] - ahead;
        for (int s = 0; s < num_streams; ++s) {
          // Every line of the run's first kShortRunBytes that copy_run reads (its fixed-size
          // read of a short run often straddles two lines).
          const char* first = streams[s].src + ahead * streams[s].row_bytes;
          const int64_t bytes = ahead_rows * streams[s].row_bytes;
          const int64_t read = bytes <= kShortRunBytes / 2 ? kShortRunBytes / 2 : kShortRunBytes;
          for (int64_t offset = 0; offset < read; offset += 64) prefetch(first + offset);
          prefetch(first + read - 1);
        }
      }
      // Segments that follow each other in the source too (a feature-major permutation moves
      // whole features) are contiguous on both sides: one copy moves the whole run of them.
      const int64_t p = permute[i];
      int64_t end = i + 1;
      while (end < i1 && permute[end] == permute[end - 1] + 1) ++end;
      const int64_t src_row = src_offsets[p];
      const int64_t rows = src_offsets[p + (end - i)] - src_row;
      for (int s = 0; s < num_streams; ++s) {
        const PermutedStream& st = streams[s];
        const int64_t rb = st.row_bytes;
        copy_run(st.dst + dst_offsets[i] * rb, st.src + src_row * rb, rows * rb, dst_limits[s],
                 st.src + st.src_bytes, streaming);
      }
      i = end;
    }
    store_fence();
  });
}

// dst[i] = src[permute[i]] for i in [i0, i1), rows of one word_t. (Pointers by value: captured by
// reference in the parallel lambda they would be reloaded after every store.)
template <typename word_t, typename perm_t>
void gather_word_range(const perm_t* permute, int64_t i0, int64_t i1, const char* src, char* dst) {
  for (int64_t i = i0; i < i1; ++i) {
    std::memcpy(dst + i * sizeof(word_t), src + static_cast<int64_t>(permute[i]) * sizeof(word_t),
                sizeof(word_t));
  }
}

// dst[i] = src[permute[i]] for rows of one word_t.
template <typename word_t, typename perm_t>
void gather_words(const perm_t* permute, int64_t num_out, const char* src, char* dst) {
  parallel_for(0, num_out, grain_for_bytes(2 * sizeof(word_t)), [&](int64_t i0, int64_t i1) {
    gather_word_range<word_t>(permute, i0, i1, src, dst);
  });
}

// dst row i = src row permute[i], all rows `row_bytes` wide; src has num_src rows.
template <typename perm_t>
void permute_rows(const perm_t* permute, int64_t num_out, const char* src, int64_t num_src,
                  char* dst, int64_t row_bytes) {
  if (row_bytes == sizeof(uint32_t)) return gather_words<uint32_t>(permute, num_out, src, dst);
  if (row_bytes == sizeof(uint64_t)) return gather_words<uint64_t>(permute, num_out, src, dst);
  parallel_for(0, num_out, grain_for_bytes(row_bytes + 8), [&](int64_t i0, int64_t i1) {
    const char* dst_limit = dst + i1 * row_bytes;
    const char* src_limit = src + num_src * row_bytes;
    for (int64_t i = i0; i < i1; ++i) {
      copy_run(dst + i * row_bytes, src + static_cast<int64_t>(permute[i]) * row_bytes, row_bytes,
               dst_limit, src_limit);
    }
  });
}

// sums[r] = sum of row r of a [rows, cols] matrix of non-negative lengths.
template <typename index_t>
void row_sums(const index_t* lengths, int64_t rows, int64_t cols, int64_t* sums) {
  parallel_for(0, rows, grain_for_bytes(cols * sizeof(index_t)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t sum = 0;
      for (int64_t c = 0; c < cols; ++c) sum += lengths[r * cols + c];
      sums[r] = sum;
    }
  });
}

// offsets[0] = 0, offsets[r + 1] = offsets[r] + the sum of row r of lengths [rows, cols].
template <typename index_t>
void segment_offsets(const index_t* lengths, int64_t rows, int64_t cols, int64_t* offsets) {
  offsets[0] = 0;
  if (cols == 1) {  // the 1-D form: one length per segment
    prefix_sum<true, int64_t>(lengths, offsets + 1, rows);
    return;
  }
  row_sums(lengths, rows, cols, offsets + 1);
  for (int64_t r = 0; r < rows; ++r) offsets[r + 1] += offsets[r];
}

// The rows a segment permutation reads from its streams' sources and writes to their outputs.
struct PermutedRows {
  int64_t src_rows = 0;
  int64_t dst_rows = 0;
};

// Called by permute_sparse once the rows are known: checks the sources hold src_rows rows,
// allocates outputs of dst_rows rows and describes at most kMaxStreams streams in `streams`;
// returns their number. (It may throw: nothing runs in parallel then, and nothing is written.)
using PrepareStreams = FunctionRef<int(const PermutedRows& rows, PermutedStream* streams)>;

// Permutes sparse features: segment t is row t of lengths [num_segments, cols] (cols = B bags of
// one feature, contiguous in the values; cols = 1 for single-entry segments). Writes
// permuted_lengths [num_out, cols] (row i = lengths row permute[i]), then has prepare() set up the
// streams and moves segment permute[i] of every stream to output segment i. permute's entries
// are in [0, num_segments) and the lengths non-negative (checked by the caller).
template <typename perm_t, typename index_t>
void permute_sparse(const perm_t* permute, int64_t num_out, const index_t* lengths,
                    int64_t num_segments, int64_t cols, index_t* permuted_lengths,
                    PrepareStreams prepare) {
  // The output's lengths first: its offsets are then a sequential pass over them, where looking
  // each segment up in src_offsets would be a second random gather. (Offsets are not zeroed:
  // every entry is written.)
  std::unique_ptr<int64_t[]> src_offsets(new int64_t[num_segments + 1]);
  segment_offsets(lengths, num_segments, cols, src_offsets.get());
  const int64_t row_bytes = num_segments == 0 ? 0 : cols * static_cast<int64_t>(sizeof(index_t));
  permute_rows(permute, num_out, reinterpret_cast<const char*>(lengths), num_segments,
               reinterpret_cast<char*>(permuted_lengths), row_bytes);
  std::unique_ptr<int64_t[]> dst_offsets(new int64_t[num_out + 1]);
  segment_offsets(permuted_lengths, num_out, cols, dst_offsets.get());

  PermutedStream streams[kMaxStreams];
  const int num_streams = prepare({src_offsets[num_segments], dst_offsets[num_out]}, streams);
  permute_segments(permute, num_out, src_offsets.get(), dst_offsets.get(), streams, num_streams);
}

}  // namespace recops::sparse::kernels

// Element-wise passes over one [rows x keys] score tile, shared by the attention kernels. Plain
// loops over contiguous rows that GCC vectorises (fast_exp has no libm call); compiled per
// instruction set and called through tile_variants.h's table.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "recops/common/cpu_isa.h"
#include "recops/common/prefetch.h"
#include "recops/common/vec_math.h"
#include "recops/hstu/kernels/relative_bias_math.h"

namespace recops::attention::kernels {

// loop(present) with present = std::bool_constant<operand != nullptr>, so that each case
// compiles to its own loop. One loop with `bias ? bias[j] : 0` would not do: GCC vectorises it as
// a masked load from the null pointer, and the CPU's fault suppression for each such load costs a
// microcode assist (a no-bias backward ran 18x slower).
template <typename Loop>
RECOPS_ALWAYS_INLINE void with_optional(const void* operand, Loop&& loop) {
  if (operand == nullptr) return loop(std::false_type{});
  loop(std::true_type{});
}

// loop(has_bias, has_mask), both compile-time constants (with_optional).
template <typename Loop>
RECOPS_ALWAYS_INLINE void with_optional_operands(const void* bias, const void* mask, Loop&& loop) {
  with_optional(bias, [&](auto has_bias) {
    with_optional(mask, [&](auto has_mask) { loop(has_bias, has_mask); });
  });
}

// HSTU forward: s <- silu(alpha * s + bias) * scale * mask (bias, mask may be null: none, every
// key visible).
template <typename T>
RECOPS_ALWAYS_INLINE void silu_scores_generic(T* s, const T* bias, const T* mask, int64_t n,
                                              T alpha, T scale) {
  with_optional_operands(bias, mask, [&](auto has_bias, auto has_mask) {
    for (int64_t j = 0; j < n; ++j) {
      T x = alpha * s[j];
      if constexpr (has_bias) x += bias[j];
      const T y = x * fast_sigmoid(x) * scale;
      if constexpr (has_mask) {
        s[j] = y * mask[j];
      } else {
        s[j] = y;
      }
    }
  });
}

// HSTU backward, recomputing the forward from the raw scores s = q.k:
//   x = alpha * s + bias, a = silu(x) * scale * mask, dx = dp * scale * mask * silu'(x).
// (bias, mask may be null, as in silu_scores_generic).
// Overwrites s with a and dp with dx.
template <typename T>
RECOPS_ALWAYS_INLINE void silu_score_grad(T* s, T* dp, T x, T m, int64_t j) {
  const T sig = fast_sigmoid(x);
  s[j] = x * sig * m;
  dp[j] = dp[j] * m * sig * (T(1) + x * (T(1) - sig));
}

template <typename T>
RECOPS_ALWAYS_INLINE void silu_score_grads_generic(T* s, T* dp, const T* bias, const T* mask,
                                                   int64_t n, T alpha, T scale) {
  with_optional_operands(bias, mask, [&](auto has_bias, auto has_mask) {
    for (int64_t j = 0; j < n; ++j) {
      T x = alpha * s[j];
      if constexpr (has_bias) x += bias[j];
      if constexpr (has_mask) {
        silu_score_grad(s, dp, x, scale * mask[j], j);
      } else {
        silu_score_grad(s, dp, x, scale, j);
      }
    }
  });
}

// HSTU's relative time bias over keys that share a query time (mask_and_bias.h's
// build_bias_tile): buckets[j] = bucket(|query_time - key_time[j]|), out[j] += ts_w[buckets[j]].
// Scalar: the bucket is two dependent table lookups, which GCC vectorises (as gathers) only when
// tuning for a CPU with fast gathers; variant.h's AVX-512 build writes them out.
template <typename T>
RECOPS_ALWAYS_INLINE void add_time_bias_generic(const double* key_time, int64_t n,
                                                double query_time,
                                                const LogBucketizer::View& bucket, const T* ts_w,
                                                T* out, int32_t* buckets) {
  const LogBucketizer::View local = bucket;  // by value: not reloaded after each store
  for (int64_t j = 0; j < n; ++j) {
    buckets[j] = local(std::abs(query_time - key_time[j]));
    out[j] += ts_w[buckets[j]];
  }
}

// sums[buckets[j]] += g[j] for j < n (the time table's gradient). Chronological keys fall in long
// runs of one log bucket: each run is summed in registers, four partial sums wide, and added to
// its bucket once, instead of a chain of adds through one memory slot (each waiting for the
// previous one's store).
template <typename T>
RECOPS_ALWAYS_INLINE void add_by_bucket_generic(const T* g, const int32_t* buckets, int64_t n,
                                                double* sums) {
  for (int64_t j = 0; j < n;) {
    const int32_t bucket = buckets[j];
    int64_t end = j + 1;
    while (end < n && buckets[end] == bucket) ++end;
    double partial[4] = {0.0, 0.0, 0.0, 0.0};
    for (; j + 4 <= end; j += 4) {
      for (int k = 0; k < 4; ++k) partial[k] += g[j + k];
    }
    for (; j < end; ++j) partial[0] += g[j];
    sums[bucket] += (partial[0] + partial[1]) + (partial[2] + partial[3]);
  }
}

// time_runs_forward_generic's vectors of doubles (64 bytes), kTimeRunVectors at once.
constexpr int64_t kTimeRunLanes = 8, kTimeRunVectors = 4;

// A run of keys whose time deltas to one query fall in one bucket: the keys at sequence positions
// [begin, end) (FuXi-alpha's time channel, hstu/kernels/time_runs.h).
struct TimeRun {
  int64_t begin, end;
  int32_t bucket;
};

// Cuts keys [0, n) (at sequence positions key, key + 1, ..) into the maximal runs whose magnitudes
// |query_time - key_time[j]| fall in one bucket, written to runs; returns their count. A key stays
// in bucket b's run while its clamped magnitude m lies in [thresholds[b], thresholds[b + 1]),
// which is what bucket(m) == b means (the top bucket's upper threshold is NaN, which
// !(m >= high) passes). extend(j, low, high) returns the first key from j whose magnitude is
// outside [low, high), n when none. Chronological keys step from a run to a neighbouring bucket,
// tried first: the bucketizer's dependent table loads cost more than the rest of a run's scan.
template <typename Extend>
RECOPS_ALWAYS_INLINE int64_t time_bucket_runs_with(const double* key_time, int64_t n, int64_t key,
                                                   double query_time,
                                                   const LogBucketizer::View& bucket, TimeRun* runs,
                                                   Extend&& extend) {
  const double* thresholds = bucket.thresholds;
  int64_t count = 0;
  int32_t b = n > 0 ? bucket(std::abs(query_time - key_time[0])) : 0;
  for (int64_t j = 0; j < n;) {
    const int64_t end = extend(j + 1, thresholds[b], thresholds[b + 1]);
    runs[count++] = {key + j, key + end, b};
    j = end;
    if (j == n) break;
    const double m = bucket.clamped(std::abs(query_time - key_time[j]));
    if (m < thresholds[b] && b > 0 && m >= thresholds[b - 1]) {
      --b;
    } else if (m >= thresholds[b + 1] && !(m >= thresholds[b + 2])) {
      ++b;  // thresholds[b + 1] is a number, so b + 2 <= num_buckets + 1
    } else {
      b = bucket(m);
    }
  }
  return count;
}

// The first key from j whose clamped magnitude is outside [low, high), n when none.
RECOPS_ALWAYS_INLINE int64_t time_run_end(const double* key_time, int64_t j, int64_t n,
                                          double query_time, const LogBucketizer::View& bucket,
                                          double low, double high) {
  for (; j < n; ++j) {
    const double m = bucket.clamped(std::abs(query_time - key_time[j]));
    if (!(m >= low) || m >= high) break;
  }
  return j;
}

// time_bucket_runs_with, a key at a time.
RECOPS_ALWAYS_INLINE int64_t time_bucket_runs_generic(const double* key_time, int64_t n,
                                                      int64_t key, double query_time,
                                                      const LogBucketizer::View& bucket,
                                                      TimeRun* runs) {
  const LogBucketizer::View local = bucket;  // by value: not reloaded after each store
  return time_bucket_runs_with(key_time, n, key, query_time, local, runs,
                               [&](int64_t j, double low, double high) {
                                 return time_run_end(key_time, j, n, query_time, local, low, high);
                               });
}

// One query row of the time channel: acc[d] = sum over the runs of
// ts_w[bucket] * (sums[end * dv + d] - sums[begin * dv + d]) for d < dv, where row j of sums is
// the sum of the value rows of keys [0, j).
// The values are summed kTimeRunVectors vectors of kTimeRunLanes at a time, in registers (several
// vectors, so that the runs' adds are not one chain of dependent adds); values past a row's dv are
// read up to kTimeRunVectors * kTimeRunLanes - 1 further (the next row's, or padding past the
// last row).
template <typename T>
RECOPS_ALWAYS_INLINE void time_runs_forward_generic(const TimeRun* runs, int64_t count,
                                                    const T* ts_w, const double* sums, int64_t dv,
                                                    double* acc) {
  constexpr int64_t kWidth = kTimeRunVectors * kTimeRunLanes;
  for (int64_t d0 = 0; d0 < dv; d0 += kWidth) {
    double lanes[kTimeRunVectors][kTimeRunLanes] = {};
    for (int64_t k = 0; k < count; ++k) {
      const double w = ts_w[runs[k].bucket];
      const double* past = sums + runs[k].end * dv + d0;
      const double* first = sums + runs[k].begin * dv + d0;
      for (int64_t c = 0; c < kTimeRunVectors; ++c) {
        for (int64_t l = 0; l < kTimeRunLanes; ++l) {
          lanes[c][l] += w * (past[c * kTimeRunLanes + l] - first[c * kTimeRunLanes + l]);
        }
      }
    }
    std::copy_n(&lanes[0][0], std::min(kWidth, dv - d0), acc + d0);
  }
}

// The backward of a time-channel row whose output gradient is g [dv]: each run adds g . (its value
// sum) to ts_grad[bucket] (unless ts_grad is null), and w g (w = ts_w[bucket]) to the value
// gradient of each of its keys, as differences over the keys: diffs[begin] += w g,
// diffs[end] -= w g (rows of dv values by key position), summed over the keys afterwards. Both go
// by the runs' bounds, a run's begin the previous one's end when they touch: a row of diffs and
// a dot product g . sums[bound] per bound, a run's sum the difference of its bounds'.
template <typename T>
RECOPS_ALWAYS_INLINE void time_runs_backward_generic(const TimeRun* runs, int64_t count,
                                                     const T* ts_w, const double* sums, int64_t dv,
                                                     const double* g, double* diffs,
                                                     double* ts_grad) {
  const auto add_g = [&](int64_t bound, double c) {
    double* row = diffs + bound * dv;
    for (int64_t d = 0; d < dv; ++d) row[d] += c * g[d];
  };
  const auto dot = [&](int64_t bound) {
    const double* row = sums + bound * dv;
    return ts_grad == nullptr ? 0.0 : lane_sum(dv, [&](int64_t d) { return g[d] * row[d]; });
  };
  int64_t bound = -1;           // the last run's end, whose row of diffs is not added yet
  double coef = 0.0, at = 0.0;  // what that row gets times g, and g . sums[bound]
  for (int64_t k = 0; k < count; ++k) {
    const TimeRun& run = runs[k];
    const double w = ts_w[run.bucket];
    if (run.begin != bound) {
      if (bound >= 0) add_g(bound, coef);
      bound = run.begin;
      coef = 0.0;
      at = dot(bound);
    }
    add_g(bound, coef + w);
    const double past = dot(run.end);
    if (ts_grad != nullptr) ts_grad[run.bucket] += past - at;
    bound = run.end;
    coef = -w;
    at = past;
  }
  if (bound >= 0) add_g(bound, coef);
}

// Products of a few query rows (a serving step's) with key and value rows read where they lie,
// vectorised along the rows' values: a product with a padded operand would multiply mostly zeros.
// The rows stream from memory (a user's cached keys), a head's slice of each, so the loops
// prefetch kPrefetchRowsAhead rows ahead of the one they multiply: with only the hardware's
// prefetch, four query rows took 1.7x as long as one on cold keys (B=16, 2052 keys, H=2, D=64).
constexpr int64_t kPrefetchRowsAhead = 16;

// s[r * ld_s + j] = q_r . k_j for r < rows, j < n (rows of d values, row strides ld_q, ld_k).
// Lanes of partial sums let the dot products vectorise; the lanes are then added in a fixed tree,
// which vectorises too (a sequential sum of the lanes cost more than the products at one query
// row). Keys go kKeys at a time so that each load of q serves all of them.
template <typename T>
RECOPS_ALWAYS_INLINE void key_row_dots_generic(const T* q, int64_t ld_q, int64_t rows, const T* k,
                                               int64_t ld_k, int64_t n, int64_t d, T* s,
                                               int64_t ld_s) {
  constexpr int64_t kLanes = 16;
  constexpr int64_t kKeys = 4;
  const auto dots = [&](auto keys, int64_t j) {
    constexpr int64_t kCount = decltype(keys)::value;
    for (int64_t r = 0; r < rows; ++r) {
      const T* qr = q + r * ld_q;
      T lanes[kCount][kLanes] = {};
      T tail[kCount] = {};
      int64_t c = 0;
      for (; c + kLanes <= d; c += kLanes) {
        for (int64_t i = 0; i < kCount; ++i) {
          const T* kj = k + (j + i) * ld_k + c;
          for (int64_t l = 0; l < kLanes; ++l) lanes[i][l] += qr[c + l] * kj[l];
        }
      }
      for (; c < d; ++c) {
        for (int64_t i = 0; i < kCount; ++i) tail[i] += qr[c] * k[(j + i) * ld_k + c];
      }
      for (int64_t i = 0; i < kCount; ++i) {
        s[r * ld_s + j + i] = fold_lanes<kLanes>(lanes[i]) + tail[i];
      }
    }
  };
  int64_t j = 0;
  for (; j + kKeys <= n; j += kKeys) {
    const int64_t ahead = std::min(j + kPrefetchRowsAhead, n);
    prefetch_rows(k, ld_k, ahead, std::min(kKeys, n - ahead), d);
    dots(std::integral_constant<int64_t, kKeys>{}, j);
  }
  for (; j < n; ++j) dots(std::integral_constant<int64_t, 1>{}, j);
}

// out_r (+)= sum_j w[r * ld_w + j] v_j for r < rows over n value rows v_j of dv values (row
// strides ld_v, ld_out), accumulating when `accumulate`. Value rows in the outer loop, so that
// each is read once for a group of up to kRows query rows (reading all of V once per query row
// streamed it from memory `rows` times in a serving step); a group's sums over a block of kBlock
// columns stay in registers (a full block's width is a compile-time constant).
template <typename T>
RECOPS_ALWAYS_INLINE void weighted_value_rows_generic(const T* w, int64_t ld_w, int64_t rows,
                                                      const T* v, int64_t ld_v, int64_t n,
                                                      int64_t dv, T* out, int64_t ld_out,
                                                      bool accumulate) {
  constexpr int64_t kBlock = 64;
  constexpr int64_t kRows = 4;
  const auto block = [&](auto count, auto width, int64_t r0, int64_t c0) {
    constexpr int64_t kCount = decltype(count)::value;
    T acc[kCount][kBlock] = {};
    for (int64_t j = 0; j < n; ++j) {
      const T* vj = v + j * ld_v + c0;
      if (j + kPrefetchRowsAhead < n) prefetch_rows(vj, ld_v, kPrefetchRowsAhead, 1, width);
      for (int64_t i = 0; i < kCount; ++i) {
        const T wij = w[(r0 + i) * ld_w + j];
        for (int64_t c = 0; c < width; ++c) acc[i][c] += wij * vj[c];
      }
    }
    for (int64_t i = 0; i < kCount; ++i) {
      T* o = out + (r0 + i) * ld_out + c0;
      for (int64_t c = 0; c < width; ++c) o[c] = accumulate ? o[c] + acc[i][c] : acc[i][c];
    }
  };
  const auto row_group = [&](auto count, int64_t r0) {
    int64_t c0 = 0;
    for (; c0 + kBlock <= dv; c0 += kBlock) {
      block(count, std::integral_constant<int64_t, kBlock>{}, r0, c0);
    }
    if (c0 < dv) block(count, dv - c0, r0, c0);
  };
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) row_group(std::integral_constant<int64_t, kRows>{}, r);
  switch (rows - r) {  // the last rows as one group too
    case 3:
      return row_group(std::integral_constant<int64_t, 3>{}, r);
    case 2:
      return row_group(std::integral_constant<int64_t, 2>{}, r);
    case 1:
      return row_group(std::integral_constant<int64_t, 1>{}, r);
    default:
      return;
  }
}

template <typename T>
void add_into(T* acc, const T* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] += x[j];
}

template <typename T>
void multiply_into(T* acc, const T* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] *= x[j];
}

// The bf16 bit pattern nearest to x (ties to even; NaN stays NaN): common/half_bits.h's
// bf16_bits_from_float, with the NaN case as a select so that the tile loops calling it vectorise
// (always inlined into each instruction-set variant).
RECOPS_ALWAYS_INLINE uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
}

}  // namespace recops::attention::kernels

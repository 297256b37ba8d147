// One instruction-set variant of the attention tiles' element-wise passes: the entry points of
// tile_variants.h. Included once by each variant_<isa>.cpp after it selected the instruction set
// and defined RECOPS_ISA_NS (the variant's namespace) and RECOPS_ISA_LEVEL (0 baseline, 1 AVX2,
// 2 AVX-512). The generic bodies are always inlined, so each is compiled here for this
// instruction set.
#pragma once

#ifndef RECOPS_ISA_NS
#error "compiled once per instruction set: include from a variant_<isa>.cpp"
#endif

#include "recops/common/kernels/transpose_tile.h"

namespace recops::attention::kernels::RECOPS_ISA_NS {

namespace lanes16 = ::recops::RECOPS_ISA_NS::lanes16;
using ::recops::RECOPS_ISA_NS::transpose_tile;
using ::recops::RECOPS_ISA_NS::transpose_tile_scaled;

template <typename T>
void silu_scores(T* s, const T* bias, const T* mask, int64_t n, T alpha, T scale) {
  silu_scores_generic(s, bias, mask, n, alpha, scale);
}

template <typename T>
void silu_score_grads(T* s, T* dp, const T* bias, const T* mask, int64_t n, T alpha, T scale) {
  silu_score_grads_generic(s, dp, bias, mask, n, alpha, scale);
}

#if RECOPS_ISA_LEVEL == 2
// add_time_bias_generic eight keys at a time, bit for bit (the same clamps, NaN included, and
// comparisons). Chronological keys fall in long runs of one bucket, so a group whose magnitudes
// all lie in the previous group's bucket, [thresholds[b], thresholds[b + 1]), takes that bucket
// and its weight as they are; so does a group that steps down from it into bucket b - 1, as the
// keys near the query time (one compare tells the two apart): in the models' training batches
// these were 16-22% of the groups, two fifths (N = 200) to seven tenths (N = 1024) of those the
// first test missed. The other groups gather from the bucketizer's tables (written out: GCC
// vectorises gathers only when tuning for a CPU that has fast ones, not for the generic x86-64
// the extension is built for), three dependent gathers costing about 8x the fast path.
template <typename T>
void add_time_bias(const double* key_time, int64_t n, double query_time,
                   const LogBucketizer::View& bucket, const T* ts_w, T* out, int32_t* buckets) {
  static_assert(std::is_same_v<T, float>, "float64 tiles run the baseline table");
  int64_t j = 0;
  if (!bucket.several_per_cell) {
    const __m512d query = _mm512_set1_pd(query_time), one = _mm512_set1_pd(1.0);
    const __m512d saturation = _mm512_set1_pd(bucket.saturation);
    const __m512i one_bits = _mm512_set1_epi64(static_cast<int64_t>(LogBucketizer::kOneBits));
    const __m128i shift = _mm_cvtsi32_si128(bucket.cell_shift);
    const __m256i step = _mm256_set1_epi32(1);
    int32_t last = -1;  // the previous group's last bucket (none yet)
    // thresholds[last - 1], thresholds[last], thresholds[last + 1]; none yet, so no test passes.
    __m512d below = _mm512_set1_pd(0.0), low = below, high = below;
    const auto keep_bounds = [&](int32_t k) {
      last = k;
      // NaN below bucket 0 and past the last bucket: no group passes the tests there.
      below = _mm512_set1_pd(k > 0 ? bucket.thresholds[k - 1]
                                   : std::numeric_limits<double>::quiet_NaN());
      low = _mm512_set1_pd(bucket.thresholds[k]);
      high = _mm512_set1_pd(bucket.thresholds[k + 1]);
    };
    for (; j + 8 <= n; j += 8) {
      __m512d m = _mm512_abs_pd(_mm512_sub_pd(query, _mm512_loadu_pd(key_time + j)));
      m = _mm512_min_pd(_mm512_max_pd(m, one), saturation);  // max(NaN, 1) is 1, as clamped()
      __m256i b;
      __m256 w;
      const __mmask8 at_low = _mm512_cmp_pd_mask(m, low, _CMP_GE_OQ);
      const __mmask8 under_high = _mm512_cmp_pd_mask(m, high, _CMP_LT_OQ);
      if ((at_low & under_high) == 0xFF) {
        b = _mm256_set1_epi32(last);
        w = _mm256_set1_ps(ts_w[last]);
      } else if (under_high == 0xFF && _mm512_cmp_pd_mask(m, below, _CMP_GE_OQ) == 0xFF) {
        // In [thresholds[last - 1], thresholds[last + 1]): bucket last where at_low, else last - 1.
        b = _mm256_mask_blend_epi32(at_low, _mm256_set1_epi32(last - 1), _mm256_set1_epi32(last));
        w = _mm256_mask_blend_ps(at_low, _mm256_set1_ps(ts_w[last - 1]),
                                 _mm256_set1_ps(ts_w[last]));
        if ((at_low & 0x80) == 0) keep_bounds(last - 1);
      } else {
        const __m512i cell =
            _mm512_srl_epi64(_mm512_sub_epi64(_mm512_castpd_si512(m), one_bits), shift);
        b = _mm512_i64gather_epi32(cell, bucket.cell_bucket, 4);
        const __m512d next = _mm512_i32gather_pd(_mm256_add_epi32(b, step), bucket.thresholds, 8);
        b = _mm256_mask_add_epi32(b, _mm512_cmp_pd_mask(m, next, _CMP_GE_OQ), b, step);
        w = _mm256_i32gather_ps(ts_w, b, 4);
        keep_bounds(_mm256_extract_epi32(b, 7));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(buckets + j), b);
      _mm256_storeu_ps(out + j, _mm256_add_ps(_mm256_loadu_ps(out + j), w));
    }
  }
  add_time_bias_generic(key_time + j, n - j, query_time, bucket, ts_w, out + j, buckets + j);
}
#else
template <typename T>
void add_time_bias(const double* key_time, int64_t n, double query_time,
                   const LogBucketizer::View& bucket, const T* ts_w, T* out, int32_t* buckets) {
  add_time_bias_generic(key_time, n, query_time, bucket, ts_w, out, buckets);
}
#endif

#if RECOPS_ISA_LEVEL == 2
// time_bucket_runs_with eight keys a compare: a run of chronological keys is long (tens of keys
// at N = 1024), so the scan stops where a group first leaves the run's bucket.
inline int64_t time_bucket_runs(const double* key_time, int64_t n, int64_t key, double query_time,
                                const LogBucketizer::View& bucket, TimeRun* runs) {
  const LogBucketizer::View local = bucket;
  const __m512d query = _mm512_set1_pd(query_time), one = _mm512_set1_pd(1.0);
  const __m512d saturation = _mm512_set1_pd(local.saturation);
  return time_bucket_runs_with(
      key_time, n, key, query_time, local, runs, [&](int64_t j, double low, double high) {
        const __m512d lo = _mm512_set1_pd(low), hi = _mm512_set1_pd(high);
        for (; j + 8 <= n; j += 8) {
          __m512d m = _mm512_abs_pd(_mm512_sub_pd(query, _mm512_loadu_pd(key_time + j)));
          m = _mm512_min_pd(_mm512_max_pd(m, one), saturation);  // max(NaN, 1) is 1, as clamped()
          // In the run: m >= low and not m >= high (true against the top bucket's NaN).
          const __mmask8 inside =
              _mm512_cmp_pd_mask(m, lo, _CMP_GE_OQ) & _mm512_cmp_pd_mask(m, hi, _CMP_NGE_UQ);
          if (inside != 0xFF) return j + __builtin_ctz(~static_cast<unsigned>(inside));
        }
        return time_run_end(key_time, j, n, query_time, local, low, high);
      });
}
#else
inline int64_t time_bucket_runs(const double* key_time, int64_t n, int64_t key, double query_time,
                                const LogBucketizer::View& bucket, TimeRun* runs) {
  return time_bucket_runs_generic(key_time, n, key, query_time, bucket, runs);
}
#endif

template <typename T>
void time_runs_forward(const TimeRun* runs, int64_t count, const T* ts_w, const double* sums,
                       int64_t dv, double* acc) {
  time_runs_forward_generic(runs, count, ts_w, sums, dv, acc);
}

template <typename T>
void time_runs_backward(const TimeRun* runs, int64_t count, const T* ts_w, const double* sums,
                        int64_t dv, const double* g, double* diffs, double* ts_grad) {
  time_runs_backward_generic(runs, count, ts_w, sums, dv, g, diffs, ts_grad);
}

#if RECOPS_ISA_LEVEL == 2
// x's lanes shifted up by kLanes, zeros shifted in: [0, .., 0, x0, x1, ..].
template <int kLanes>
RECOPS_ALWAYS_INLINE __m512d shift_lanes_up(__m512d x) {
  return _mm512_castsi512_pd(
      _mm512_alignr_epi64(_mm512_castpd_si512(x), _mm512_setzero_si512(), 8 - kLanes));
}

// The running sums of x's lanes: lane i = x0 + .. + xi.
RECOPS_ALWAYS_INLINE __m512d running_sums(__m512d x) {
  x = _mm512_add_pd(x, shift_lanes_up<1>(x));
  x = _mm512_add_pd(x, shift_lanes_up<2>(x));
  return _mm512_add_pd(x, shift_lanes_up<4>(x));
}

// add_by_bucket_generic in vectors, which GCC leaves scalar: 16 keys at a time, the running sum
// of the row's values in double (two 8-lane scans); where the bucket changes, the run ending there
// adds its running sum's growth to its bucket. Real timestamps' runs are a few keys long (at
// ML-100K a group of 8 keys lay in one bucket in under half the groups): a run costs a scalar
// subtraction and add, not a vector reduction. The values add in another order than the generic
// body's.
template <typename T>
void add_by_bucket(const T* g, const int32_t* buckets, int64_t n, double* sums) {
  static_assert(std::is_same_v<T, float>, "float64 tiles run the baseline table");
  if (n == 0) return;
  const __m512i last_lane = _mm512_set1_epi64(7);
  __m512d carry = _mm512_setzero_pd();  // the running sum before the group, in every lane
  double run_start = 0.0;               // the running sum before the current run
  int32_t bucket = buckets[0];          // the current run's
  double before[17];                    // before[k]: the running sum before the group's key k
  for (int64_t j = 0; j < n; j += 16) {
    const int64_t m = std::min<int64_t>(16, n - j);
    const __mmask16 valid = m == 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << m) - 1u);
    const __m512 values = _mm512_maskz_loadu_ps(valid, g + j);
    const __m512d low =
        _mm512_add_pd(carry, running_sums(_mm512_cvtps_pd(_mm512_castps512_ps256(values))));
    const __m512d high =
        _mm512_add_pd(_mm512_permutexvar_pd(last_lane, low),
                      running_sums(_mm512_cvtps_pd(_mm512_extractf32x8_ps(values, 1))));
    before[0] = _mm512_cvtsd_f64(carry);
    _mm512_storeu_pd(before + 1, low);
    _mm512_storeu_pd(before + 9, high);
    carry = _mm512_permutexvar_pd(last_lane, high);
    // Keys whose bucket differs from the key's before them (the first's: the current run's).
    const __m512i group = _mm512_maskz_loadu_epi32(valid, buckets + j);
    const __m512i previous = _mm512_alignr_epi32(group, _mm512_set1_epi32(bucket), 15);
    for (uint32_t starts = _mm512_mask_cmpneq_epi32_mask(valid, group, previous); starts != 0;
         starts &= starts - 1) {
      const int k = __builtin_ctz(starts);
      sums[bucket] += before[k] - run_start;
      run_start = before[k];
      bucket = buckets[j + k];
    }
  }
  sums[bucket] += _mm512_cvtsd_f64(carry) - run_start;
}
#else
template <typename T>
void add_by_bucket(const T* g, const int32_t* buckets, int64_t n, double* sums) {
  add_by_bucket_generic(g, buckets, n, sums);
}
#endif

#if RECOPS_ISA_LEVEL == 2
// The sum of each of four vectors' lanes, as [sum(a), sum(b), sum(c), sum(d)].
RECOPS_ALWAYS_INLINE __m128 lane_sums4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // Per 128-bit lane: ab = [a0+a2, b0+b2, a1+a3, b1+b3], cd likewise, then [a, b, c, d] partials.
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 abcd = _mm512_add_ps(
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
  const __m256 halves =
      _mm256_add_ps(_mm512_castps512_ps256(abcd), _mm512_extractf32x8_ps(abcd, 1));
  return _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1));
}

// key_row_dots_generic with its accumulators in registers (GCC keeps the generic body's
// [keys][16] lanes on the stack, a store and a reload per multiply-add, which made the delta op's
// few-row path compute-bound: 4 new rows over 2048 cached keys took 2.7 ms, 2.1 ms here): four
// keys at a time, each row's four dot products in four vectors over d (the tail masked), their
// lanes summed together. The sums add in another order than the generic body's.
template <typename T>
void key_row_dots(const T* q, int64_t ld_q, int64_t rows, const T* k, int64_t ld_k, int64_t n,
                  int64_t d, T* s, int64_t ld_s) {
  static_assert(std::is_same_v<T, float>, "float64 tiles run the baseline table");
  constexpr int64_t kKeys = 4;
  const __mmask16 tail = static_cast<__mmask16>((1u << (d % 16)) - 1u);
  const int64_t whole = d - d % 16;
  int64_t j = 0;
  for (; j + kKeys <= n; j += kKeys) {
    const int64_t ahead = std::min(j + kPrefetchRowsAhead, n);
    prefetch_rows(k, ld_k, ahead, std::min(kKeys, n - ahead), d);
    const T* k0 = k + j * ld_k;
    const T *k1 = k0 + ld_k, *k2 = k1 + ld_k, *k3 = k2 + ld_k;
    for (int64_t r = 0; r < rows; ++r) {
      const T* qr = q + r * ld_q;
      __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t c = 0; c < whole; c += 16) {
        const __m512 x = _mm512_loadu_ps(qr + c);
        a0 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k0 + c), a0);
        a1 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k1 + c), a1);
        a2 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k2 + c), a2);
        a3 = _mm512_fmadd_ps(x, _mm512_loadu_ps(k3 + c), a3);
      }
      // The tail apart: a mask computed for every vector made the op 8% slower at d = 32.
      if (tail != 0) {
        const __m512 x = _mm512_maskz_loadu_ps(tail, qr + whole);
        a0 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(tail, k0 + whole), a0);
        a1 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(tail, k1 + whole), a1);
        a2 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(tail, k2 + whole), a2);
        a3 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(tail, k3 + whole), a3);
      }
      _mm_storeu_ps(s + r * ld_s + j, lane_sums4(a0, a1, a2, a3));
    }
  }
  if (j < n) key_row_dots_generic(q, ld_q, rows, k + j * ld_k, ld_k, n - j, d, s + j, ld_s);
}
#else
template <typename T>
void key_row_dots(const T* q, int64_t ld_q, int64_t rows, const T* k, int64_t ld_k, int64_t n,
                  int64_t d, T* s, int64_t ld_s) {
  key_row_dots_generic(q, ld_q, rows, k, ld_k, n, d, s, ld_s);
}
#endif

#if RECOPS_ISA_LEVEL == 2
// weighted_value_rows_generic as the register-blocked small product it is, out (+)= W V
// (common/kernels/small_gemm.h; AVX-512, so always available here): GCC keeps the generic body's
// [rows][64] sums on the stack, a load and a store around every multiply-add, which took 30% of
// a serving step's delta op at 10 new rows over 209 keys.
template <typename T>
void weighted_value_rows(const T* w, int64_t ld_w, int64_t rows, const T* v, int64_t ld_v,
                         int64_t n, int64_t dv, T* out, int64_t ld_out, bool accumulate) {
  static_assert(std::is_same_v<T, float>, "float64 tiles run the baseline table");
  small_gemm(rows, dv, n, w, ld_w, v, ld_v, out, ld_out, accumulate);
}
#else
template <typename T>
void weighted_value_rows(const T* w, int64_t ld_w, int64_t rows, const T* v, int64_t ld_v,
                         int64_t n, int64_t dv, T* out, int64_t ld_out, bool accumulate) {
  weighted_value_rows_generic(w, ld_w, rows, v, ld_v, n, dv, out, ld_out, accumulate);
}
#endif

template <typename T>
T mask_row(T* s, int64_t n, const uint8_t* keep) {
  return mask_row_generic(s, n, keep);
}

template <typename T>
T exp_row(T* s, int64_t n, T m) {
  return exp_row_generic(s, n, m);
}

template <typename T>
void dropout_row(T* p, int64_t n, const RowDropout<T>& dropout, int64_t j0) {
  dropout_row_generic(p, n, dropout, j0);
}

template <typename T>
void softmax_grad_row(T* s, T* dp, int64_t n, T lse, T d, T scale, const RowDropout<T>* dropout,
                      int64_t j0) {
  softmax_grad_row_generic(s, dp, n, lse, d, scale, dropout, j0);
}

template <typename T>
void expand_position_terms(T* diag, int64_t rows, int64_t n, int64_t lanes, const int32_t* delta,
                           const T* c2p_t, int64_t c2p_ld, const T* p2c_t, int64_t p2c_ld,
                           int64_t first) {
  expand_position_terms_generic(diag, rows, n, lanes, delta, c2p_t, c2p_ld, p2c_t, p2c_ld, first);
}

template <typename T>
void accumulate_position_grads(const T* diag, int64_t rows, int64_t n, int64_t lanes,
                               const int32_t* delta, T* dc2p_t, int64_t dc2p_ld, T* dp2c_t,
                               int64_t dp2c_ld, int64_t first) {
  accumulate_position_grads_generic(diag, rows, n, lanes, delta, dc2p_t, dc2p_ld, dp2c_t, dp2c_ld,
                                    first);
}

template <typename T>
void add_uniform_position_terms(T* tile, int64_t rows, int64_t n, const T* c2p, const T* p2c) {
  add_uniform_position_terms_generic(tile, rows, n, c2p, p2c);
}

template <typename T>
void accumulate_uniform_position_grads(const T* ds, int64_t rows, int64_t n, T* dc2p, T* dp2c) {
  accumulate_uniform_position_grads_generic(ds, rows, n, dc2p, dp2c);
}

void transpose_bf16(const uint16_t* src, int64_t rows, int64_t cols, int64_t ld_src, uint16_t* dst,
                    int64_t ld_dst) {
  lanes16::transpose_matrix<uint16_t>(src, rows, cols, ld_src, dst, ld_dst);
}

void transpose_bf16_pairs(const uint16_t* src, int64_t rows, int64_t pairs, int64_t ld_src,
                          uint16_t* dst, int64_t ld_dst) {
  lanes16::transpose_matrix<uint32_t>(src, rows, pairs, ld_src, dst, 2 * ld_dst);
}

// fp32 shearing moves 16 x 16 blocks through registers: 16 contiguous loads, an in-register
// transpose, 16 contiguous stores. Within a group of 16 rows r0 + t, block m holds diagonals
// e0 + e' (e0 = rows - 1 - r0 + 16 m, lanes r0 + t) = tile row r0 + t, columns 16 m + t + e'.
// Columns no full block covers go element by element. float64 shears element by element.
namespace shear16 {

using Vec16 = lanes16::Vec<float>;
using lanes16::load;
using lanes16::store;

// Full 16 x 16 blocks in a group of 16 rows of an n-column tile.
inline int64_t full_blocks(int64_t n) {
  return n >= 31 ? (n - 31) / 16 + 1 : 0;
}

inline void unshear_add(const float* diag, int64_t rows, int64_t n, int64_t lanes, float* tile) {
  int64_t r0 = 0;
  for (; r0 + 16 <= rows; r0 += 16) {
    const int64_t blocks = full_blocks(n);
    for (int64_t m = 0; m < blocks; ++m) {
      Vec16 v[16];
      const float* d = diag + (rows - 1 - r0 + 16 * m) * lanes + r0;
      for (int e = 0; e < 16; ++e) load<float>(d + e * lanes, v[e]);
      lanes16::transpose<float>(v);
      for (int t = 0; t < 16; ++t) {
        float* row = tile + (r0 + t) * n + 16 * m + t;
        Vec16 sum;
        load<float>(row, sum);
        sum += v[t];
        store<float>(row, sum);
      }
    }
    for (int64_t t = 0; t < 16; ++t) {
      const int64_t r = r0 + t;
      const float* d = diag + (rows - 1 - r) * lanes + r;
      float* row = tile + r * n;
      for (int64_t j = 0; j < std::min(t, n); ++j) row[j] += d[j * lanes];
      for (int64_t j = 16 * blocks + t; j < n; ++j) row[j] += d[j * lanes];
    }
  }
  if (r0 < rows) {  // the last rows: element by element
    for (int64_t r = r0; r < rows; ++r) {
      const float* d = diag + (rows - 1 - r) * lanes + r;
      for (int64_t j = 0; j < n; ++j) tile[r * n + j] += d[j * lanes];
    }
  }
}

inline void shear_tile(const float* tile, int64_t rows, int64_t n, float* diag, int64_t lanes) {
  int64_t r0 = 0;
  for (; r0 + 16 <= rows; r0 += 16) {
    const int64_t blocks = full_blocks(n);
    for (int64_t m = 0; m < blocks; ++m) {
      Vec16 v[16];
      for (int t = 0; t < 16; ++t) load<float>(tile + (r0 + t) * n + 16 * m + t, v[t]);
      lanes16::transpose<float>(v);
      float* d = diag + (rows - 1 - r0 + 16 * m) * lanes + r0;
      for (int e = 0; e < 16; ++e) store<float>(d + e * lanes, v[e]);
    }
    for (int64_t t = 0; t < 16; ++t) {
      const int64_t r = r0 + t;
      float* d = diag + (rows - 1 - r) * lanes + r;
      const float* row = tile + r * n;
      for (int64_t j = 0; j < std::min(t, n); ++j) d[j * lanes] = row[j];
      for (int64_t j = 16 * blocks + t; j < n; ++j) d[j * lanes] = row[j];
    }
  }
  for (int64_t r = r0; r < rows; ++r) {
    float* d = diag + (rows - 1 - r) * lanes + r;
    for (int64_t j = 0; j < n; ++j) d[j * lanes] = tile[r * n + j];
  }
}

}  // namespace shear16

template <typename T>
void unshear_add(const T* diag, int64_t rows, int64_t n, int64_t lanes, T* tile) {
  if constexpr (std::is_same_v<T, float>) {
    shear16::unshear_add(diag, rows, n, lanes, tile);
  } else {
    unshear_add_generic(diag, rows, n, lanes, tile);
  }
}

template <typename T>
void shear_tile(const T* tile, int64_t rows, int64_t n, T* diag, int64_t lanes) {
  if constexpr (std::is_same_v<T, float>) {
    shear16::shear_tile(tile, rows, n, diag, lanes);
  } else {
    shear_tile_generic(tile, rows, n, diag, lanes);
  }
}

void to_bf16(const float* src, uint16_t* dst, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits(scale * src[i]);
}

void to_bf16_vnni(const float* src, int64_t rows, int64_t cols, uint16_t* dst, float scale) {
  for (int64_t r = 0; r < rows; r += 2) {
    const float* even = src + r * cols;
    const float* odd = even + cols;
    uint16_t* out = dst + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      out[2 * c] = bf16_bits(scale * even[c]);
      out[2 * c + 1] = bf16_bits(scale * odd[c]);
    }
  }
}

void silu_scores_to_bf16(const float* s, const float* bias, const float* mask, int64_t n,
                         float alpha, float scale, uint16_t* out) {
  with_optional_operands(bias, mask, [&](auto has_bias, auto has_mask) {
    for (int64_t j = 0; j < n; ++j) {
      float x = alpha * s[j];
      if constexpr (has_bias) x += bias[j];
      const float y = x * fast_sigmoid(x) * scale;
      out[j] = bf16_bits(has_mask ? y * mask[j] : y);
    }
  });
}

void backward_operands_to_bf16(const float* a, const float* ds, int64_t rows, int64_t cols,
                               float alpha, uint16_t* a_vnni, uint16_t* ds_rows,
                               uint16_t* ds_vnni) {
  for (int64_t r = 0; r < rows; r += 2) {
    const float *a0 = a + r * cols, *a1 = a0 + cols;
    const float *d0 = ds + r * cols, *d1 = d0 + cols;
    uint16_t *av = a_vnni + r * cols, *dr = ds_rows + r * cols, *dv = ds_vnni + r * cols;
    for (int64_t c = 0; c < cols; ++c) {
      const uint16_t g0 = bf16_bits(alpha * d0[c]), g1 = bf16_bits(alpha * d1[c]);
      av[2 * c] = bf16_bits(a0[c]);
      av[2 * c + 1] = bf16_bits(a1[c]);
      dr[c] = g0;
      dr[cols + c] = g1;
      dv[2 * c] = g0;
      dv[2 * c + 1] = g1;
    }
  }
}

template <typename T>
constexpr TileOps<T> make_tile_ops() {
  return {&silu_scores<T>,
          &silu_score_grads<T>,
          &add_time_bias<T>,
          &add_by_bucket<T>,
          &time_bucket_runs,
          &time_runs_forward<T>,
          &time_runs_backward<T>,
          &key_row_dots<T>,
          &weighted_value_rows<T>,
          &transpose_tile<T>,
          &transpose_tile_scaled<T>,
          &mask_row<T>,
          &exp_row<T>,
          &dropout_row<T>,
          &softmax_grad_row<T>,
          &expand_position_terms<T>,
          &unshear_add<T>,
          &shear_tile<T>,
          &accumulate_position_grads<T>,
          &add_uniform_position_terms<T>,
          &accumulate_uniform_position_grads<T>};
}

const TileKernels kTileKernels = {
    make_tile_ops<float>(),     &to_bf16,        &to_bf16_vnni,        &silu_scores_to_bf16,
    &backward_operands_to_bf16, &transpose_bf16, &transpose_bf16_pairs};

#if RECOPS_ISA_LEVEL == 2
// For CPUs with AVX512_BF16 (tile_variants.h).
const TileKernels kNativeBf16TileKernels = {make_tile_ops<float>(),
                                            &to_bf16,
                                            &to_bf16_vnni,
                                            &native_bf16::silu_scores_to_bf16,
                                            &backward_operands_to_bf16,
                                            &transpose_bf16,
                                            &transpose_bf16_pairs};
#endif

#if RECOPS_ISA_LEVEL == 0
const TileOps<double> kDoubleTileOps = make_tile_ops<double>();
#endif

}  // namespace recops::attention::kernels::RECOPS_ISA_NS

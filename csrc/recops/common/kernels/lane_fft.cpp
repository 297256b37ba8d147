// lane_fft (lane_fft.h), compiled for AVX-512.
#include "recops/common/kernels/lane_fft.h"

#include <cmath>
#include <cstdint>

#include "recops/common/cpu_isa.h"

#if RECOPS_X86_VARIANTS
#include <immintrin.h>
#endif

namespace recops {

bool lane_fft_available() {
  return static_cast<int>(supported_cpu_isa()) >= static_cast<int>(CpuIsa::kAvx512);
}

FftTwiddles::FftTwiddles(int64_t size)
    : size_(size), re_(static_cast<size_t>(size), 0.0f), im_(static_cast<size_t>(size), 0.0f) {
  const double pi = std::acos(-1.0);
  for (int64_t h = 1; h < size; h *= 2) {
    for (int64_t k = 0; k < h; ++k) {
      re_[h + k] = static_cast<float>(std::cos(pi * static_cast<double>(k) / h));
      im_[h + k] = static_cast<float>(-std::sin(pi * static_cast<double>(k) / h));
    }
  }
}

}  // namespace recops

#if RECOPS_X86_VARIANTS
RECOPS_TARGET_AVX512_BEGIN
namespace recops {
namespace {

// A complex vector: kFftLanes values of re and of im.
struct Lanes {
  __m512 re, im;
};

inline Lanes load(const float* re, const float* im, int64_t t) {
  return {_mm512_load_ps(re + t * kFftLanes), _mm512_load_ps(im + t * kFftLanes)};
}
inline void store(float* re, float* im, int64_t t, Lanes x) {
  _mm512_store_ps(re + t * kFftLanes, x.re);
  _mm512_store_ps(im + t * kFftLanes, x.im);
}
inline Lanes add(Lanes a, Lanes b) {
  return {_mm512_add_ps(a.re, b.re), _mm512_add_ps(a.im, b.im)};
}
inline Lanes sub(Lanes a, Lanes b) {
  return {_mm512_sub_ps(a.re, b.re), _mm512_sub_ps(a.im, b.im)};
}

// x times the one complex value (wr, wi), or times its conjugate.
inline Lanes times(Lanes x, float wr, float wi, bool conjugate) {
  const __m512 r = _mm512_set1_ps(wr), i = _mm512_set1_ps(conjugate ? -wi : wi);
  return {_mm512_fmsub_ps(x.re, r, _mm512_mul_ps(x.im, i)),
          _mm512_fmadd_ps(x.re, i, _mm512_mul_ps(x.im, r))};
}

// x times twiddle entry j, or times its conjugate (kConj).
template <bool kConj>
inline Lanes twiddle(Lanes x, const FftTwiddles& tw, int64_t j) {
  return times(x, tw.re()[j], tw.im()[j], kConj);
}

// fn(k, t0, t1) for the pairs of samples t0 = b + k, t1 = t0 + h of each block b of 2h (a stage of
// half-span h).
template <typename Fn>
inline void for_each_pair(int64_t size, int64_t h, Fn&& fn) {
  for (int64_t b = 0; b < size; b += 2 * h) {
    for (int64_t k = 0; k < h; ++k) fn(k, b + k, b + k + h);
  }
}

// fn(k, t0, t1, t2, t3) for the samples t0 = b + k, t0 + h/2, t0 + h, t0 + 3h/2 of each block b of
// 2h (the stages of half-spans h and h / 2 in one pass, the four samples in registers between).
template <typename Fn>
inline void for_each_quad(int64_t size, int64_t h, Fn&& fn) {
  const int64_t q = h / 2;
  for (int64_t b = 0; b < size; b += 2 * h) {
    for (int64_t k = 0; k < q; ++k) fn(k, b + k, b + k + q, b + k + h, b + k + h + q);
  }
}

// One decimation-in-frequency stage of half-span h: (a, b) -> (a + b, (a - b) w^k).
void forward_stage(const FftTwiddles& tw, int64_t size, int64_t h, float* re, float* im) {
  for_each_pair(size, h, [&](int64_t k, int64_t t0, int64_t t1) {
    const Lanes x0 = load(re, im, t0), x1 = load(re, im, t1);
    store(re, im, t0, add(x0, x1));
    store(re, im, t1, twiddle<false>(sub(x0, x1), tw, h + k));
  });
}

// The stages of half-spans h and h / 2 in one pass.
void forward_stage_pair(const FftTwiddles& tw, int64_t size, int64_t h, float* re, float* im) {
  const int64_t q = h / 2;
  for_each_quad(size, h, [&](int64_t k, int64_t t0, int64_t t1, int64_t t2, int64_t t3) {
    const Lanes x0 = load(re, im, t0), x1 = load(re, im, t1);
    const Lanes x2 = load(re, im, t2), x3 = load(re, im, t3);
    const Lanes s02 = add(x0, x2), d02 = twiddle<false>(sub(x0, x2), tw, h + k);
    const Lanes s13 = add(x1, x3), d13 = twiddle<false>(sub(x1, x3), tw, h + k + q);
    store(re, im, t0, add(s02, s13));
    store(re, im, t1, twiddle<false>(sub(s02, s13), tw, q + k));
    store(re, im, t2, add(d02, d13));
    store(re, im, t3, twiddle<false>(sub(d02, d13), tw, q + k));
  });
}

// The inverse of forward_stage, times 2: (p, q) -> (p + q conj(w^k), p - q conj(w^k)).
void inverse_stage(const FftTwiddles& tw, int64_t size, int64_t h, float* re, float* im) {
  for_each_pair(size, h, [&](int64_t k, int64_t t0, int64_t t1) {
    const Lanes x0 = load(re, im, t0), u = twiddle<true>(load(re, im, t1), tw, h + k);
    store(re, im, t0, add(x0, u));
    store(re, im, t1, sub(x0, u));
  });
}

// The inverse of forward_stage_pair: the stage of half-span h / 2, then that of h.
void inverse_stage_pair(const FftTwiddles& tw, int64_t size, int64_t h, float* re, float* im) {
  const int64_t q = h / 2;
  for_each_quad(size, h, [&](int64_t k, int64_t t0, int64_t t1, int64_t t2, int64_t t3) {
    const Lanes y0 = load(re, im, t0), y2 = load(re, im, t2);
    const Lanes u1 = twiddle<true>(load(re, im, t1), tw, q + k);
    const Lanes u3 = twiddle<true>(load(re, im, t3), tw, q + k);
    const Lanes a0 = add(y0, u1), a1 = sub(y0, u1), a2 = add(y2, u3), a3 = sub(y2, u3);
    const Lanes v2 = twiddle<true>(a2, tw, h + k), v3 = twiddle<true>(a3, tw, h + k + q);
    store(re, im, t0, add(a0, v2));
    store(re, im, t2, sub(a0, v2));
    store(re, im, t1, add(a1, v3));
    store(re, im, t3, sub(a1, v3));
  });
}

int log2_of(int64_t size) {
  int bits = 0;
  while ((int64_t{1} << bits) < size) ++bits;
  return bits;
}

// Lane l of (even, odd) gathers values 2l and 2l + 1 of the 32 in (lo, hi); (low, high) put them
// back from lane l of (re, im). Built in each call: a vector constant at namespace scope would run
// AVX-512 code when the library loads, on any CPU.
inline __m512i even_lanes() {
  return _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
}
inline __m512i odd_lanes() {
  return _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
inline __m512i low_pairs() {
  return _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
}
inline __m512i high_pairs() {
  return _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
}

// The masks of the first and second 16 of `cols` values.
inline __mmask16 first_mask(int64_t cols) {
  return cols >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << cols) - 1u);
}
inline __mmask16 second_mask(int64_t cols) {
  return cols <= 16 ? __mmask16(0) : first_mask(cols - 16);
}

}  // namespace

void lane_fft_forward(const FftTwiddles& tw, int64_t size, float* re, float* im) {
  int64_t h = size / 2;
  if (log2_of(size) % 2 == 1) {
    forward_stage(tw, size, h, re, im);
    h /= 2;
  }
  for (; h >= 2; h /= 4) forward_stage_pair(tw, size, h, re, im);
}

void lane_fft_inverse(const FftTwiddles& tw, int64_t size, float* re, float* im) {
  const bool odd = log2_of(size) % 2 == 1;
  const int64_t last_pair = odd ? size / 4 : size / 2;
  for (int64_t h = 2; h <= last_pair; h *= 4) inverse_stage_pair(tw, size, h, re, im);
  if (odd) inverse_stage(tw, size, size / 2, re, im);
}

void lane_fft_load_pairs(const float* x, int64_t ld, int64_t rows, int64_t cols, int64_t size,
                         float* re, float* im) {
  const __mmask16 m0 = first_mask(cols), m1 = second_mask(cols);
  const __m512i even = even_lanes(), odd = odd_lanes();
  for (int64_t t = 0; t < rows; ++t) {
    const __m512 lo = _mm512_maskz_loadu_ps(m0, x + t * ld);
    const __m512 hi = _mm512_maskz_loadu_ps(m1, x + t * ld + 16);
    _mm512_store_ps(re + t * kFftLanes, _mm512_permutex2var_ps(lo, even, hi));
    _mm512_store_ps(im + t * kFftLanes, _mm512_permutex2var_ps(lo, odd, hi));
  }
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t t = rows; t < size; ++t) {
    _mm512_store_ps(re + t * kFftLanes, zero);
    _mm512_store_ps(im + t * kFftLanes, zero);
  }
}

void lane_fft_store_pairs(const float* re, const float* im, int64_t rows, int64_t cols, float scale,
                          bool accumulate, float* y, int64_t ld) {
  const __mmask16 m0 = first_mask(cols), m1 = second_mask(cols);
  const __m512 s = _mm512_set1_ps(scale);
  const __m512i low = low_pairs(), high = high_pairs();
  for (int64_t t = 0; t < rows; ++t) {
    const __m512 r = _mm512_mul_ps(_mm512_load_ps(re + t * kFftLanes), s);
    const __m512 i = _mm512_mul_ps(_mm512_load_ps(im + t * kFftLanes), s);
    __m512 lo = _mm512_permutex2var_ps(r, low, i), hi = _mm512_permutex2var_ps(r, high, i);
    float* row = y + t * ld;
    if (accumulate) {
      lo = _mm512_add_ps(lo, _mm512_maskz_loadu_ps(m0, row));
      hi = _mm512_add_ps(hi, _mm512_maskz_loadu_ps(m1, row + 16));
    }
    _mm512_mask_storeu_ps(row, m0, lo);
    _mm512_mask_storeu_ps(row + 16, m1, hi);
  }
}

void lane_fft_multiply(float* re, float* im, int64_t size, const float* w_re, const float* w_im,
                       bool conjugate) {
  for (int64_t t = 0; t < size; ++t) {
    store(re, im, t, times(load(re, im, t), w_re[t], w_im[t], conjugate));
  }
}

void lane_fft_add_cross_spectrum(const float* a_re, const float* a_im, const float* b_re,
                                 const float* b_im, int64_t size, float* acc_re, float* acc_im) {
  for (int64_t t = 0; t < size; ++t) {
    const Lanes a = load(a_re, a_im, t), b = load(b_re, b_im, t), acc = load(acc_re, acc_im, t);
    // (ar + i ai)(br - i bi) = (ar br + ai bi) + i (ai br - ar bi)
    store(acc_re, acc_im, t,
          {_mm512_fmadd_ps(a.im, b.im, _mm512_fmadd_ps(a.re, b.re, acc.re)),
           _mm512_fnmadd_ps(a.re, b.im, _mm512_fmadd_ps(a.im, b.re, acc.im))});
  }
}

}  // namespace recops
RECOPS_TARGET_END
#else
namespace recops {
void lane_fft_forward(const FftTwiddles&, int64_t, float*, float*) {}
void lane_fft_inverse(const FftTwiddles&, int64_t, float*, float*) {}
void lane_fft_load_pairs(const float*, int64_t, int64_t, int64_t, int64_t, float*, float*) {}
void lane_fft_store_pairs(const float*, const float*, int64_t, int64_t, float, bool, float*,
                          int64_t) {}
void lane_fft_multiply(float*, float*, int64_t, const float*, const float*, bool) {}
void lane_fft_add_cross_spectrum(const float*, const float*, const float*, const float*, int64_t,
                                 float*, float*) {}
}  // namespace recops
#endif

// Complex FFTs of kFftLanes signals at once, one signal per vector lane, for convolutions of many
// columns by one kernel (FuXi-alpha's position channel: hstu/kernels/position_fft.h). A signal
// block holds re and im arrays of [size][kFftLanes] floats: row t is sample t of every lane, so
// every butterfly is a few whole-vector operations and the twiddle factor is one broadcast value.
//
// The forward transform takes natural order to bit-reversed order (decimation in frequency), the
// inverse bit-reversed order back to natural order (decimation in time), so a convolution (forward,
// a product with a kernel's spectrum in the same order, inverse) never permutes. Two radix-2 stages
// run per pass over the block (radix 4), halving the passes over memory.
//
// Torch-free; AVX-512 only (lane_fft_available; the callers keep their direct products elsewhere).
#pragma once

#include <cstdint>
#include <vector>

namespace recops {

constexpr int64_t kFftLanes = 16;

// Whether the lane FFT runs on this CPU (AVX-512).
bool lane_fft_available();

// The twiddle factors of every power-of-two size up to `size`: entry h + k is exp(-i pi k / h)
// for the half-span h of a stage and k < h (computed in double, rounded once).
class FftTwiddles {
 public:
  explicit FftTwiddles(int64_t size);
  int64_t size() const { return size_; }
  const float* re() const { return re_.data(); }
  const float* im() const { return im_.data(); }

 private:
  int64_t size_;
  std::vector<float> re_, im_;
};

// In place on a signal block of `size` (a power of two, at most twiddles.size(); re and im
// 64-byte aligned): natural order to bit-reversed order.
void lane_fft_forward(const FftTwiddles& twiddles, int64_t size, float* re, float* im);

// In place: bit-reversed order to natural order, unscaled (size times the inverse transform).
void lane_fft_inverse(const FftTwiddles& twiddles, int64_t size, float* re, float* im);

// Columns [0, cols) (cols <= 2 kFftLanes) of `rows` rows (row stride ld) as complex pairs: lane l
// of sample t gets re = x[t][2l], im = x[t][2l + 1] (an odd last column pairs with 0); samples
// [rows, size) are zero.
void lane_fft_load_pairs(const float* x, int64_t ld, int64_t rows, int64_t cols, int64_t size,
                         float* re, float* im);

// The inverse of lane_fft_load_pairs for samples [0, rows), times `scale`: written into
// y (row stride ld), or added to it when `accumulate`.
void lane_fft_store_pairs(const float* re, const float* im, int64_t rows, int64_t cols, float scale,
                          bool accumulate, float* y, int64_t ld);

// Every lane of every sample k times the one complex value (w_re[k], w_im[k]), or times its
// conjugate.
void lane_fft_multiply(float* re, float* im, int64_t size, const float* w_re, const float* w_im,
                       bool conjugate);

// acc_re + i acc_im ([size][kFftLanes]) += (a_re + i a_im) * conj(b_re + i b_im), lane by lane.
void lane_fft_add_cross_spectrum(const float* a_re, const float* a_im, const float* b_re,
                                 const float* b_im, int64_t size, float* acc_re, float* acc_im);

}  // namespace recops

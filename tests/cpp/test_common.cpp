// The shared kernel interfaces (csrc/recops/common/) on the test backends: parallel loops, their
// helpers, the reference matrix products and the 16-bit float types.
#include <gtest/gtest.h>

#include <atomic>
#include <cfenv>
#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "recops/common/blas.h"
#include "recops/common/half_bits.h"
#include "recops/common/kernels/lane_fft.h"
#include "recops/common/kernels/small_gemm.h"
#include "recops/common/kinds.h"
#include "recops/common/parallel.h"
#include "recops/common/vec_math.h"
#include "test_util.h"

namespace recops {
namespace {

TEST(Parallel, ParallelForCoversTheRangeOnce) {
  for (const int64_t grain : {1, 7, 1000}) {
    std::vector<std::atomic<int>> hits(513);
    parallel_for(3, 516, grain, [&](int64_t begin, int64_t end) {
      EXPECT_TRUE(in_parallel_region());
      for (int64_t i = begin; i < end; ++i) hits[i - 3]++;
    });
    for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
  parallel_for(5, 5, 1, [&](int64_t, int64_t) { ADD_FAILURE() << "empty range ran"; });
  EXPECT_FALSE(in_parallel_region());
}

TEST(Parallel, NestedRegionRunsInline) {
  std::atomic<int> inner_calls{0};
  parallel_for(0, max_threads(), 1, [&](int64_t, int64_t) {
    parallel_for(0, 1000, 1, [&](int64_t begin, int64_t end) {
      EXPECT_EQ(begin, 0);
      EXPECT_EQ(end, 1000);
      inner_calls++;
    });
  });
  EXPECT_EQ(inner_calls.load(), max_threads());
}

TEST(Parallel, DynamicSlotsAreDistinctAndBelowMaxThreads) {
  std::vector<std::atomic<int>> slots(max_threads());
  std::vector<std::atomic<int>> items(100);
  parallel_for_dynamic(
      100,
      [&](int64_t slot) {
        EXPECT_LT(slot, max_threads());
        slots[slot]++;
        return slot;
      },
      [&](int64_t, int64_t item) { items[item]++; });
  for (const auto& s : slots) EXPECT_LE(s.load(), 1);
  for (const auto& i : items) EXPECT_EQ(i.load(), 1);
}

TEST(Parallel, PhasesSeeThePreviousPhaseComplete) {
  const int64_t n = 10000;
  std::vector<int> data(n, 0);
  std::atomic<bool> ok{true};
  parallel_phases<2>(n, 64, [&](int phase, int64_t begin, int64_t end) {
    if (phase == 0) {
      for (int64_t i = begin; i < end; ++i) data[i] = 1;
      return;
    }
    for (int64_t i = begin; i < end; ++i) {
      if (data[n - 1 - i] != 1) ok = false;
    }
  });
  EXPECT_TRUE(ok.load());
}

TEST(Parallel, ReduceAndChunks) {
  const int64_t sum = parallel_reduce(
      int64_t{0}, int64_t{100000}, int64_t{1000}, int64_t{0},
      [](int64_t begin, int64_t end, int64_t acc) {
        for (int64_t i = begin; i < end; ++i) acc += i;
        return acc;
      },
      [](int64_t a, int64_t b) { return a + b; });
  EXPECT_EQ(sum, int64_t{100000} * 99999 / 2);
  EXPECT_EQ(num_chunks(10, 100), 1);
  EXPECT_LE(num_chunks(1 << 20, 1), max_threads());
  std::vector<int64_t> bounds(5, -1);
  for_each_chunk(10, 4, [&](int64_t c, int64_t begin, int64_t end) {
    bounds[c] = begin;
    if (c == 3) bounds[4] = end;
  });
  EXPECT_EQ(bounds, (std::vector<int64_t>{0, 2, 5, 7, 10}));
}

TEST(Blas, ReferenceGemmHonoursLeadingDimensionsAndAccumulate) {
  // A [2, 3] in a row stride of 4, B [3, 2] in a row stride of 3, C [2, 2] in a row stride of 5.
  const float a[] = {1, 2, 3, -1, 4, 5, 6, -1};
  const float b[] = {1, 0, -1, 0, 1, -1, 2, 2, -1};
  float c[10] = {};
  gemm_nn(2, 2, 3, a, 4, b, 3, c, 5, false);
  EXPECT_EQ(c[0], 1 + 0 + 6);
  EXPECT_EQ(c[1], 0 + 2 + 6);
  EXPECT_EQ(c[5], 4 + 0 + 12);
  EXPECT_EQ(c[6], 0 + 5 + 12);
  gemm_nn(2, 2, 3, a, 4, b, 3, c, 5, true);
  EXPECT_EQ(c[6], 2 * (0 + 5 + 12));
  gemm_nn(2, 2, 0, a, 4, b, 3, c, 5, true);  // k == 0 accumulating leaves C
  EXPECT_EQ(c[6], 2 * (0 + 5 + 12));
  gemm_nn(2, 2, 0, a, 4, b, 3, c, 5, false);  // k == 0 overwriting zeroes C
  EXPECT_EQ(c[0], 0);
  EXPECT_EQ(c[6], 0);
}

TEST(Blas, Bf16GemmReadsBInVnniLayout) {
  constexpr int64_t kN = kBrgemmGranule;
  std::vector<Bf16> a(kN * kN), b_vnni(kN * kN);
  std::vector<float> a_f(kN * kN), b_f(kN * kN);
  for (int64_t i = 0; i < kN * kN; ++i) {
    a_f[i] = static_cast<float>(i % 7) - 3;
    a[i] = Bf16(a_f[i]);
  }
  for (int64_t k = 0; k < kN; ++k) {
    for (int64_t n = 0; n < kN; ++n) {
      b_f[k * kN + n] = static_cast<float>((k * 3 + n) % 5) - 2;
      b_vnni[((k / 2) * kN + n) * 2 + k % 2] = Bf16(b_f[k * kN + n]);
    }
  }
  std::vector<float> c(kN * kN), expected(kN * kN);
  ASSERT_TRUE(gemm_bf16_available());
  gemm_bf16(kN, kN, kN, a.data(), kN, b_vnni.data(), kN, c.data(), kN, false);
  gemm_nn(kN, kN, kN, a_f.data(), kN, b_f.data(), kN, expected.data(), kN, false);
  EXPECT_EQ(c, expected);  // small integers: exact either way
}

TEST(HalfBits, RoundToNearestEvenAndSpecialValues) {
  EXPECT_EQ(Fp16(1.0f).bits, 0x3C00);
  EXPECT_EQ(Fp16(65504.0f).bits, 0x7BFF);
  EXPECT_EQ(Fp16(65519.0f).bits, 0x7BFF);
  EXPECT_EQ(Fp16(65520.0f).bits, 0x7C00);  // halfway to the next step: even is infinity
  EXPECT_EQ(Fp16(-std::numeric_limits<float>::infinity()).bits, 0xFC00);
  EXPECT_EQ(Fp16(std::nanf("")).bits & 0x7FFF, 0x7E00);
  EXPECT_EQ(Fp16(0x1p-24f).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(Fp16(0x1p-25f).bits, 0x0000);  // half of it rounds to even 0
  EXPECT_EQ(Fp16(0x3p-25f).bits, 0x0002);  // 1.5 steps round to even 2
  EXPECT_EQ(static_cast<float>(Fp16(0.1f)), 0.0999755859375f);
  EXPECT_EQ(Bf16(1.0f).bits, 0x3F80);
  EXPECT_EQ(Bf16(std::nanf("")).bits, 0x7FC0);
  EXPECT_EQ(Bf16(1.00390625f).bits, 0x3F80);  // halfway: rounds to even
  EXPECT_EQ(static_cast<float>(Bf16(3.0f)), 3.0f);
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every finite fp16 survives a round trip
    Fp16 x;
    x.bits = static_cast<uint16_t>(h);
    if ((h & 0x7C00) != 0x7C00) {
      EXPECT_EQ(Fp16(static_cast<float>(x)).bits, h);
    }
  }
}

// silu over a row, the loop shape the kernels vectorise.
__attribute__((noinline)) void silu_row(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * fast_sigmoid(x[i]);
}

TEST(VecMath, ExpAndSigmoidMatchLibmAndNeverGoSubnormal) {
  std::vector<float> x;
  for (float v = -120.0f; v <= 120.0f; v += 0.037f) x.push_back(v);
  for (const float v : x) {
    const double e = std::exp(static_cast<double>(v));
    if (v < -87.0f) {
      EXPECT_EQ(fast_exp(v), 0.0f) << v;
    } else if (v > 88.0f) {
      EXPECT_EQ(fast_exp(v), std::numeric_limits<float>::infinity()) << v;
    } else {
      EXPECT_NEAR(fast_exp(v) / e, 1.0, 4e-7) << v;
    }
  }
  EXPECT_EQ(softmax_exp(-std::numeric_limits<float>::infinity()), 0.0f);
  // Values silu meets in training: no subnormal intermediate anywhere in the vectorised loop.
  // One would raise the underflow flag, and costs a microcode assist per vector on Intel cores.
  std::vector<float> z(1024), y(z.size());
  for (size_t i = 0; i < z.size(); ++i) z[i] = static_cast<float>(i % 97) * 0.11f - 5.0f;
  std::feclearexcept(FE_ALL_EXCEPT);
  silu_row(z.data(), y.data(), static_cast<int64_t>(z.size()));
  EXPECT_FALSE(std::fetestexcept(FE_UNDERFLOW));
  for (size_t i = 0; i < z.size(); ++i) {
    EXPECT_NEAR(y[i], z[i] / (1.0 + std::exp(-static_cast<double>(z[i]))), 1e-6) << z[i];
  }
}

TEST(Kinds, DispatchPicksTheKernelType) {
  EXPECT_EQ(dispatch_index_kind(IndexKind::kInt32,
                                [](auto tag) { return sizeof(typename decltype(tag)::type); }),
            4u);
  EXPECT_EQ(dispatch_index_kind(IndexKind::kInt64,
                                [](auto tag) { return sizeof(typename decltype(tag)::type); }),
            8u);
  const auto width = [](FloatKind kind) {
    return dispatch_float_kind(kind, [](auto tag) { return sizeof(typename decltype(tag)::type); });
  };
  EXPECT_EQ(width(FloatKind::kFloat), 4u);
  EXPECT_EQ(width(FloatKind::kDouble), 8u);
  EXPECT_EQ(width(FloatKind::kHalf), 2u);
  EXPECT_EQ(width(FloatKind::kBFloat16), 2u);
}

// small_gemm and small_gemm_tn (A stored transposed, [k, m]) against plain loops (in double) on
// the shapes tiles have: rows and columns that are and are not whole vectors or row blocks,
// leading dimensions past the columns, and B's rows a multiple of 256 apart (which the kernel
// may copy into a contiguous panel first), k = 0, accumulate.
TEST(SmallGemm, EqualsLoopsOnRaggedShapes) {
  if (!small_gemm_available()) GTEST_SKIP() << "small_gemm needs AVX-512";
  for (const auto& [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{64, 200, 50},
                                {1, 1, 1},
                                {7, 17, 3},
                                {6, 32, 64},
                                {13, 50, 83},
                                {5, 16, 0},
                                {37, 95, 200},
                                {50, 130, 16},
                                {50, 1000, 64},
                                {9, 40, 300}}) {
    for (const bool transposed : {false, true}) {
      for (const int64_t ldb : {n + 5, (n + 255) / 256 * 256}) {
        const int64_t lda = transposed ? m + 3 : k + 3, ldc = n + 2;
        const std::vector<float> a = test::random_floats((transposed ? k : m) * lda, 1),
                                 b = test::random_floats(k * ldb, 2);
        const std::vector<float> c0 = test::random_floats(m * ldc, 3);
        const auto a_at = [&](int64_t i, int64_t p) {
          return double(transposed ? a[p * lda + i] : a[i * lda + p]);
        };
        for (const bool accumulate : {false, true}) {
          std::vector<float> c = c0;
          (transposed ? small_gemm_tn : small_gemm)(m, n, k, a.data(), lda, b.data(), ldb, c.data(),
                                                    ldc, accumulate);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < ldc; ++j) {
              if (j >= n) {
                ASSERT_EQ(c[i * ldc + j], c0[i * ldc + j])
                    << "wrote past column n at " << i << "," << j;
                continue;
              }
              double want = accumulate ? c0[i * ldc + j] : 0.0;
              for (int64_t p = 0; p < k; ++p) want += a_at(i, p) * b[p * ldb + j];
              ASSERT_NEAR(c[i * ldc + j], want, 1e-5 * (k + 1))
                  << m << "x" << n << "x" << k << (transposed ? " (A^T)" : "") << " ldb " << ldb
                  << " at " << i << "," << j;
            }
          }
        }
      }
    }
  }
}

// unaliased_ld keeps leading dimensions whose rows spread over the cache's sets and moves those
// a multiple of 1 KB apart by one granule, staying a multiple of the granule.
TEST(Blas, UnaliasedLeadingDimensions) {
  EXPECT_EQ(unaliased_ld(200), 200);
  EXPECT_EQ(unaliased_ld(1000), 1000);
  EXPECT_EQ(unaliased_ld(256), 256 + kBrgemmGranule);
  EXPECT_EQ(unaliased_ld(1024), 1024 + kBrgemmGranule);
  EXPECT_FALSE(rows_share_cache_sets(unaliased_ld(4096)));
  EXPECT_EQ(unaliased_ld(4096) % kBrgemmGranule, 0);
}

// The lane FFT (common/kernels/lane_fft.h) on signal blocks of 64-byte aligned floats.
struct LaneSignals {
  std::vector<float> storage;
  float* re;
  float* im;
  explicit LaneSignals(int64_t size) : storage(2 * size * kFftLanes + 16) {
    float* base = storage.data();
    while (reinterpret_cast<uintptr_t>(base) % 64 != 0) ++base;
    re = base;
    im = base + size * kFftLanes;
  }
};

int64_t bit_reversed(int64_t i, int64_t size) {
  int64_t r = 0;
  for (int64_t bit = 1; bit < size; bit *= 2) r = r * 2 + ((i / bit) % 2);
  return r;
}

// The forward transform against the DFT sum (in double) in bit-reversed order, and the inverse
// back to size times the signal, for every size up to 512 (odd and even numbers of stages).
TEST(LaneFft, ForwardIsTheDftInBitReversedOrderAndInverseUndoesIt) {
  if (!lane_fft_available()) GTEST_SKIP() << "the lane FFT needs AVX-512";
  const FftTwiddles twiddles(512);
  const double pi = std::acos(-1.0);
  for (int64_t size = 1; size <= 512; size *= 2) {
    LaneSignals x(size);
    const std::vector<float> re = test::random_floats(size * kFftLanes, 5),
                             im = test::random_floats(size * kFftLanes, 6);
    std::copy(re.begin(), re.end(), x.re);
    std::copy(im.begin(), im.end(), x.im);
    lane_fft_forward(twiddles, size, x.re, x.im);
    for (int64_t f = 0; f < size; ++f) {
      for (int64_t l = 0; l < kFftLanes; ++l) {
        double want_re = 0, want_im = 0;
        for (int64_t t = 0; t < size; ++t) {
          const double angle = -2 * pi * double(f * t % size) / double(size);
          const double a = re[t * kFftLanes + l], b = im[t * kFftLanes + l];
          want_re += a * std::cos(angle) - b * std::sin(angle);
          want_im += a * std::sin(angle) + b * std::cos(angle);
        }
        const int64_t at = bit_reversed(f, size) * kFftLanes + l;
        ASSERT_NEAR(x.re[at], want_re, 1e-5 * size) << "size " << size << " frequency " << f;
        ASSERT_NEAR(x.im[at], want_im, 1e-5 * size) << "size " << size << " frequency " << f;
      }
    }
    lane_fft_inverse(twiddles, size, x.re, x.im);
    for (int64_t i = 0; i < size * kFftLanes; ++i) {
      ASSERT_NEAR(x.re[i] / size, re[i], 1e-5) << "size " << size;
      ASSERT_NEAR(x.im[i] / size, im[i], 1e-5) << "size " << size;
    }
  }
}

// A causal convolution of column pairs by one real kernel (load_pairs, forward, multiply,
// inverse, store_pairs), its correlation (the conjugate spectrum, added into what is there), and
// the kernel-gradient correlation of the summed cross spectra, against direct sums in double:
// widths of one to 32 columns (odd ones pair their last column with zero), rows up to size / 2.
TEST(LaneFft, ConvolutionsOfColumnPairsEqualDirectSums) {
  if (!lane_fft_available()) GTEST_SKIP() << "the lane FFT needs AVX-512";
  const FftTwiddles twiddles(1024);
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{1, 1}, {7, 17}, {64, 32}, {300, 7}, {512, 16}, {129, 32}}) {
    int64_t size = 2;  // position_fft.h's: >= 2 rows - 1, and rows <= size / 2 (the taps)
    while (size < 2 * rows) size *= 2;
    const int64_t ld = cols + 3;
    const std::vector<float> w = test::random_floats(size / 2, 7),
                             x = test::random_floats(rows * ld, 8),
                             g = test::random_floats(rows * ld, 9);
    LaneSignals kernel(size), signal(size), grad(size), cross(size);
    std::fill_n(kernel.re, 2 * size * kFftLanes, 0.0f);
    std::fill_n(cross.re, 2 * size * kFftLanes, 0.0f);
    for (int64_t d = 0; d < size / 2; ++d) kernel.re[d * kFftLanes] = w[d];
    lane_fft_forward(twiddles, size, kernel.re, kernel.im);
    std::vector<float> w_re(size), w_im(size);
    for (int64_t t = 0; t < size; ++t) {
      w_re[t] = kernel.re[t * kFftLanes];
      w_im[t] = kernel.im[t * kFftLanes];
    }
    lane_fft_load_pairs(x.data(), ld, rows, cols, size, signal.re, signal.im);
    lane_fft_forward(twiddles, size, signal.re, signal.im);
    lane_fft_load_pairs(g.data(), ld, rows, cols, size, grad.re, grad.im);
    lane_fft_forward(twiddles, size, grad.re, grad.im);
    lane_fft_add_cross_spectrum(grad.re, grad.im, signal.re, signal.im, size, cross.re, cross.im);
    lane_fft_multiply(signal.re, signal.im, size, w_re.data(), w_im.data(), false);
    lane_fft_inverse(twiddles, size, signal.re, signal.im);
    lane_fft_multiply(grad.re, grad.im, size, w_re.data(), w_im.data(), true);
    lane_fft_inverse(twiddles, size, grad.re, grad.im);
    lane_fft_inverse(twiddles, size, cross.re, cross.im);
    std::vector<float> y(rows * ld, -7.0f), dx = test::random_floats(rows * ld, 10);
    const std::vector<float> dx0 = dx;
    lane_fft_store_pairs(signal.re, signal.im, rows, cols, 1.0f / size, false, y.data(), ld);
    lane_fft_store_pairs(grad.re, grad.im, rows, cols, 1.0f / size, true, dx.data(), ld);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t c = 0; c < ld; ++c) {
        if (c >= cols) {
          ASSERT_EQ(y[i * ld + c], -7.0f) << "wrote past the columns";
          ASSERT_EQ(dx[i * ld + c], dx0[i * ld + c]) << "wrote past the columns";
          continue;
        }
        double conv = 0, corr = dx0[i * ld + c];
        for (int64_t d = 0; d <= i; ++d) conv += double(w[d]) * x[(i - d) * ld + c];
        for (int64_t d = 0; i + d < rows; ++d) corr += double(w[d]) * g[(i + d) * ld + c];
        ASSERT_NEAR(y[i * ld + c], conv, 1e-5 * rows) << rows << "x" << cols << " at " << i;
        ASSERT_NEAR(dx[i * ld + c], corr, 1e-5 * rows) << rows << "x" << cols << " at " << i;
      }
    }
    for (int64_t d = 0; d < rows; ++d) {
      double want = 0, got = 0;
      for (int64_t i = d; i < rows; ++i) {
        for (int64_t c = 0; c < cols; ++c) want += double(g[i * ld + c]) * x[(i - d) * ld + c];
      }
      for (int64_t l = 0; l < kFftLanes; ++l) got += cross.re[d * kFftLanes + l];
      ASSERT_NEAR(got / size, want, 1e-5 * rows * cols) << rows << "x" << cols << " lag " << d;
    }
  }
}

}  // namespace
}  // namespace recops

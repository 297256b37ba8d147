// The forward's per-score pass of the bf16 HSTU-family kernels for CPUs with AVX512_BF16
// (tile_variants.h's native_bf16 table): SiLU of fp32 scores rounded to bf16 by the CPU's own
// conversion, in AVX-512 intrinsics. It runs once per score of every forward, beside two bf16
// tile products of 2 * D FLOPs each, so its cost sets the forward's speed on CPUs whose bf16
// products are fast (AMX):
//  * exp(-x) = 2^n exp(r) with n = round(-x / ln2), a degree-5 polynomial for exp(r) on
//    |r| <= ln2 / 2 (relative error 2.4e-6, well under bf16's 2^-9) and vscalefps for 2^n;
//  * scale * x * sigmoid(x) = (scale * x) / (1 + exp(-x)) with the reciprocal by vrcp14ps
//    (relative error 2^-14: a thirtieth of the bf16 rounding that follows; a Newton step would
//    also turn infinite scores into NaN);
//  * vcvtne2ps2bf16 rounds 32 scores to bf16 (nearest even, NaN kept) in one instruction.
// x is clamped to [-80, 80] for the exponential only: above 80 the sigmoid is 1 to float
// precision (+inf stays inf), and below -80 the result is set to zero (the SiLU is under 1e-33).
// vcvtne2ps2bf16 rounds results below the float range's normals to zero.
#include "recops/attention/kernels/tile_variants.h"

#if RECOPS_X86_VARIANTS
#include <immintrin.h>

// GCC 12's AVX-512 intrinsics start their results from _mm512_undefined_ps(), which it then
// reports as maybe uninitialised wherever they are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

RECOPS_TARGET_AVX512_BF16_BEGIN
namespace recops::attention::kernels::native_bf16 {
namespace {

// scale * x * sigmoid(x) of 16 scores.
inline __m512 scaled_silu(__m512 x, __m512 scale) {
  const __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-80.0f)), _mm512_set1_ps(80.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(-1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmsub_ps(n, _mm512_set1_ps(0.693147180559945309f), xc);  // -x - n ln2
  __m512 p = _mm512_set1_ps(1.0f / 120.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512 d = _mm512_add_ps(_mm512_scalef_ps(p, n), _mm512_set1_ps(1.0f));
  const __m512 xs = _mm512_mul_ps(x, scale);
  // Below -80 the SiLU is under 1e-33: zero (NaN kept: the comparison is true when unordered).
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-80.0f), _CMP_NLT_UQ);
  return _mm512_maskz_mul_ps(live, xs, _mm512_rcp14_ps(d));
}

}  // namespace

void silu_scores_to_bf16(const float* s, const float* bias, const float* mask, int64_t n,
                         float alpha, float scale, uint16_t* out) {
  const __m512 a = _mm512_set1_ps(alpha), sc = _mm512_set1_ps(scale);
  with_optional_operands(bias, mask, [&](auto has_bias, auto has_mask) {
    // The 16 results from position j (lanes past `valid` read as zero).
    const auto silu_at = [&](int64_t j, __mmask16 valid) {
      const __m512 sv = _mm512_maskz_loadu_ps(valid, s + j);
      __m512 x;
      if constexpr (has_bias) {
        x = _mm512_fmadd_ps(sv, a, _mm512_maskz_loadu_ps(valid, bias + j));
      } else {
        x = _mm512_mul_ps(sv, a);
      }
      const __m512 y = scaled_silu(x, sc);
      if constexpr (has_mask) return _mm512_mul_ps(y, _mm512_maskz_loadu_ps(valid, mask + j));
      return y;
    };
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
      const __m512bh bits = _mm512_cvtne2ps_pbh(silu_at(j + 16, 0xffff), silu_at(j, 0xffff));
      _mm512_storeu_si512(out + j, reinterpret_cast<__m512i>(bits));
    }
    for (; j < n; j += 16) {
      const __mmask16 valid = n - j >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - j)) - 1u);
      const __m256bh bits = _mm512_cvtneps_pbh(silu_at(j, valid));
      _mm256_mask_storeu_epi16(out + j, valid, reinterpret_cast<__m256i>(bits));
    }
  });
}

}  // namespace recops::attention::kernels::native_bf16
RECOPS_TARGET_END
#endif

// Kernels on the CPU's own bf16 instructions (native_bf16.h).
//
// The SiLU of a score, shared by both kernels, costs about 17 AVX-512 instructions per 16 scores
// and sits beside two bf16 products of 2 * D FLOPs per score, so it sets the forward's speed on
// CPUs whose bf16 products are fast (AMX):
//  * exp(-x) = 2^n exp(r) with n = round(-x / ln2), a degree-5 polynomial for exp(r) on
//    |r| <= ln2 / 2 (relative error 2.4e-6, well under bf16's 2^-9) and vscalefps for 2^n;
//  * scale * x * sigmoid(x) = (scale * x) / (1 + exp(-x)) with the reciprocal by vrcp14ps
//    (relative error 2^-14: a thirtieth of the bf16 rounding that follows; a Newton step would
//    also turn infinite scores into NaN);
//  * vcvtne2ps2bf16 rounds 32 results to bf16 (nearest even, NaN kept) in one instruction, and
//    rounds results below the float range's normals to zero.
// x is clamped to [-80, 80] for the exponential only: above 80 the sigmoid is 1 to float
// precision (+inf stays inf), and below -80 the result is set to zero (the SiLU is under 1e-33).
#include "recops/attention/kernels/native_bf16.h"

#include "recops/attention/kernels/tile_variants.h"

#if RECOPS_X86_VARIANTS
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

// GCC 12's AVX-512 intrinsics start their results from _mm512_undefined_ps(), which it then
// reports as maybe uninitialised wherever they are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

RECOPS_TARGET_AVX512_BF16_AMX_BEGIN
namespace recops::attention::kernels::native_bf16 {
namespace {

// scale * x * sigmoid(x) of 16 scores, lanes outside `keep` zero.
inline __m512 scaled_silu(__m512 x, __m512 scale, __mmask16 keep) {
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
  const __mmask16 live = _mm512_mask_cmp_ps_mask(keep, x, _mm512_set1_ps(-80.0f), _CMP_NLT_UQ);
  return _mm512_maskz_mul_ps(live, xs, _mm512_rcp14_ps(d));
}

// The 16 results from position j of s (lanes outside `valid` are zero).
template <bool kBias, bool kMask>
inline __m512 silu_at(const float* s, const float* bias, const float* mask, int64_t j,
                      __mmask16 valid, __m512 alpha, __m512 scale) {
  const __m512 sv = _mm512_maskz_loadu_ps(valid, s + j);
  __m512 x;
  if constexpr (kBias) {
    x = _mm512_fmadd_ps(sv, alpha, _mm512_maskz_loadu_ps(valid, bias + j));
  } else {
    x = _mm512_mul_ps(sv, alpha);
  }
  const __m512 y = scaled_silu(x, scale, valid);
  if constexpr (kMask) return _mm512_mul_ps(y, _mm512_maskz_loadu_ps(valid, mask + j));
  return y;
}

}  // namespace

void silu_scores_to_bf16(const float* s, const float* bias, const float* mask, int64_t n,
                         float alpha, float scale, uint16_t* out) {
  const __m512 a = _mm512_set1_ps(alpha), sc = _mm512_set1_ps(scale);
  with_optional_operands(bias, mask, [&](auto has_bias, auto has_mask) {
    const auto at = [&](int64_t j, __mmask16 valid) {
      return silu_at<has_bias, has_mask>(s, bias, mask, j, valid, a, sc);
    };
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
      const __m512bh bits = _mm512_cvtne2ps_pbh(at(j + 16, 0xffff), at(j, 0xffff));
      _mm512_storeu_si512(out + j, reinterpret_cast<__m512i>(bits));
    }
    for (; j < n; j += 16) {
      const __mmask16 valid = n - j >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - j)) - 1u);
      const __m256bh bits = _mm512_cvtneps_pbh(at(j, valid));
      _mm256_mask_storeu_epi16(out + j, valid, reinterpret_cast<__m256i>(bits));
    }
  });
}

bool amx_tiles_available() {
  static const bool available = [] {
    if (supported_cpu_isa() < CpuIsa::kAmx) return false;
    constexpr long kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
    constexpr long kTileData = 18;               // XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return available;
}

namespace {

// Tiles: 0, 1 the scores of 32 keys; 2 the A operand (Q, then P); 3 the B operand (K^T, then V);
// 4 + t the output columns [16 t, 16 t + 16). Every tile is 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// O tile 4 + t += P V's columns [16 t, 16 t + 16), for the dv / 16 tiles there are.
template <int kTiles>
inline void accumulate_output(const uint16_t* v, int64_t row_bytes) {
  _tile_loadd(3, v, row_bytes);
  _tile_dpbf16ps(4, 2, 3);
  if constexpr (kTiles > 1) {
    _tile_loadd(3, v + 32, row_bytes);
    _tile_dpbf16ps(5, 2, 3);
  }
  if constexpr (kTiles > 2) {
    _tile_loadd(3, v + 64, row_bytes);
    _tile_dpbf16ps(6, 2, 3);
  }
  if constexpr (kTiles > 3) {
    _tile_loadd(3, v + 96, row_bytes);
    _tile_dpbf16ps(7, 2, 3);
  }
}

template <int kTiles>
inline void store_output(float* o, int64_t row_bytes) {
  _tile_stored(4, o, row_bytes);
  if constexpr (kTiles > 1) _tile_stored(5, o + 16, row_bytes);
  if constexpr (kTiles > 2) _tile_stored(6, o + 32, row_bytes);
  if constexpr (kTiles > 3) _tile_stored(7, o + 48, row_bytes);
}

template <int kTiles, bool kBias, bool kMask>
void fused_tile(const SiluAttentionTile& t) {
  const TileConfig config;
  _tile_loadconfig(&config);
  _tile_zero(4);
  if constexpr (kTiles > 1) _tile_zero(5);
  if constexpr (kTiles > 2) _tile_zero(6);
  if constexpr (kTiles > 3) _tile_zero(7);
  alignas(64) float s[16][32];
  alignas(64) uint16_t p[16][32];
  const __m512 alpha = _mm512_set1_ps(t.alpha), scale = _mm512_set1_ps(t.scale);
  const int64_t chunks = t.keys / kFusedGranule;
  // The first chunk from c that some row sees (chunks when none).
  const auto next_seen = [&](int64_t c) {
    for (; c < chunks; ++c) {
      uint32_t seen = 0;
      for (int r = 0; r < 16; ++r) seen |= t.visible[r * chunks + c];
      if (seen != 0) break;
    }
    return c;
  };
  // Issues S of chunk c into tiles 0 and 1: the tile unit computes it while the core goes on.
  const auto issue_scores = [&](int64_t c) {
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t d = 0; d < t.dqk; d += 32) {  // 32 head dims = 16 pair rows of K^T per step
      _tile_loadd(2, t.q + d, t.dqk * 2);
      const uint16_t* k = t.k_t + c * t.k_t_step + (d / 2) * t.ld_k_t * 2;
      _tile_loadd(3, k, t.ld_k_t * 4);
      _tile_dpbf16ps(0, 2, 3);
      _tile_loadd(3, k + 32, t.ld_k_t * 4);
      _tile_dpbf16ps(1, 2, 3);
    }
  };
  // Software pipelined: the next chunk's scores are issued before this chunk's SiLU.
  int64_t c = next_seen(0);
  if (c < chunks) issue_scores(c);
  while (c < chunks) {
    const int64_t key = c * kFusedGranule;
    _tile_stored(0, &s[0][0], sizeof(s[0]));
    _tile_stored(1, &s[0][16], sizeof(s[0]));
    const int64_t next = next_seen(c + 1);
    if (next < chunks) issue_scores(next);
    for (int r = 0; r < 16; ++r) {
      const uint32_t bits = t.visible[r * chunks + c];
      const float* bias = kBias ? t.bias + r * t.ld + key : nullptr;
      const float* mask = kMask ? t.mask + r * t.ld + key : nullptr;
      const __m512 lo = silu_at<kBias, kMask>(s[r], bias, mask, 0, bits & 0xffffu, alpha, scale);
      const __m512 hi = silu_at<kBias, kMask>(s[r], bias, mask, 16, bits >> 16, alpha, scale);
      _mm512_store_si512(p[r], reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
    }
    _tile_loadd(2, &p[0][0], sizeof(p[0]));
    accumulate_output<kTiles>(t.v + (key / 2) * t.dv * 2, t.dv * 4);
    c = next;
  }
  store_output<kTiles>(t.o, t.dv * 4);
}

template <bool kBias, bool kMask>
void fused_tile_for(const SiluAttentionTile& t) {
  switch (t.dv / 16) {
    case 1:
      return fused_tile<1, kBias, kMask>(t);
    case 2:
      return fused_tile<2, kBias, kMask>(t);
    case 3:
      return fused_tile<3, kBias, kMask>(t);
    default:
      return fused_tile<4, kBias, kMask>(t);
  }
}

}  // namespace

void silu_attention_tile(const SiluAttentionTile& tile) {
  with_optional_operands(tile.bias, tile.mask, [&](auto has_bias, auto has_mask) {
    fused_tile_for<has_bias, has_mask>(tile);
  });
}

}  // namespace recops::attention::kernels::native_bf16
RECOPS_TARGET_END
#endif

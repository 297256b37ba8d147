// Kernels on the CPU's own bf16 instructions (native_bf16.cpp), compiled for AVX512_BF16 and AMX:
// call them only where the CPU has what each one names.
#pragma once

#include <cstdint>

namespace recops::attention::kernels::native_bf16 {

// AVX512_BF16: the SiLU pass of TileKernels::silu_scores_to_bf16 (tile_variants.h).
void silu_scores_to_bf16(const float* s, const float* bias, const float* mask, int64_t n,
                         float alpha, float scale, uint16_t* out);

// Whether AMX-BF16 tiles can run here: the CPU has them (CpuIsa::kAmx) and the OS granted this
// process their register state (Linux asks each process to request it once).
bool amx_tiles_available();

// The key granule of the fused tile below: keys (and the key offset) in multiples of 32, head
// dims of Q and K in multiples of 32, of V at most kMaxFusedDv.
constexpr int64_t kFusedGranule = 32;
constexpr int64_t kMaxFusedDv = 64;

// One 16-row query tile of HSTU-family attention, fused on AMX tiles: for each chunk of 32 keys,
// S = Q K^T in two tile products, then SiLU(alpha S + bias) * scale * mask in AVX-512 registers
// rounded to bf16, then O += P V, so scores never leave the L1 cache. Chunks whose visibility
// bits are all clear for the 16 rows are skipped.
struct SiluAttentionTile {
  const uint16_t* q;  // [16, dqk] bf16, row stride dqk
  // K^T in VNNI layout from the first key, in blocks of 32 keys: pair p, key j of block c at
  // c * k_t_step + (p * ld_k_t + j) * 2 (one [Dqk, N] layout: ld_k_t = N, k_t_step = 64).
  const uint16_t* k_t;
  int64_t ld_k_t, k_t_step;
  // V in VNNI layout from the first key: key pair i, column d at (i * dv + d) * 2.
  const uint16_t* v;
  int64_t dqk, dv, keys;  // dqk, keys multiples of kFusedGranule; dv of 16, at most kMaxFusedDv
  // Bit j % 32 of visible[r * (keys / 32) + j / 32]: row r sees key j (other keys give zero).
  const uint32_t* visible;
  const float* bias;  // [16, ld] fp32 added to alpha * S, or null
  const float* mask;  // [16, ld] fp32 multipliers, or null
  int64_t ld;         // of bias and mask
  float alpha, scale;
  float* o;  // [16, dv] fp32 out, row stride dv
};
// Loads its own tile configuration: a caller that also runs the brgemm (blas.h's gemm_bf16)
// calls gemm_bf16_release() after it, so that the brgemm configures the tiles again.
void silu_attention_tile(const SiluAttentionTile& tile);

}  // namespace recops::attention::kernels::native_bf16

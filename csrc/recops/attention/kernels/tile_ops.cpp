#include "recops/attention/kernels/tile_ops.h"

#include "recops/common/isa.h"

namespace recops::attention::kernels {

RECOPS_ISA_CLONES void silu_scores(float* s, const float* bias, const float* mask, int64_t n,
                                   float alpha, float scale) {
  silu_scores_generic(s, bias, mask, n, alpha, scale);
}

RECOPS_ISA_CLONES void silu_score_grads(float* s, float* dp, const float* bias, const float* mask,
                                        int64_t n, float alpha, float scale) {
  silu_score_grads_generic(s, dp, bias, mask, n, alpha, scale);
}

RECOPS_ISA_CLONES void to_bf16(const float* src, uint16_t* dst, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits(scale * src[i]);
}

RECOPS_ISA_CLONES void to_bf16_vnni(const float* src, int64_t rows, int64_t cols, uint16_t* dst,
                                    float scale) {
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

}  // namespace recops::attention::kernels

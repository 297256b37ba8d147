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

RECOPS_ISA_CLONES void silu_scores_to_bf16(const float* s, const float* bias, const float* mask,
                                           int64_t n, float alpha, float scale, uint16_t* out) {
  // Two loops, as silu_score_grads_generic (no masked loads from a null bias).
  if (bias == nullptr) {
    for (int64_t j = 0; j < n; ++j) {
      const float x = alpha * s[j];
      out[j] = bf16_bits(x * fast_sigmoid(x) * scale * mask[j]);
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      const float x = alpha * s[j] + bias[j];
      out[j] = bf16_bits(x * fast_sigmoid(x) * scale * mask[j]);
    }
  }
}

RECOPS_ISA_CLONES void backward_operands_to_bf16(const float* a, const float* ds, int64_t rows,
                                                 int64_t cols, float alpha, uint16_t* a_vnni,
                                                 uint16_t* ds_rows, uint16_t* ds_vnni) {
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

}  // namespace recops::attention::kernels

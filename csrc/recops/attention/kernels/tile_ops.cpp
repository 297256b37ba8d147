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

}  // namespace recops::attention::kernels

#include "recops/attention/kernels/softmax_tile_ops.h"

#include "recops/common/isa.h"

namespace recops::attention::kernels {

RECOPS_ISA_CLONES float disentangled_score_row(float* s, int64_t n, float scale,
                                               const int32_t* delta, const float* c2p,
                                               const float* p2c, int32_t p2c_ld,
                                               const uint8_t* keep) {
  return disentangled_score_row_generic(s, n, scale, delta, c2p, p2c, p2c_ld, keep);
}

RECOPS_ISA_CLONES float exp_row(float* s, int64_t n, float m) {
  return exp_row_generic(s, n, m);
}

RECOPS_ISA_CLONES void dropout_row(float* p, int64_t n, const RowDropout<float>& dropout,
                                   int64_t j0) {
  dropout_row_generic(p, n, dropout, j0);
}

RECOPS_ISA_CLONES void softmax_grad_row(float* s, float* dp, int64_t n, float lse, float d,
                                        float scale, const RowDropout<float>* dropout, int64_t j0) {
  softmax_grad_row_generic(s, dp, n, lse, d, scale, dropout, j0);
}

RECOPS_ISA_CLONES void scatter_position_grads(const float* ds, int64_t n, const int32_t* delta,
                                              float* dc2p, float* dp2c, int32_t p2c_ld) {
  scatter_position_grads_generic(ds, n, delta, dc2p, dp2c, p2c_ld);
}

}  // namespace recops::attention::kernels

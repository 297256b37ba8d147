#include "recops/attention/kernels/softmax_tile_ops.h"

#include "recops/common/isa.h"

namespace recops::attention::kernels {

RECOPS_ISA_CLONES float scale_mask_row(float* s, int64_t n, float scale, const uint8_t* keep) {
  return scale_mask_row_generic(s, n, scale, keep);
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

RECOPS_ISA_CLONES void expand_position_terms(float* diag, int64_t rows, int64_t diagonals,
                                             int64_t lanes, const int32_t* delta,
                                             const float* c2p_t, const float* p2c_t, int64_t p2c_ld,
                                             int64_t first) {
  expand_position_terms_generic(diag, rows, diagonals, lanes, delta, c2p_t, p2c_t, p2c_ld, first);
}

RECOPS_ISA_CLONES void unshear_add(const float* diag, int64_t rows, int64_t n, int64_t lanes,
                                   float* tile) {
  unshear_add_generic(diag, rows, n, lanes, tile);
}

RECOPS_ISA_CLONES void shear_tile(const float* tile, int64_t rows, int64_t n, float* diag,
                                  int64_t lanes) {
  shear_tile_generic(tile, rows, n, diag, lanes);
}

RECOPS_ISA_CLONES void accumulate_position_grads(const float* diag, int64_t rows, int64_t diagonals,
                                                 int64_t lanes, const int32_t* delta, float* dc2p_t,
                                                 float* dp2c_t, int64_t p2c_ld, int64_t first) {
  accumulate_position_grads_generic(diag, rows, diagonals, lanes, delta, dc2p_t, dp2c_t, p2c_ld,
                                    first);
}

}  // namespace recops::attention::kernels

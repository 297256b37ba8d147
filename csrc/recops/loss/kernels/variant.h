// One instruction-set variant of the loss kernels, instantiated for every element type into
// loss_kernels.h's tables. Included once by each variant_<isa>.cpp after it selected the
// instruction set and defined RECOPS_ISA_NS and RECOPS_ISA_LEVEL (0 baseline, 1 AVX2, 2 AVX-512).
#pragma once

#ifndef RECOPS_ISA_NS
#error "compiled once per instruction set: include from a variant_<isa>.cpp"
#endif

#include "recops/loss/kernels/sampled_softmax.h"

namespace recops::loss::kernels::RECOPS_ISA_NS {

template <typename T>
constexpr LossKernels<T> make_loss_kernels() {
  return {&sampled_softmax<T>};
}

const FloatTables<LossKernels> kLossKernels = {
    make_loss_kernels<float>(), make_loss_kernels<Bf16>(), make_loss_kernels<Fp16>()};

#if RECOPS_ISA_LEVEL == 0
const LossKernels<double> kDoubleLossKernels = make_loss_kernels<double>();
#endif

}  // namespace recops::loss::kernels::RECOPS_ISA_NS

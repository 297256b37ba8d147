// One instruction-set variant of the layer kernels: their templates instantiated for every element
// type into layer_kernels.h's tables. Included once by each variant_<isa>.cpp after it selected
// the instruction set and defined RECOPS_ISA_NS (the variant's namespace) and RECOPS_ISA_LEVEL
// (0 baseline, 1 AVX2, 2 AVX-512).
#pragma once

#ifndef RECOPS_ISA_NS
#error "compiled once per instruction set: include from a variant_<isa>.cpp"
#endif

#include "recops/layer/kernels/counter_dropout.h"
#include "recops/layer/kernels/layer_ffn.h"
#include "recops/layer/kernels/layer_input.h"
#include "recops/layer/kernels/layer_output.h"
#include "recops/layer/kernels/normalize.h"
#include "recops/layer/kernels/positional_features.h"

namespace recops::layer::kernels::RECOPS_ISA_NS {

template <typename T>
constexpr LayerKernels<T> make_layer_kernels() {
  return {&counter_dropout<T>,      &layer_input_forward<T>,   &layer_input_backward<T>,
          &layer_output_forward<T>, &layer_output_backward<T>, &layer_ffn_forward<T>,
          &layer_ffn_backward<T>,   &normalize_forward<T>,     &normalize_backward<T>,
          &features_forward<T>,     &features_backward<T>};
}

const FloatTables<LayerKernels> kLayerKernels = {
    make_layer_kernels<float>(), make_layer_kernels<Bf16>(), make_layer_kernels<Fp16>()};

#if RECOPS_ISA_LEVEL == 0
const LayerKernels<double> kDoubleLayerKernels = make_layer_kernels<double>();
#endif

}  // namespace recops::layer::kernels::RECOPS_ISA_NS

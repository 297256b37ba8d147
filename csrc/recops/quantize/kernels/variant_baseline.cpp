// Baseline (portable) build of the row-wise quantization kernels; used when the CPU lacks AVX2.
#include "recops/quantize/kernels/rowwise.h"

#define RECOPS_ISA_NS baseline
#include "recops/quantize/kernels/rowwise_variant.h"

// AVX2 + FMA + F16C build of the row-wise quantization kernels (see common/cpu_isa.h).
#include "recops/quantize/kernels/rowwise.h"

#if RECOPS_X86_VARIANTS
RECOPS_TARGET_AVX2_BEGIN
#define RECOPS_ISA_NS avx2
#include "recops/quantize/kernels/rowwise_variant.h"
RECOPS_TARGET_END
#endif

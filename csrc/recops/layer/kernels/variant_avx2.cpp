// AVX2 build of the layer kernels (see common/cpu_isa.h).
#include "recops/layer/kernels/layer_kernels.h"

#if RECOPS_X86_VARIANTS
RECOPS_TARGET_AVX2_BEGIN
#define RECOPS_ISA_NS avx2
#define RECOPS_ISA_LEVEL 1
#include "recops/layer/kernels/variant.h"
RECOPS_TARGET_END
#endif

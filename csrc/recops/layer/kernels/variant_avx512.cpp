// AVX-512 build of the layer kernels (see common/cpu_isa.h).
#include "recops/layer/kernels/layer_kernels.h"

#if RECOPS_X86_VARIANTS
RECOPS_TARGET_AVX512_BEGIN
#define RECOPS_ISA_NS avx512
#define RECOPS_ISA_LEVEL 2
#include "recops/layer/kernels/variant.h"
RECOPS_TARGET_END
#endif

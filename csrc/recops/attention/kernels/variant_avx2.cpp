// AVX2 + FMA + F16C build of the attention tiles' passes (see common/cpu_isa.h).
#include "recops/attention/kernels/tile_variants.h"

#if RECOPS_X86_VARIANTS
RECOPS_TARGET_AVX2_BEGIN
#define RECOPS_ISA_NS avx2
#define RECOPS_ISA_LEVEL 1
#include "recops/attention/kernels/variant.h"
RECOPS_TARGET_END
#endif

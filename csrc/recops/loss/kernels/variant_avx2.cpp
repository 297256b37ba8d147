// AVX2 build of the loss kernels (see common/cpu_isa.h).
#include "recops/loss/kernels/loss_kernels.h"

#if RECOPS_X86_VARIANTS
RECOPS_TARGET_AVX2_BEGIN
#define RECOPS_ISA_NS avx2
#define RECOPS_ISA_LEVEL 1
#include "recops/loss/kernels/variant.h"
RECOPS_TARGET_END
#endif

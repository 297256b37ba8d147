// AVX-512 build of the loss kernels (see common/cpu_isa.h).
#include "recops/loss/kernels/loss_kernels.h"

#if RECOPS_X86_VARIANTS
RECOPS_TARGET_AVX512_BEGIN
#define RECOPS_ISA_NS avx512
#define RECOPS_ISA_LEVEL 2
#include "recops/loss/kernels/variant.h"
RECOPS_TARGET_END
#endif

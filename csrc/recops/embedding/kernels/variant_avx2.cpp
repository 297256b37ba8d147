// AVX2 + FMA + F16C build of the TBE kernels (see common/cpu_isa.h).
#include "recops/embedding/kernels/tbe.h"

#if RECOPS_X86_VARIANTS
RECOPS_TARGET_AVX2_BEGIN
#define RECOPS_ISA_NS avx2
#define RECOPS_ISA_LEVEL 1
#include "recops/embedding/kernels/variant.h"
RECOPS_TARGET_END
#endif

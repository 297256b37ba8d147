// Baseline (portable) build of the layer kernels; used when no wider variant runs on the CPU.
#include "recops/layer/kernels/layer_kernels.h"

#define RECOPS_ISA_NS baseline
#define RECOPS_ISA_LEVEL 0
#include "recops/layer/kernels/variant.h"

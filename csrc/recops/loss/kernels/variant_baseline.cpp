// Baseline (portable) build of the loss kernels; used when no wider variant runs on the CPU.
#include "recops/loss/kernels/loss_kernels.h"

#define RECOPS_ISA_NS baseline
#define RECOPS_ISA_LEVEL 0
#include "recops/loss/kernels/variant.h"

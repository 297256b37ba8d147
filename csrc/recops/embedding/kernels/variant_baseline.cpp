// Baseline (portable) build of the TBE kernels; used when no wider variant runs on the CPU.
#include "recops/embedding/kernels/tbe.h"

#define RECOPS_ISA_NS baseline
#define RECOPS_ISA_LEVEL 0
#include "recops/embedding/kernels/variant.h"

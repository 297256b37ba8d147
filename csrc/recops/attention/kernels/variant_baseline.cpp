// Baseline (portable) build of the attention tiles' passes; used when no wider variant runs on the
// CPU, and for float64.
#include "recops/attention/kernels/tile_variants.h"

#define RECOPS_ISA_NS baseline
#define RECOPS_ISA_LEVEL 0
#include "recops/attention/kernels/variant.h"

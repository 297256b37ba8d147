// One instruction-set variant of the TBE kernels: the type-erased entry points of tbe.h, which
// pick the element, index and optimizer types (the optimizer's Step<> policy through
// kOptimizerTable's dispatch_optimizer) and call the templates. Included once by each
// variant_<isa>.cpp after it selected the instruction set and defined RECOPS_ISA_NS (the
// variant's namespace) and RECOPS_ISA_LEVEL (0 baseline, 1 AVX2, 2 AVX-512).
#pragma once

#ifndef RECOPS_ISA_NS
#error "compiled once per instruction set: include from a variant_<isa>.cpp"
#endif

#include "recops/embedding/kernels/lookup.h"
#include "recops/embedding/kernels/quantized_lookup.h"
#include "recops/embedding/kernels/update.h"

namespace recops::embedding::kernels::RECOPS_ISA_NS {

inline int64_t forward_entry(const ForwardArgs& args) {
  if (args.int8_weights) {
    return dispatch_index_kind(args.bags.index_kind, [&](auto index_tag) {
      return dispatch_float_kind<FloatKinds::kNoDouble>(args.out_kind, [&](auto out_tag) {
        return forward<Int8Rowwise, typename decltype(out_tag)::type,
                       typename decltype(index_tag)::type>(args);
      });
    });
  }
  return dispatch_index_kind(args.bags.index_kind, [&](auto index_tag) {
    return dispatch_float_kind<FloatKinds::kNoDouble>(args.weights_kind, [&](auto weight_tag) {
      return dispatch_float_kind<FloatKinds::kNoDouble>(args.out_kind, [&](auto out_tag) {
        return forward<typename decltype(weight_tag)::type, typename decltype(out_tag)::type,
                       typename decltype(index_tag)::type>(args);
      });
    });
  });
}

inline int64_t sample_weights_grad_entry(const SampleWeightsGradArgs& args) {
  return dispatch_index_kind(args.bags.index_kind, [&](auto index_tag) {
    return dispatch_float_kind<FloatKinds::kNoDouble>(args.weights_kind, [&](auto weight_tag) {
      return sample_weights_grad<typename decltype(weight_tag)::type,
                                 typename decltype(index_tag)::type>(args);
    });
  });
}

inline int64_t exact_update_entry(const UpdateArgs& args) {
  const Tables tables(args.layout, args.state_offsets);
  RowRuns runs;
  const int64_t bad = dispatch_index_kind(args.bags.index_kind, [&](auto index_tag) {
    return group_rows<typename decltype(index_tag)::type>(args.layout, args.bags, tables, runs);
  });
  if (bad >= 0) return bad;
  dispatch_optimizer(args.optimizer, [&](auto optimizer) {
    dispatch_float_kind<FloatKinds::kNoDouble>(args.weights_kind, [&](auto weight_tag) {
      apply_updates<decltype(optimizer)::value, typename decltype(weight_tag)::type>(args, tables,
                                                                                     runs);
    });
  });
  return -1;
}

inline int64_t quantized_forward_entry(const QuantizedForwardArgs& args) {
  return dispatch_index_kind(args.bags.index_kind, [&](auto index_tag) {
    return dispatch_float_kind<FloatKinds::kNoDouble>(args.out_kind, [&](auto out_tag) {
      return quantized_forward<typename decltype(out_tag)::type,
                               typename decltype(index_tag)::type>(args);
    });
  });
}

const TbeKernels kTbeKernels = {&forward_entry, &sample_weights_grad_entry, &exact_update_entry,
                                &quantized_forward_entry};

}  // namespace recops::embedding::kernels::RECOPS_ISA_NS

// Element kinds, torch-free: what a kernel's type-erased arguments hold, and the one dispatch from
// a kind to the C++ type kernels are instantiated for. Adapters get kinds from tensors with
// common/dispatch.h (index_kind, float_kind); kernels and their entry points dispatch on them here.
#pragma once

#include <cstdint>

#include "recops/common/half_bits.h"

namespace recops {

template <typename T>
struct TypeTag {
  using type = T;
};

enum class IndexKind { kInt32, kInt64 };
enum class FloatKind { kFloat, kDouble, kHalf, kBFloat16 };

// Calls fn(TypeTag<int32_t>{}) or fn(TypeTag<int64_t>{}).
template <typename Fn>
decltype(auto) dispatch_index_kind(IndexKind kind, Fn&& fn) {
  return kind == IndexKind::kInt32 ? fn(TypeTag<int32_t>{}) : fn(TypeTag<int64_t>{});
}

// Which floating kinds a dispatch instantiates its kernel for: all of them, or the storage types
// of tables and activations (no double: kernels that only exist in fp32 compute).
enum class FloatKinds { kAll, kNoDouble };

// Calls fn(TypeTag<T>{}) with T = float, double, Fp16 or Bf16. With FloatKinds::kNoDouble the
// adapter has rejected kDouble (the dispatch would take float).
template <FloatKinds kKinds = FloatKinds::kAll, typename Fn>
decltype(auto) dispatch_float_kind(FloatKind kind, Fn&& fn) {
  if constexpr (kKinds == FloatKinds::kAll) {
    if (kind == FloatKind::kDouble) return fn(TypeTag<double>{});
  }
  switch (kind) {
    case FloatKind::kHalf:
      return fn(TypeTag<Fp16>{});
    case FloatKind::kBFloat16:
      return fn(TypeTag<Bf16>{});
    default:
      return fn(TypeTag<float>{});
  }
}

}  // namespace recops

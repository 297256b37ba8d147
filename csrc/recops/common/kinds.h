// Element kinds, torch-free: what a kernel's type-erased arguments hold, and the one dispatch from
// a kind to the C++ type kernels are instantiated for. Adapters get kinds from tensors with
// common/dispatch.h (index_kind, float_kind); kernels and their entry points dispatch on them here.
#pragma once

#include <cstdint>
#include <type_traits>

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

// One instruction-set variant's tables of a family's entry points (Table<T>), one per floating
// type it compiles per variant; of<T>() is T's. (float64 kernels, which serve validation, are the
// baseline's only and live beside these tables.)
template <template <typename> class Table>
struct FloatTables {
  Table<float> fp32;
  Table<Bf16> bf16;
  Table<Fp16> fp16;

  template <typename T>
  const Table<T>& of() const {
    if constexpr (std::is_same_v<T, float>) {
      return fp32;
    } else if constexpr (std::is_same_v<T, Bf16>) {
      return bf16;
    } else {
      static_assert(std::is_same_v<T, Fp16>, "FloatTables hold float, Bf16 and Fp16 tables");
      return fp16;
    }
  }
};

}  // namespace recops

// The adapter side of the element kinds (common/kinds.h): tensor dtypes mapped to the kinds and
// types kernels are instantiated for, with the checks that name a dtype no kernel takes. Kernels
// never include this header (it needs ATen); they get raw pointers of the kernel types, reached
// from a tensor with data_as / mutable_data_as.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <type_traits>

#include "recops/common/half_bits.h"
#include "recops/common/kinds.h"

namespace recops {

static_assert(sizeof(Fp16) == sizeof(at::Half) && alignof(Fp16) == alignof(at::Half) &&
                  sizeof(Bf16) == sizeof(at::BFloat16) && alignof(Bf16) == alignof(at::BFloat16),
              "tensor data of dtype half / bfloat16 is read as Fp16 / Bf16: one uint16_t each");

// The kernel type of a tensor element type: Fp16 / Bf16 for c10's Half / BFloat16 (same bits),
// the type itself otherwise.
template <typename T>
struct KernelTypeOf {
  using type = T;
};
template <>
struct KernelTypeOf<at::Half> {
  using type = Fp16;
};
template <>
struct KernelTypeOf<at::BFloat16> {
  using type = Bf16;
};
template <typename T>
using kernel_type_t = typename KernelTypeOf<T>::type;

// The dtype whose elements a kernel reads as T.
template <typename T>
constexpr at::ScalarType scalar_type_of() {
  if constexpr (std::is_same_v<T, Fp16>) {
    return at::kHalf;
  } else if constexpr (std::is_same_v<T, Bf16>) {
    return at::kBFloat16;
  } else {
    return c10::CppTypeToScalarType<T>::value;
  }
}

// t's data as kernel elements of type T (t has T's dtype).
template <typename T>
const T* data_as(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.scalar_type() == scalar_type_of<T>(), "data_as: dtype ", t.scalar_type());
  return static_cast<const T*>(t.const_data_ptr());
}

template <typename T>
T* mutable_data_as(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.scalar_type() == scalar_type_of<T>(), "mutable_data_as: dtype ",
                        t.scalar_type());
  return static_cast<T*>(t.mutable_data_ptr());
}

inline IndexKind index_kind(at::ScalarType dtype) {
  if (dtype == at::kInt) return IndexKind::kInt32;
  TORCH_CHECK(dtype == at::kLong, "index tensors must be int32 or int64, got ", dtype);
  return IndexKind::kInt64;
}

// `name` names the tensor in the error for a dtype that is not floating.
inline FloatKind float_kind(at::ScalarType dtype, const char* name) {
  switch (dtype) {
    case at::kFloat:
      return FloatKind::kFloat;
    case at::kDouble:
      return FloatKind::kDouble;
    case at::kHalf:
      return FloatKind::kHalf;
    case at::kBFloat16:
      return FloatKind::kBFloat16;
    default:
      TORCH_CHECK(false, name, " must be float, double, half or bfloat16, got ", dtype);
  }
}

// Calls fn(TypeTag<uintN_t>{}) with the unsigned integer type as wide as one element: copy-only
// kernels do not care what a value means, only how wide it is, so one instantiation serves
// float, int32, ... alike.
template <typename Fn>
decltype(auto) dispatch_element_width(int64_t element_size, Fn&& fn) {
  switch (element_size) {
    case 1:
      return fn(TypeTag<uint8_t>{});
    case 2:
      return fn(TypeTag<uint16_t>{});
    case 4:
      return fn(TypeTag<uint32_t>{});
    case 8:
      return fn(TypeTag<uint64_t>{});
    default:
      TORCH_CHECK(false, "unsupported element size ", element_size, " bytes");
  }
}

// A 2-D tensor as kernels read rows: t itself when its columns are contiguous (any row stride),
// else a contiguous copy.
inline at::Tensor with_unit_columns(const at::Tensor& t) {
  return t.size(1) <= 1 || t.stride(1) == 1 ? t : t.contiguous();
}

// The compute dtype of a floating input: float64 computes in float64, every other floating dtype
// in fp32.
inline at::ScalarType compute_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Calls fn(TypeTag<T>{}) with the compute type of a floating dtype: float64 computes in double
// (validation, gradcheck), float32 / bfloat16 / float16 in float.
template <typename Fn>
decltype(auto) dispatch_compute_type(at::ScalarType dtype, Fn&& fn) {
  if (dtype == at::kDouble) return fn(TypeTag<double>{});
  return fn(TypeTag<float>{});
}

}  // namespace recops

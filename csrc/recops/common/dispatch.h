// Dtype dispatch helpers. Copy-only kernels do not care what a value means, only how wide it is:
// they are instantiated per element width, so one instantiation serves float, int32, ... alike.
#pragma once

#include <ATen/Dispatch.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <type_traits>

namespace recops {

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<uintN_t>{}) with the unsigned integer type as wide as one element.
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

// Calls fn(TypeTag<int32_t>{}) or fn(TypeTag<int64_t>{}) for an index tensor's dtype.
template <typename Fn>
decltype(auto) dispatch_index_type(at::ScalarType dtype, Fn&& fn) {
  if (dtype == at::kInt) return fn(TypeTag<int32_t>{});
  TORCH_CHECK(dtype == at::kLong, "index tensors must be int32 or int64, got ", dtype);
  return fn(TypeTag<int64_t>{});
}

// Calls fn(TypeTag<scalar_t>{}) for a floating dtype: float, double, half or bfloat16.
template <typename Fn>
decltype(auto) dispatch_floating_type(at::ScalarType dtype, const char* name, Fn&& fn) {
  TORCH_CHECK(
      dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16,
      name, " must be float, double, half or bfloat16, got ", dtype);
  return AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "recops_floating",
                                         [&] { return fn(TypeTag<scalar_t>{}); });
}

// Calls fn(TypeTag<T>{}) with the compute type of a floating dtype: float64 computes in double
// (validation, gradcheck), float32 / bfloat16 / float16 in float.
template <typename Fn>
decltype(auto) dispatch_compute_type(at::ScalarType dtype, Fn&& fn) {
  if (dtype == at::kDouble) return fn(TypeTag<double>{});
  return fn(TypeTag<float>{});
}

}  // namespace recops

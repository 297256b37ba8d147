// FunctionRef<R(Args...)>: a non-owning reference to a callable, two pointers wide. It lets a
// torch-free interface take a lambda without templates (which would tie every caller to one
// implementation) and without std::function (which may allocate). The callable must outlive the
// reference: pass a lambda straight to the call that uses it, never store the reference.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace recops {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename Callable,
            typename = std::enable_if_t<!std::is_same_v<std::decay_t<Callable>, FunctionRef> &&
                                        std::is_invocable_r_v<R, Callable&, Args...>>>
  FunctionRef(Callable&& callable)  // NOLINT: implicit, as a lambda argument is passed
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(callable)))),
        call_(&call<std::remove_reference_t<Callable>>) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  template <typename Callable>
  static R call(void* object, Args... args) {
    return (*static_cast<Callable*>(object))(std::forward<Args>(args)...);
  }

  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace recops

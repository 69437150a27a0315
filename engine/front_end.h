// Helpers shared by the op front-ends (ops.cpp, composite_ops.cpp, spatial_ops.cpp).
#pragma once

#include <initializer_list>
#include <optional>
#include <string_view>

#include "orochi/engine/tensor.h"

namespace orochi::engine {

// Whether a 0-dim CPU tensor may join tensors on another device, as PyTorch allows for
// elementwise ops: Python numbers become such tensors, and `x + 1` must work for a GPU `x`.
enum class CpuScalars : bool { kRefuse, kFollow };

// The device all `tensors` are on (null and undefined ones are skipped), or an Error naming `op`:
// "add: expected all tensors on the same device, got cpu and cuda:0".
Device CommonDevice(std::string_view op, std::initializer_list<const Tensor*> tensors,
                    CpuScalars scalars = CpuScalars::kRefuse);

// An optional argument (weight, bias) for CommonDevice: null when absent.
inline const Tensor* Optional(const std::optional<Tensor>& tensor) {
  return tensor ? &*tensor : nullptr;
}

// `tensor` on `device`: a 0-dim CPU tensor is moved there (CommonDevice allowed it); any other
// tensor is returned as it is.
Tensor OnDevice(const Tensor& tensor, Device device);

}  // namespace orochi::engine

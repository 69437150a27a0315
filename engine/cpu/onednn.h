// oneDNN: float32 convolution on the CPU, with weights kept in oneDNN's own layout.
#pragma once

#include "orochi/engine/dispatch.h"
#include "orochi/engine/tensor.h"

namespace orochi::engine::cpu {

// conv2d of contiguous float32 [N, C, H, W] input and [O, C/groups, kh, kw] weight into the
// contiguous float32 output [N, O, oh, ow] (geometry checked and output sized by the caller).
// Runs on IntraOpThreads() threads. A read-only weight (loaded weights) is rearranged into
// oneDNN's blocked layout once and kept with its storage (Storage::PreparedLayout); a writable
// one is rearranged on every call, since its bytes may change between calls.
// `bias` (null: none), a contiguous float32 [O], is added by oneDNN as it writes the output.
void OnednnConv2d(const Tensor& input, const Tensor& weight, const Tensor* bias,
                  const ConvGeometry& geometry, Tensor& output);

}  // namespace orochi::engine::cpu

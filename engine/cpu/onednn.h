// oneDNN: float32 convolution on the CPU, with weights kept in oneDNN's own layout.
#pragma once

#include <array>
#include <cstdint>

#include "dispatch.h"
#include "orochi/engine/tensor.h"

namespace orochi::engine::cpu {

// conv2d of contiguous float32 [N, C, H, W] input and [O, C/groups, kh, kw] weight into the
// contiguous float32 output [N, O, oh, ow] (geometry checked and output sized by the caller).
// Runs on IntraOpThreads() threads. A read-only weight (loaded weights) is rearranged into
// oneDNN's blocked layout once and kept with its storage (Storage::PreparedLayout); a writable
// one is rearranged on every call, since its bytes may change between calls.
// `bias` (null: none), a contiguous float32 [O], is added by oneDNN as it writes the output, and
// so is the epilogue (oneDNN post-ops): output = relu?(conv + bias + residual?).
struct ConvEpilogue {
  const Tensor* residual = nullptr;  // contiguous float32, the output's shape
  bool relu = false;
};
void OnednnConv2d(const Tensor& input, const Tensor& weight, const Tensor* bias,
                  const ConvGeometry& geometry, const ConvEpilogue& epilogue, Tensor& output);

// max_pool2d of a contiguous float32 [N, C, H, W] input into the contiguous [N, C, oh, ow] output
// (sized by the caller; padding counts as -infinity), by oneDNN's pooling on the plain layout.
void OnednnMaxPool2d(const Tensor& input, std::array<int64_t, 2> kernel,
                     std::array<int64_t, 2> stride, std::array<int64_t, 2> padding, Tensor& output);

// Whether OnednnLinear is the faster way to compute `input @ weight.T` (float32 on the CPU): only
// for a read-only weight, whose layout is prepared once (a writable one would be rearranged on
// every call), for at least kOnednnLinearMinRows rows of input, and for at least
// kOnednnLinearMinWork multiply-adds. Chosen by measurement (bench_engine's linear and "few rows"
// cases, docs/PERFORMANCE.md): oneDNN's matmul on a prepared weight beat OpenBLAS's sgemm by
// 1.1-2.4x from 8 rows up on the example networks' layers (8 x 256 x 1000 and up), matched it at
// 1 row, and lost to sgemm on a row-major copy of the weight (see cpu/matmul.cpp) by about 3 us a
// call, 2x, on textgen's small layers (8-32 rows x 64 x 256); the two break even near 1M
// multiply-adds (64 x 64 x 256).
inline constexpr int64_t kOnednnLinearMinRows = 8;
inline constexpr int64_t kOnednnLinearMinWork = int64_t{1} << 20;
bool PrefersOnednnLinear(const Tensor& input, const Tensor& weight);

// linear: contiguous float32 input [rows, in] times weight [out, in] (contiguous, read-only)
// transposed, plus `bias` (null: none; contiguous [out]) added by oneDNN as it writes, into the
// contiguous output [rows, out].
void OnednnLinear(const Tensor& input, const Tensor& weight, const Tensor* bias, Tensor& output);

}  // namespace orochi::engine::cpu

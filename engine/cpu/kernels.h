// The CPU kernels, one per op or family of ops, with the registry's signatures (dispatch.h);
// register.cpp puts them in the CPU's kernel table.
#pragma once

#include "dispatch.h"

namespace orochi::engine::cpu {

// elementwise.cpp
void Copy(const Tensor& source, Tensor& destination);
void Fill(Tensor& output, double value);
void ArangeFill(Tensor& output, double start, double step);
void UnaryOp(Op op, const Tensor& input, Tensor& output);
void BinaryOp(Op op, const Tensor& a, const Tensor& b, Tensor& output);
void WhereOp(const Tensor& condition, const Tensor& a, const Tensor& b, Tensor& output);
// reduce.cpp
void ReduceOp(Op op, const Tensor& input, Tensor& output);
void SoftmaxOp(Op op, const Tensor& input, Tensor& output);
void CumsumOp(Op op, const Tensor& input, Tensor& output);
void NormOp(Op op, const Tensor& input, const Tensor* weight, const Tensor* bias, double eps,
            Tensor& output);
// index.cpp
void IndexSelect(const Tensor& input, const Tensor& index, Tensor& output);
// spatial.cpp
void Im2col(const Tensor& input, const Im2colGeometry& g, Tensor& output);
void Conv2d(const Tensor& input, const Tensor& weight, const ConvGeometry& geometry,
            Tensor& output);
// sort.cpp
void SortRows(const Tensor& input, bool descending, Tensor& values, Tensor& indices);
// matmul.cpp
void Matmul(const Tensor& a, const Tensor& b, Tensor& output);

}  // namespace orochi::engine::cpu

// Tensor: a strided view (shape, strides, offset, dtype) of a Storage.
//
// Ownership: a Tensor shares its Storage with every view of it; copying a Tensor makes another
// view, never a copy of the data (use Clone() or Contiguous() for that).
//
// Thread-safety: a Tensor object is a value; distinct Tensor objects may be used from different
// threads even when they share storage. Reading shared data from many threads is safe; writing
// it while others read or write is the caller's race. Read-only tensors (memory-mapped weights)
// refuse every write with an Error, so they can be shared freely.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "orochi/engine/dtype.h"
#include "orochi/engine/error.h"
#include "orochi/engine/export.h"
#include "orochi/engine/storage.h"

// The plain-C handle of a tensor, for interfaces that must stay C (the interpreter copies' ABI).
struct OrochiTensor;

namespace orochi::engine {

using Shape = std::vector<int64_t>;

// Tensors have at most this many dimensions (PyTorch's limit too); deeper shapes are refused.
inline constexpr size_t kMaxDims = 64;

OROCHI_ENGINE_API int64_t NumElements(const Shape& shape);
// Row-major strides, a size 0 counted as 1. Throws kInvalidArgument when one does not fit in
// 64 bits, which only an empty tensor's sizes can cause (the others' elements would not fit).
OROCHI_ENGINE_API Shape ContiguousStrides(const Shape& shape);
OROCHI_ENGINE_API std::string ShapeString(const Shape& shape);  // "[2, 3]"

class OROCHI_ENGINE_API Tensor {
 public:
  Tensor() = default;  // an undefined tensor; defined() is false
  Tensor(StoragePtr storage, Shape shape, Shape strides, int64_t storage_offset, DType dtype);

  // A new contiguous tensor with uninitialised contents on `device`.
  static Tensor Empty(const Shape& shape, DType dtype, Device device = {});

  bool defined() const { return static_cast<bool>(storage_); }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t dim) const;  // negative dims count from the end
  int64_t numel() const { return NumElements(shape_); }
  int64_t storage_offset() const { return storage_offset_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_->device(); }
  bool read_only() const { return storage_->read_only(); }
  bool is_contiguous() const;
  const StoragePtr& storage() const { return storage_; }

  // The first element. data() is always allowed; mutable_data() throws on read-only tensors.
  // On a CUDA device these are device addresses: code that reads or writes the bytes on the
  // host calls RequireCpu first.
  const void* data() const { return storage_->data() + storage_offset_ * ItemSize(dtype_); }
  void* mutable_data();
  template <typename T>
  const T* data_as() const {
    return static_cast<const T*>(data());
  }
  template <typename T>
  T* mutable_data_as() {
    return static_cast<T*>(mutable_data());
  }

  // A plain-C handle to this tensor, borrowed: valid while *this lives and unchanged.
  const OrochiTensor* handle() const { return reinterpret_cast<const OrochiTensor*>(this); }
  // The tensor behind a handle made by handle(); copy it to keep it.
  static const Tensor& FromHandle(const OrochiTensor* handle) {
    return *reinterpret_cast<const Tensor*>(handle);
  }

  // --- views (share storage) ---------------------------------------------------------------------
  Tensor View(const Shape& shape) const;     // needs compatible strides; -1 infers one dim
  Tensor Reshape(const Shape& shape) const;  // a view when possible, else a contiguous copy
  Tensor Permute(const std::vector<int64_t>& order) const;
  Tensor Transpose(int64_t dim0, int64_t dim1) const;
  Tensor Squeeze(std::optional<int64_t> dim = std::nullopt) const;
  Tensor Unsqueeze(int64_t dim) const;
  Tensor Expand(const Shape& shape) const;  // -1 keeps a size; new dims on the left
  Tensor Flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor Narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor Slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;  // Python rules
  Tensor Select(int64_t dim, int64_t index) const;                                // drops the dim

  // --- copies ------------------------------------------------------------------------------------
  Tensor Contiguous() const;     // *this if already contiguous
  Tensor Clone() const;          // always a new, writable, contiguous copy
  Tensor To(DType dtype) const;  // *this if already `dtype`, else a converted copy
  // *this if already on `device`, else a contiguous copy there. A read-only tensor (weights)
  // stays read-only, and on a GPU its copy has fully arrived before To returns, so any thread
  // may use it at once; a contiguous one is uploaded once: moving the same bytes again, from
  // any thread, gives a view of the same device copy, which lives as long as the CPU storage.
  // Moving to the CPU waits for the work that produces the values.
  Tensor To(Device device) const;

  // Copies `source` (broadcast to this shape, converted to this dtype, moved from its device)
  // into this tensor.
  void CopyFrom(const Tensor& source);

  // Element i of the flattened tensor as double (tests, printing, .item()). CPU tensors only.
  double ItemAsDouble(int64_t flat_index = 0) const;

  // Throws Error (kFailedPrecondition) "<what>: the tensor is on cuda:0; move it to the CPU
  // first" unless this tensor is on the CPU. Every path that touches the bytes on the host
  // (printing, buffers, file writes) calls it first.
  void RequireCpu(std::string_view what) const;

 private:
  StoragePtr storage_;
  Shape shape_;
  Shape strides_;
  int64_t storage_offset_ = 0;
  DType dtype_ = DType::kFloat32;
};

// Wraps a negative dim and checks it against `rank` (`rank + 1` positions when inserting).
// Throws Error (kOutOfRange) for a dim outside [-rank, rank), as do every view and op that takes
// a dim, and Select, Narrow's start, ItemAsDouble and IndexSelect for an index outside theirs.
OROCHI_ENGINE_API int64_t WrapDim(int64_t dim, int64_t rank);
// WrapDim for ops that, as in PyTorch, take a dim on a 0-d tensor too (reductions, softmax,
// squeeze, sort, selection): there 0 and -1 name its one element and give 0, which the caller
// must not use to index the (empty) shape.
OROCHI_ENGINE_API int64_t WrapScalarDim(int64_t dim, int64_t rank);

}  // namespace orochi::engine

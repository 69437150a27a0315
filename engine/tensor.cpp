#include "orochi/engine/tensor.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "device_backend.h"
#include "dispatch.h"
#include "orochi/engine/device.h"
#include "orochi/engine/ops.h"

namespace orochi::engine {

int64_t NumElements(const Shape& shape) {
  int64_t count = 1;
  for (int64_t size : shape) {
    OROCHI_CHECK_ARG(
        !__builtin_mul_overflow(count, size, &count),
        "the shape " << ShapeString(shape) << " has more elements than fit in 64 bits");
  }
  return count;
}

Shape ContiguousStrides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    // A 0 counts as 1, as in PyTorch, so that an empty tensor's strides still tell its dims
    // apart. Its elements (none) then say nothing of its strides: [0, 2^62, 4] is empty, but
    // its first stride would be 2^64, so its sizes are refused as NumElements refuses them.
    OROCHI_CHECK_ARG(
        i == 0 || !__builtin_mul_overflow(stride, std::max<int64_t>(shape[i], 1), &stride),
        "the shape " << ShapeString(shape) << " has strides that do not fit in 64 bits");
  }
  return strides;
}

std::string ShapeString(const Shape& shape) {
  std::ostringstream text;
  text << '[';
  for (size_t i = 0; i < shape.size(); ++i) text << (i > 0 ? ", " : "") << shape[i];
  text << ']';
  return text.str();
}

int64_t WrapDim(int64_t dim, int64_t rank) {
  int64_t wrapped = dim < 0 ? dim + rank : dim;
  OROCHI_CHECK_RANGE(wrapped >= 0 && wrapped < rank,
                     "dimension " << dim << " is out of range for a tensor of " << rank
                                  << " dimension(s)"
                                  << (rank == 0 ? " (a 0-d tensor has no dimensions)" : ""));
  return wrapped;
}

int64_t WrapScalarDim(int64_t dim, int64_t rank) {
  if (rank > 0) return WrapDim(dim, rank);
  OROCHI_CHECK_RANGE(dim == 0 || dim == -1, "dimension " << dim
                                                         << " is out of range for a 0-d tensor "
                                                            "(only 0 and -1 name its one element)");
  return 0;
}

Tensor::Tensor(StoragePtr storage, Shape shape, Shape strides, int64_t storage_offset, DType dtype)
    : storage_(std::move(storage)),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      storage_offset_(storage_offset),
      dtype_(dtype) {
  OROCHI_CHECK_ARG(shape_.size() <= kMaxDims,
                   "tensors have at most " << kMaxDims << " dimensions, got " << shape_.size());
}

Tensor Tensor::Empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t size : shape) {
    OROCHI_CHECK_ARG(size >= 0, "negative dimension in shape " << ShapeString(shape));
  }
  size_t bytes = 0;
  OROCHI_CHECK(
      !__builtin_mul_overflow(static_cast<size_t>(NumElements(shape)), ItemSize(dtype), &bytes),
      StatusCode::kResourceExhausted,
      "a " << DTypeName(dtype) << " tensor of shape " << ShapeString(shape)
           << " needs more bytes than fit in 64 bits");
  StoragePtr storage = Storage::Allocate(bytes, device);
  return {std::move(storage), shape, ContiguousStrides(shape), 0, dtype};
}

int64_t Tensor::size(int64_t dim) const { return shape_[WrapDim(dim, this->dim())]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (shape_[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

namespace {
constexpr const char* kReadOnlyMessage =
    "cannot write to a read-only tensor: weights loaded from safetensors are shared by every "
    "interpreter copy and never modified in place; clone() it for a writable copy";
}  // namespace

void* Tensor::mutable_data() {
  OROCHI_CHECK(!read_only(), StatusCode::kFailedPrecondition, kReadOnlyMessage);
  return storage_->mutable_data() + storage_offset_ * ItemSize(dtype_);
}

namespace {

// Resolves one -1 in `shape` against `numel`.
Shape InferShape(Shape shape, int64_t numel) {
  int64_t known = 1;
  int inferred = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      OROCHI_CHECK_ARG(inferred < 0, "only one dimension can be inferred (-1)");
      inferred = static_cast<int>(i);
    } else {
      OROCHI_CHECK_ARG(shape[i] >= 0, "invalid shape dimension " << shape[i]);
      known *= shape[i];
    }
  }
  if (inferred >= 0) {
    OROCHI_CHECK_ARG(known != 0 && numel % known == 0,
                     "shape " << ShapeString(shape) << " is invalid for " << numel << " elements");
    shape[inferred] = numel / known;
  }
  OROCHI_CHECK_ARG(NumElements(shape) == numel,
                   "shape " << ShapeString(shape) << " is invalid for " << numel << " elements");
  return shape;
}

// Strides for viewing (shape, strides) as new_shape without copying, if possible: each group of
// old dims that merges or splits must be contiguous within itself.
std::optional<Shape> ViewStrides(const Shape& shape, const Shape& strides, const Shape& new_shape) {
  Shape new_strides(new_shape.size());
  if (NumElements(shape) == 0) return ContiguousStrides(new_shape);
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = strides.empty() ? 1 : strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  while (view_d >= 0) new_strides[view_d--] = 1;  // trailing size-1 dims
  return new_strides;
}

}  // namespace

Tensor Tensor::View(const Shape& shape) const {
  Shape resolved = InferShape(shape, numel());
  std::optional<Shape> strides = ViewStrides(shape_, strides_, resolved);
  OROCHI_CHECK_ARG(strides.has_value(), "view " << ShapeString(resolved)
                                                << " is not compatible with the strides of a "
                                                << ShapeString(shape_) << " tensor; use Reshape");
  return {storage_, std::move(resolved), std::move(*strides), storage_offset_, dtype_};
}

Tensor Tensor::Reshape(const Shape& shape) const {
  Shape resolved = InferShape(shape, numel());
  if (std::optional<Shape> strides = ViewStrides(shape_, strides_, resolved)) {
    return {storage_, std::move(resolved), std::move(*strides), storage_offset_, dtype_};
  }
  return Contiguous().View(resolved);
}

Tensor Tensor::Permute(const std::vector<int64_t>& order) const {
  OROCHI_CHECK_ARG(static_cast<int64_t>(order.size()) == dim(),
                   "permute needs " << dim() << " dimensions, got " << order.size());
  Shape shape(order.size());
  Shape strides(order.size());
  static_assert(kMaxDims <= 64, "one bit per dimension");
  uint64_t seen = 0;  // a bit per source dimension: no allocation for a small op's views
  for (size_t i = 0; i < order.size(); ++i) {
    int64_t source = WrapDim(order[i], dim());
    const uint64_t bit = uint64_t{1} << static_cast<unsigned>(source);
    OROCHI_CHECK_ARG((seen & bit) == 0, "permute repeats dimension " << order[i]);
    seen |= bit;
    shape[i] = shape_[source];
    strides[i] = strides_[source];
  }
  return {storage_, std::move(shape), std::move(strides), storage_offset_, dtype_};
}

Tensor Tensor::Transpose(int64_t dim0, int64_t dim1) const {
  if (dim() == 0) {  // as in PyTorch, transposing a 0-d tensor's "dims" 0 and -1 is itself
    WrapScalarDim(dim0, 0);
    WrapScalarDim(dim1, 0);
    return *this;
  }
  const int64_t first = WrapDim(dim0, dim());
  const int64_t second = WrapDim(dim1, dim());
  Shape shape = shape_;
  Shape strides = strides_;
  std::swap(shape[first], shape[second]);
  std::swap(strides[first], strides[second]);
  return {storage_, std::move(shape), std::move(strides), storage_offset_, dtype_};
}

Tensor Tensor::Squeeze(std::optional<int64_t> squeezed) const {
  Shape shape;
  Shape strides;
  const int64_t only = squeezed ? WrapScalarDim(*squeezed, dim()) : -1;  // -1: every size-1 dim
  for (int64_t d = 0; d < dim(); ++d) {
    bool drop = shape_[d] == 1 && (only < 0 || only == d);
    if (!drop) {
      shape.push_back(shape_[d]);
      strides.push_back(strides_[d]);
    }
  }
  return {storage_, std::move(shape), std::move(strides), storage_offset_, dtype_};
}

Tensor Tensor::Unsqueeze(int64_t at) const {
  int64_t position = WrapDim(at, dim() + 1);
  int64_t stride = position < dim() ? strides_[position] * shape_[position] : 1;
  Shape shape;  // built at its final size: one allocation each
  Shape strides;
  shape.reserve(shape_.size() + 1);
  strides.reserve(shape_.size() + 1);
  shape.insert(shape.end(), shape_.begin(), shape_.begin() + position);
  strides.insert(strides.end(), strides_.begin(), strides_.begin() + position);
  shape.push_back(1);
  strides.push_back(stride);
  shape.insert(shape.end(), shape_.begin() + position, shape_.end());
  strides.insert(strides.end(), strides_.begin() + position, strides_.end());
  return {storage_, std::move(shape), std::move(strides), storage_offset_, dtype_};
}

Tensor Tensor::Expand(const Shape& target) const {
  OROCHI_CHECK_ARG(
      static_cast<int64_t>(target.size()) >= dim(),
      "cannot expand " << ShapeString(shape_) << " to fewer dimensions " << ShapeString(target));
  size_t leading = target.size() - shape_.size();
  Shape shape(target.size());
  Shape strides(target.size());
  for (size_t i = 0; i < target.size(); ++i) {
    if (i < leading) {
      OROCHI_CHECK_ARG(target[i] >= 0, "cannot expand to " << ShapeString(target));
      shape[i] = target[i];
      strides[i] = 0;
      continue;
    }
    int64_t own = shape_[i - leading];
    int64_t wanted = target[i] == -1 ? own : target[i];
    OROCHI_CHECK_ARG(own == wanted || own == 1,
                     "cannot expand " << ShapeString(shape_) << " to " << ShapeString(target));
    shape[i] = wanted;
    strides[i] = own == wanted ? strides_[i - leading] : 0;
  }
  return {storage_, std::move(shape), std::move(strides), storage_offset_, dtype_};
}

Tensor Tensor::Flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return Reshape({1});
  int64_t start = WrapDim(start_dim, dim());
  int64_t end = WrapDim(end_dim, dim());
  OROCHI_CHECK_ARG(start <= end, "flatten: start_dim must not come after end_dim");
  Shape shape(shape_.begin(), shape_.begin() + start);
  int64_t merged = 1;
  for (int64_t d = start; d <= end; ++d) merged *= shape_[d];
  shape.push_back(merged);
  shape.insert(shape.end(), shape_.begin() + end + 1, shape_.end());
  return Reshape(shape);
}

Tensor Tensor::Narrow(int64_t along, int64_t start, int64_t length) const {
  OROCHI_CHECK_ARG(dim() > 0, "narrow() cannot be applied to a 0-d tensor");
  int64_t d = WrapDim(along, dim());
  const int64_t size = shape_[d];
  const int64_t first = start < 0 ? start + size : start;
  // As in PyTorch, a start outside the dimension is an index error, a length past its end not.
  OROCHI_CHECK_RANGE(first >= 0 && first <= size, "narrow: start "
                                                      << start << " is outside dimension " << along
                                                      << " of size " << size);
  OROCHI_CHECK_ARG(length >= 0 && length <= size - first, "narrow: a length of "
                                                              << length << " from start " << start
                                                              << " does not fit dimension " << along
                                                              << " of size " << size);
  return Slice(d, first, first + length);
}

Tensor Tensor::Slice(int64_t along, int64_t start, int64_t end, int64_t step) const {
  int64_t d = WrapDim(along, dim());
  OROCHI_CHECK_ARG(step > 0, "slice step must be positive, got " << step);
  int64_t size = shape_[d];
  auto clamp = [size](int64_t index) {
    if (index < 0) index += size;
    return std::clamp<int64_t>(index, 0, size);
  };
  int64_t first = clamp(start);
  int64_t last = std::max(first, clamp(end));
  Shape shape = shape_;
  Shape strides = strides_;
  shape[d] = last > first ? (last - first - 1) / step + 1 : 0;  // no overflow for huge steps
  strides[d] = strides_[d] * step;
  return {storage_, std::move(shape), std::move(strides), storage_offset_ + first * strides_[d],
          dtype_};
}

Tensor Tensor::Select(int64_t along, int64_t index) const {
  int64_t d = WrapDim(along, dim());
  int64_t wrapped = index < 0 ? index + shape_[d] : index;
  OROCHI_CHECK_RANGE(
      wrapped >= 0 && wrapped < shape_[d],
      "index " << index << " is out of range for dimension " << along << " of size " << shape_[d]);
  Shape shape = shape_;
  Shape strides = strides_;
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return {storage_, std::move(shape), std::move(strides), storage_offset_ + wrapped * strides_[d],
          dtype_};
}

Tensor Tensor::Contiguous() const { return is_contiguous() ? *this : Clone(); }

Tensor Tensor::Clone() const {
  Tensor copy = Empty(shape_, dtype_, device());
  copy.CopyFrom(*this);
  return copy;
}

Tensor Tensor::To(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor converted = Empty(shape_, dtype, device());
  converted.CopyFrom(*this);
  return converted;
}

namespace {

// A read-only device copy of `size` host bytes, complete when this returns (see
// Storage::DeviceReplica).
StoragePtr UploadShared(const std::byte* bytes, size_t size, Device device) {
  const auto count = static_cast<int64_t>(size);
  Tensor destination = Tensor::Empty({count}, DType::kUInt8, device);
  // The bytes belong to a storage that outlives this call: lend them without a release.
  Tensor source(
      Storage::Borrow(const_cast<std::byte*>(bytes), size, /*read_only=*/true, nullptr, nullptr),
      {count}, {1}, 0, DType::kUInt8);
  if (size > 0) CudaBackend()->copy_from_host(source, destination, /*share=*/true);
  destination.storage()->MarkReadOnly();
  return destination.storage();
}

}  // namespace

Tensor Tensor::To(Device target) const {
  const Device source_device = device();
  if (target == source_device) return *this;
  RequireDevice(target);
  if (read_only() && source_device.type == DeviceType::kCpu && is_contiguous()) {
    // Weights: one upload per byte range and device, shared by every caller.
    const size_t item = ItemSize(dtype_);
    const size_t begin = static_cast<size_t>(storage_offset_) * item;
    const size_t end = begin + static_cast<size_t>(numel()) * item;
    return {storage_->DeviceReplica(target, begin, end, UploadShared), shape_, strides_, 0, dtype_};
  }
  // Contiguous on the source device first (a device kernel for device tensors), then one copy of
  // the bytes.
  Tensor source = Contiguous();
  Tensor moved = Empty(shape_, dtype_, target);
  if (numel() > 0) {
    if (source_device.type == DeviceType::kCpu) {
      CudaBackend()->copy_from_host(source, moved, /*share=*/read_only());
    } else if (target.type == DeviceType::kCpu) {
      CudaBackend()->copy_to_host(source, moved);
    } else {
      CudaBackend()->copy_between_devices(source, moved);
    }
  }
  if (read_only()) moved.storage_->MarkReadOnly();
  return moved;
}

void Tensor::CopyFrom(const Tensor& source) {
  OROCHI_CHECK(!read_only(), StatusCode::kFailedPrecondition, kReadOnlyMessage);
  const Tensor& local = source.device() == device() ? source : source.To(device());
  Tensor expanded = local.shape() == shape_ ? local : local.Expand(shape_);
  Kernels().Find<Op::copy>(device(), dtype_)(expanded, *this);
}

void Tensor::RequireCpu(std::string_view what) const {
  OROCHI_CHECK(
      device().type == DeviceType::kCpu, StatusCode::kFailedPrecondition,
      what << ": the tensor is on " << DeviceName(device()) << "; move it to the CPU first");
}

double Tensor::ItemAsDouble(int64_t flat_index) const {
  RequireCpu("reading an element");
  OROCHI_CHECK_RANGE(flat_index >= 0 && flat_index < numel(),
                     "element " << flat_index << " is out of range for " << numel() << " elements");
  int64_t offset = 0;
  int64_t rest = flat_index;
  for (size_t i = shape_.size(); i-- > 0;) {
    offset += (rest % shape_[i]) * strides_[i];
    rest /= shape_[i];
  }
  const std::byte* base = static_cast<const std::byte*>(data()) + offset * ItemSize(dtype_);
  return VisitDType(dtype_, [base]<typename T>() {
    T value{};
    std::memcpy(&value, base, sizeof(T));
    return Convert<double>(value);
  });
}

}  // namespace orochi::engine

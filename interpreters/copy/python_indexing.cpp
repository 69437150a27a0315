// Python indexing of tensors: `t[...]` and `t[...] = value`, with PyTorch's rules for ints,
// slices, None, Ellipsis, and integer and bool tensors ("advanced" indices).
#include <pybind11/pybind11.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "orochi/engine/ops.h"
#include "python_bindings.h"
#include "python_engine.h"

namespace orochi::copy::bindings {
namespace {

struct AdvancedIndex {
  int64_t dim;
  Tensor index;  // int64, in range
};

// The result of applying every basic index (a view) and the advanced ones still to apply.
struct Indexed {
  Tensor view;
  std::vector<AdvancedIndex> advanced;
};

bool IsListOrTuple(PyObject* object) {
  return PyList_Check(object) != 0 || PyTuple_Check(object) != 0;
}

Tensor AsIndexTensor(py::handle item) {
  if (const Tensor* tensor = TensorFromPython(item.ptr())) {
    // PyTorch (1.13, deprecated there) takes a uint8 index tensor as a mask, not as positions:
    // reading it as positions would silently pick other elements.
    if (tensor->dtype() == engine::DType::kUInt8) return tensor->To(engine::DType::kBool);
    return *tensor;
  }
  if (PySequence_Size(item.ptr()) == 0) {
    return engine::Zeros({0}, engine::DType::kInt64);  // x[[]] selects nothing
  }
  return TensorFromData(item, std::nullopt);  // a list of ints or bools
}

// PyTorch's rule, numpy's legacy one: a list of fewer than 32 items of which one is a tensor, a
// sequence, a slice, Ellipsis or None is a tuple of indices, one per dim (x[[[0, 1], [1, 0]]]
// is x[[0, 1], [1, 0]], x[[[0, 1]]] is x[[0, 1]]); any other list is one index tensor.
bool IsTupleOfIndices(py::handle list) {
  constexpr Py_ssize_t kMaxTupleItems = 31;
  const Py_ssize_t size = PyList_GET_SIZE(list.ptr());
  if (size > kMaxTupleItems) return false;
  for (Py_ssize_t i = 0; i < size; ++i) {
    PyObject* item = PyList_GET_ITEM(list.ptr(), i);
    if (TensorFromPython(item) != nullptr || PySequence_Check(item) != 0 ||
        PySlice_Check(item) != 0 || item == Py_Ellipsis || item == Py_None) {
      return true;
    }
  }
  return false;
}

[[noreturn]] void BadIndex(py::handle item) {
  // IndexError for a float, as PyTorch; TypeError for what is not a number at all.
  if (PyFloat_Check(item.ptr()) != 0) {
    throw py::index_error(
        "only integers, slices, None, Ellipsis and integer or bool tensors are "
        "valid indices, got float");
  }
  throw py::type_error(
      "only integers, slices, None, Ellipsis and integer or bool tensors are "
      "valid indices, got " +
      std::string(Py_TYPE(item.ptr())->tp_name));
}

// Wraps negative entries and checks the range, like PyTorch's "index 5 is out of bounds".
Tensor CheckedIndex(const Tensor& index, int64_t size, int64_t dim) {
  Tensor as_long = index.To(engine::DType::kInt64);
  if (as_long.numel() == 0) return as_long;
  Tensor zero = engine::Scalar(0, engine::DType::kInt64);
  Tensor wrapped = engine::Where(
      engine::Binary(Op::lt, as_long, zero),
      engine::Binary(Op::add, as_long,
                     engine::Scalar(static_cast<double>(size), engine::DType::kInt64)),
      as_long);
  double low = OnHost(engine::Reduce(Op::amin, wrapped)).ItemAsDouble();
  double high = OnHost(engine::Reduce(Op::amax, wrapped)).ItemAsDouble();
  if (low < 0 || high >= static_cast<double>(size)) {
    double bad = low < 0 ? OnHost(engine::Reduce(Op::amin, as_long)).ItemAsDouble()
                         : OnHost(engine::Reduce(Op::amax, as_long)).ItemAsDouble();
    throw py::index_error("index " + std::to_string(static_cast<int64_t>(bad)) +
                          " is out of bounds for dimension " + std::to_string(dim) + " with size " +
                          std::to_string(size));
  }
  return wrapped;
}

// `for_write` keeps every step a view, so that assignment lands in the indexed tensor.
Indexed ApplyIndex(const Tensor& tensor, py::handle index, bool for_write) {
  std::vector<py::handle> items;
  py::tuple tuple_holder;
  if (PyTuple_Check(index.ptr()) != 0 ||
      (PyList_Check(index.ptr()) != 0 && IsTupleOfIndices(index))) {
    tuple_holder = py::tuple(py::reinterpret_borrow<py::object>(index));
    for (py::handle item : tuple_holder) items.push_back(item);
  } else {
    items.push_back(index);
  }
  // How many dims the items consume, to expand an Ellipsis.
  int64_t consumed = 0;
  int ellipses = 0;
  std::vector<Tensor> tensors(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    PyObject* raw = items[i].ptr();
    if (raw == Py_None || PyBool_Check(raw) != 0) continue;
    if (raw == Py_Ellipsis) {
      ++ellipses;
      continue;
    }
    bool integer = PyIndex_Check(raw) != 0 && PyBool_Check(raw) == 0;
    if (TensorFromPython(raw) != nullptr || IsListOrTuple(raw)) {
      tensors[i] = AsIndexTensor(items[i]);
      consumed += tensors[i].dtype() == engine::DType::kBool ? tensors[i].dim() : 1;
    } else if (integer || PySlice_Check(raw) != 0) {
      ++consumed;
    } else {
      BadIndex(items[i]);
    }
  }
  if (ellipses > 1) throw py::index_error("an index can only have a single ellipsis ('...')");
  if (consumed > tensor.dim()) {
    throw py::index_error("too many indices for tensor of dimension " +
                          std::to_string(tensor.dim()));
  }

  Indexed out{tensor, {}};
  int64_t dim = 0;         // in out.view
  int64_t tensor_dim = 0;  // in `tensor`, for messages
  for (size_t i = 0; i < items.size(); ++i) {
    PyObject* raw = items[i].ptr();
    if (raw == Py_None) {
      out.view = out.view.Unsqueeze(dim++);
    } else if (PyBool_Check(raw) != 0) {
      // PyTorch reads a Python bool as a new dim masked by it: x[True] is x[None] and x[False]
      // selects nothing from that new dim.
      out.view = out.view.Unsqueeze(dim);
      out.advanced.push_back({dim, engine::Zeros({raw == Py_True ? 1 : 0}, engine::DType::kInt64)});
      ++dim;
    } else if (raw == Py_Ellipsis) {
      dim += tensor.dim() - consumed;
      tensor_dim += tensor.dim() - consumed;
    } else if (PySlice_Check(raw) != 0) {
      ++tensor_dim;
      Py_ssize_t start = 0;
      Py_ssize_t stop = 0;
      Py_ssize_t step = 0;
      if (PySlice_Unpack(raw, &start, &stop, &step) != 0) throw py::error_already_set();
      if (step <= 0) throw py::value_error("step must be greater than zero");
      Py_ssize_t size = out.view.shape()[dim];
      PySlice_AdjustIndices(size, &start, &stop, step);
      out.view = out.view.Slice(dim++, start, std::max(start, stop), step);
    } else if (tensors[i].defined()) {
      Tensor index = tensors[i];
      tensor_dim += index.dtype() == engine::DType::kBool ? index.dim() : 1;
      if (index.dtype() == engine::DType::kBool) {
        // A mask over k dims: merge them and pick the positions where it is true.
        int64_t k = index.dim();
        for (int64_t d = 0; d < k; ++d) {
          if (index.shape()[d] != out.view.shape()[dim + d]) {
            throw py::index_error("the shape of the mask " + engine::ShapeString(index.shape()) +
                                  " does not match the shape of the indexed tensor " +
                                  engine::ShapeString(out.view.shape()) + " at index " +
                                  std::to_string(dim + d));
          }
        }
        if (k != 1) {
          Shape merged(out.view.shape().begin(), out.view.shape().begin() + dim);
          merged.push_back(index.numel());
          merged.insert(merged.end(), out.view.shape().begin() + dim + k, out.view.shape().end());
          out.view = for_write ? out.view.View(merged) : out.view.Reshape(merged);
        }
        Tensor positions = engine::Arange(0, static_cast<double>(index.numel()), 1,
                                          engine::DType::kInt64, index.device());
        out.advanced.push_back({dim, engine::MaskedSelect(positions, index.Reshape({-1}))});
        ++dim;
      } else if (engine::IsIntegral(index.dtype())) {
        out.advanced.push_back({dim, CheckedIndex(index, out.view.shape()[dim], dim)});
        ++dim;
      } else {
        throw py::index_error("tensors used as indices must be integer or bool tensors, not " +
                              std::string(engine::DTypeName(index.dtype())));
      }
    } else {
      auto value = py::reinterpret_borrow<py::object>(items[i]).cast<int64_t>();
      int64_t size = out.view.shape()[dim];
      if (value < -size || value >= size) {
        throw py::index_error("index " + std::to_string(value) +
                              " is out of bounds for dimension " + std::to_string(tensor_dim) +
                              " with size " + std::to_string(size));
      }
      out.view = out.view.Select(dim, value);
      ++tensor_dim;
    }
  }
  return out;
}

// The shape the advanced indices broadcast to; IndexError when they do not, as in PyTorch.
Shape IndexShape(const Indexed& indexed) {
  Shape broadcast;
  bool fits = true;
  for (const AdvancedIndex& entry : indexed.advanced) {
    const Shape& shape = entry.index.shape();
    const size_t rank = std::max(broadcast.size(), shape.size());
    Shape combined(rank, 1);
    for (size_t i = 0; i < rank; ++i) {
      const int64_t a = i < rank - broadcast.size() ? 1 : broadcast[i - (rank - broadcast.size())];
      const int64_t b = i < rank - shape.size() ? 1 : shape[i - (rank - shape.size())];
      fits = fits && (a == b || a == 1 || b == 1);
      combined[i] = a == 1 ? b : a;
    }
    broadcast = combined;
  }
  if (!fits) {
    std::string shapes;
    for (const AdvancedIndex& entry : indexed.advanced) {
      shapes += (shapes.empty() ? "" : ", ") + engine::ShapeString(entry.index.shape());
    }
    throw py::index_error(
        "shape mismatch: indexing tensors could not be broadcast together with shapes " + shapes);
  }
  return broadcast;
}

// Whether the advanced indices stand in consecutive dims: PyTorch then puts the broadcast
// index dims where they stood, otherwise first.
bool IndicesAdjacent(const Indexed& indexed) {
  for (size_t i = 1; i < indexed.advanced.size(); ++i) {
    if (indexed.advanced[i].dim != indexed.advanced[i - 1].dim + 1) return false;
  }
  return true;
}

// A permutation of the view's dims: the indexed ones first, in index order, then the others.
std::vector<int64_t> IndexedDimsFirst(const Indexed& indexed) {
  std::vector<int64_t> order;
  for (const AdvancedIndex& entry : indexed.advanced) order.push_back(entry.dim);
  for (int64_t d = 0; d < indexed.view.dim(); ++d) {
    if (std::find(order.begin(), order.end(), d) == order.end()) order.push_back(d);
  }
  return order;
}

// Combines several advanced indices into one over their (merged) dims. PyTorch puts the
// broadcast index dims where the indices were when they are adjacent, first otherwise.
Tensor Gather(const Indexed& indexed) {
  const Tensor& view = indexed.view;
  if (indexed.advanced.empty()) return view;
  std::vector<Tensor> indices;
  const Shape broadcast = IndexShape(indexed);
  const bool adjacent = IndicesAdjacent(indexed);
  // Move the indexed dims to the front, then merge them into one.
  Tensor front = view.Permute(IndexedDimsFirst(indexed));
  auto count = static_cast<int64_t>(indexed.advanced.size());
  // Index tensors and lists may be on the CPU for a tensor on a GPU, as in PyTorch.
  Tensor linear = engine::Zeros(broadcast, engine::DType::kInt64, view.device());
  int64_t merged_size = 1;
  for (int64_t i = count - 1; i >= 0; --i) {
    const AdvancedIndex& entry = indexed.advanced[static_cast<size_t>(i)];
    Tensor term =
        engine::Binary(Op::mul, entry.index.To(view.device()).Expand(broadcast),
                       engine::Scalar(static_cast<double>(merged_size), engine::DType::kInt64));
    linear = engine::Binary(Op::add, linear, term);
    merged_size *= view.shape()[entry.dim];
  }
  Shape merged_shape{merged_size};
  merged_shape.insert(merged_shape.end(), front.shape().begin() + count, front.shape().end());
  Tensor merged = front.Reshape(merged_shape);
  Tensor picked = engine::IndexSelect(merged, 0, linear.Reshape({-1}));
  Shape result_shape = broadcast;
  result_shape.insert(result_shape.end(), merged_shape.begin() + 1, merged_shape.end());
  Tensor result = picked.Reshape(result_shape);
  int64_t first = indexed.advanced.front().dim;
  if (!adjacent || first == 0) return result;
  // Move the broadcast dims back to where the indices stood.
  auto index_dims = static_cast<int64_t>(broadcast.size());
  std::vector<int64_t> back;
  for (int64_t d = 0; d < first; ++d) back.push_back(index_dims + d);
  for (int64_t d = 0; d < index_dims; ++d) back.push_back(d);
  for (int64_t d = index_dims + first; d < result.dim(); ++d) back.push_back(d);
  return result.Permute(back).Contiguous();
}

// A value's leading size-1 dims are dropped before it is broadcast into the indexed place, as
// PyTorch does: z[rows] = v.unsqueeze(0) writes v.
Tensor WithoutLeadingOnes(Tensor value, int64_t rank) {
  while (value.dim() > rank && value.shape()[0] == 1) value = value.Squeeze(0);
  return value;
}

// Writes `source` through the advanced indices of `indexed`, one broadcast index position at a
// time, so that every write lands in the indexed tensor itself (later positions win where
// indices repeat, as on PyTorch's CPU). `source` broadcasts to the shape reading the same index
// gives, with Gather's placement of the index dims.
void WriteAdvanced(const Indexed& indexed, const Tensor& source) {
  const Tensor& view = indexed.view;
  const Shape broadcast = IndexShape(indexed);
  const bool adjacent = IndicesAdjacent(indexed);
  Tensor front = view.Permute(IndexedDimsFirst(indexed));  // a view
  const auto count = static_cast<int64_t>(indexed.advanced.size());
  Shape rest(front.shape().begin() + count, front.shape().end());

  // The shape `view[indices]` has: index dims where adjacent indices stood, else first.
  const int64_t first = indexed.advanced.front().dim;
  const bool in_place_of_indices = adjacent && first != 0;
  Shape read_shape;
  if (in_place_of_indices) {
    read_shape.assign(view.shape().begin(), view.shape().begin() + first);
    read_shape.insert(read_shape.end(), broadcast.begin(), broadcast.end());
    read_shape.insert(read_shape.end(), view.shape().begin() + first + count, view.shape().end());
  } else {
    read_shape = broadcast;
    read_shape.insert(read_shape.end(), rest.begin(), rest.end());
  }
  Tensor values =
      WithoutLeadingOnes(source, static_cast<int64_t>(read_shape.size())).Expand(read_shape);
  if (in_place_of_indices) {
    // Bring the index dims to the front, to line up with `front`.
    const auto index_dims = static_cast<int64_t>(broadcast.size());
    std::vector<int64_t> to_front;
    for (int64_t d = 0; d < index_dims; ++d) to_front.push_back(first + d);
    for (int64_t d = 0; d < first; ++d) to_front.push_back(d);
    for (int64_t d = first + index_dims; d < values.dim(); ++d) to_front.push_back(d);
    values = values.Permute(to_front);
  }
  int64_t positions = 1;
  for (int64_t size : broadcast) positions *= size;
  Shape flat_shape{positions};
  flat_shape.insert(flat_shape.end(), rest.begin(), rest.end());
  values = values.Reshape(flat_shape);

  std::vector<Tensor> host_indices;
  for (const AdvancedIndex& entry : indexed.advanced) {
    host_indices.push_back(OnHost(entry.index.Expand(broadcast).Contiguous()));
  }
  for (int64_t position = 0; position < positions; ++position) {
    Tensor target = front;
    for (const Tensor& index : host_indices) {
      target = target.Select(0, index.data_as<int64_t>()[position]);
    }
    target.CopyFrom(values.Select(0, position));
  }
}

}  // namespace

Tensor GetItem(const Tensor& tensor, py::handle index) {
  // The common case first: one int on dim 0.
  if (PyLong_Check(index.ptr()) != 0 && PyBool_Check(index.ptr()) == 0 && tensor.dim() > 0) {
    auto value = py::reinterpret_borrow<py::int_>(index).cast<int64_t>();
    int64_t size = tensor.shape()[0];
    if (value < -size || value >= size) {
      throw py::index_error("index " + std::to_string(value) +
                            " is out of bounds for dimension 0 with size " + std::to_string(size));
    }
    return tensor.Select(0, value);
  }
  return Gather(ApplyIndex(tensor, index, /*for_write=*/false));
}

void SetItem(Tensor& tensor, py::handle index, py::handle value) {
  if (tensor.read_only()) {
    throw py::value_error(
        "cannot assign into a read-only tensor (weights are shared by every "
        "interpreter copy; clone() it to get a writable copy)");
  }
  Tensor source = ValueForWrite(value, tensor.dtype());
  // A source that views the destination's memory is read in full before anything is written.
  if (source.storage().get() == tensor.storage().get()) source = source.Clone();

  // A bool mask with a single value works on any layout: select with where() and write back.
  bool single_mask = false;
  if (PyTuple_Check(index.ptr()) == 0) {
    const Tensor* mask = TensorFromPython(index.ptr());
    single_mask = mask != nullptr && mask->dtype() == engine::DType::kBool && source.numel() == 1 &&
                  mask->dim() <= tensor.dim();
    if (single_mask) {
      for (int64_t d = 0; d < mask->dim(); ++d) {
        single_mask = single_mask && mask->shape()[d] == tensor.shape()[d];
      }
    }
    if (single_mask) {
      Tensor expanded = *mask;
      while (expanded.dim() < tensor.dim()) expanded = expanded.Unsqueeze(expanded.dim());
      tensor.CopyFrom(engine::Where(expanded, source.Reshape({}), tensor));
      return;
    }
  }

  Indexed indexed = ApplyIndex(tensor, index, /*for_write=*/true);
  if (indexed.advanced.empty()) {
    indexed.view.CopyFrom(WithoutLeadingOnes(source, indexed.view.dim()));
    return;
  }
  WriteAdvanced(indexed, source);
}

}  // namespace orochi::copy::bindings

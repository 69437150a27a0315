// Module-level functions of `_orochi_engine`: tensor creation, joining, the neural-network
// primitives behind orochi.nn.functional, safetensors, devices (behind orochi.cuda), and the
// module's initialisation.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "copy_state.h"
#include "orochi/engine/device.h"
#include "orochi/engine/error.h"
#include "orochi/engine/ops.h"
#include "orochi/engine/safetensors.h"
#include "orochi/engine/threads.h"
#include "python_bindings.h"
#include "python_engine.h"

namespace orochi::copy::bindings {
namespace {

// Seeds for orochi.rand/randn when none is given: manual_seed() sets the base, and each call
// takes the next one, so a copy's sequence of tensors is reproducible.
uint64_t g_next_seed = 0x5EED;

std::array<int64_t, 2> Pair(py::handle value, const char* name) {
  if (PyLong_Check(value.ptr()) != 0) {
    auto single = value.cast<int64_t>();
    return {single, single};
  }
  Shape pair = ParseShape(value, name);
  if (pair.size() == 1) return {pair[0], pair[0]};
  if (pair.size() != 2) throw py::value_error(std::string(name) + " must be an int or a pair");
  return {pair[0], pair[1]};
}

int64_t Single(py::handle value, const char* name) {
  if (PyLong_Check(value.ptr()) != 0) return value.cast<int64_t>();
  Shape single = ParseShape(value, name);
  if (single.size() != 1) throw py::value_error(std::string(name) + " must be an int");
  return single[0];
}

std::optional<Tensor> MaybeTensor(py::handle object) {
  if (object.is_none()) return std::nullopt;
  const Tensor* tensor = TensorFromPython(object.ptr());
  if (tensor == nullptr) {
    throw py::type_error("expected a tensor or None, got " +
                         std::string(Py_TYPE(object.ptr())->tp_name));
  }
  return *tensor;
}

DType DTypeOr(py::handle dtype, DType fallback) {
  return ParseOptionalDType(dtype).value_or(fallback);
}

// The `device=` argument of a creation function; the CPU when None.
Device DeviceArgument(py::handle device) {
  return device.is_none() ? Device{} : ParseDevice(device);
}

// Conv padding: an int, a pair, "valid" or "same" (stride 1; extra padding goes on the end
// when the total is odd, as in PyTorch).
Tensor ConvNd(int spatial, const Tensor& input, const Tensor& weight,
              const std::optional<Tensor>& bias, py::handle stride, py::handle padding,
              py::handle dilation, int64_t groups, const std::optional<Tensor>& residual = {},
              py::handle activation = py::none()) {
  const char* name = spatial == 2 ? "conv2d" : "conv1d";
  if (input.dim() != spatial + 1 && input.dim() != spatial + 2) {
    throw py::value_error(std::string(name) + ": expected a " + std::to_string(spatial + 2) +
                          "-D (batched) or " + std::to_string(spatial + 1) +
                          "-D input, got shape " + engine::ShapeString(input.shape()));
  }
  if (weight.dim() != spatial + 2) {
    throw py::value_error(std::string(name) + ": expected a " + std::to_string(spatial + 2) +
                          "-D weight, got shape " + engine::ShapeString(weight.shape()));
  }
  engine::Conv2dOptions options;
  options.groups = groups;
  std::array<int64_t, 2> strides =
      spatial == 2 ? Pair(stride, "stride") : std::array<int64_t, 2>{1, Single(stride, "stride")};
  std::array<int64_t, 2> dilations = spatial == 2
                                         ? Pair(dilation, "dilation")
                                         : std::array<int64_t, 2>{1, Single(dilation, "dilation")};
  Tensor padded = input;
  std::array<int64_t, 2> pads{0, 0};
  if (PyUnicode_Check(padding.ptr()) != 0) {
    auto mode = padding.cast<std::string>();
    if (mode == "same") {
      if (strides[0] != 1 || strides[1] != 1) {
        throw py::value_error("padding='same' is not supported for strided convolutions");
      }
      std::vector<int64_t> explicit_pad;
      for (int i = spatial - 1; i >= 0; --i) {
        int64_t kernel = weight.shape()[weight.dim() - spatial + i];
        int64_t total = dilations[2 - spatial + i] * (kernel - 1);
        explicit_pad.push_back(total / 2);
        explicit_pad.push_back(total - total / 2);
      }
      padded = engine::Pad(input, explicit_pad, 0);
    } else if (mode != "valid") {
      throw py::value_error("padding must be an int, a pair, 'valid' or 'same', got '" + mode +
                            "'");
    }
  } else {
    pads = spatial == 2 ? Pair(padding, "padding")
                        : std::array<int64_t, 2>{0, Single(padding, "padding")};
  }
  options.stride = strides;
  options.dilation = dilations;
  options.padding = pads;
  options.residual = residual;
  if (!activation.is_none()) {
    const auto function = py::str(activation).cast<std::string>();
    if (PyUnicode_Check(activation.ptr()) == 0 || function != "relu") {
      throw py::value_error(std::string(name) + ": activation must be None or 'relu', got " +
                            py::repr(activation).cast<std::string>());
    }
    options.relu = true;
  }
  int64_t work = weight.numel() * input.numel() /
                 std::max<int64_t>(1, input.shape()[input.dim() - spatial - 1]);
  auto run = [&] {
    if (spatial == 2) return engine::Conv2d(padded, weight, bias, options);
    return engine::Conv1d(padded, weight, bias, strides[1], pads[1], dilations[1], groups);
  };
  if (work < (int64_t{1} << 16)) return run();
  py::gil_scoped_release release;
  return run();
}

std::map<std::string, Tensor> TensorDict(const py::dict& tensors) {
  std::map<std::string, Tensor> result;
  for (auto [key, value] : tensors) {
    const Tensor* tensor = TensorFromPython(value.ptr());
    if (tensor == nullptr || PyUnicode_Check(key.ptr()) == 0) {
      throw py::type_error("save_safetensors expects a dict of str to orochi.Tensor");
    }
    result.emplace(key.cast<std::string>(), *tensor);
  }
  return result;
}

[[noreturn]] void ThrowStatus(const Status& status) {
  switch (status.code()) {
    case StatusCode::kNotFound:
      PyErr_SetString(PyExc_FileNotFoundError, status.message().c_str());
      break;
    case StatusCode::kInvalidArgument:
      PyErr_SetString(PyExc_ValueError, status.message().c_str());
      break;
    default:
      PyErr_SetString(PyExc_OSError, status.message().c_str());
  }
  throw py::error_already_set();
}

py::dict SafetensorsToPython(const engine::SafetensorsContents& contents) {
  py::dict result;
  for (const auto& [name, tensor] : contents.tensors) result[py::str(name)] = py::cast(tensor);
  return result;
}

void BindCreation(py::module_& module) {
  module.def(
      "tensor",
      [](py::handle data, py::handle dtype, py::handle device, bool /*requires_grad*/) {
        return TensorFromData(data, ParseOptionalDType(dtype)).To(DeviceArgument(device));
      },
      py::arg("data"), py::kw_only(), py::arg("dtype") = py::none(), py::arg("device") = py::none(),
      py::arg("requires_grad") = false);
  module.def(
      "as_tensor",
      [](py::handle data, py::handle dtype, py::handle device) {
        std::optional<DType> as = ParseOptionalDType(dtype);
        if (const Tensor* tensor = TensorFromPython(data.ptr())) {
          Tensor converted = as ? tensor->To(*as) : *tensor;
          return device.is_none() ? converted : converted.To(ParseDevice(device));
        }
        const Device target = DeviceArgument(device);
        if (PyObject_CheckBuffer(data.ptr()) != 0) return TensorFromBuffer(data, as).To(target);
        return TensorFromData(data, as).To(target);
      },
      py::arg("data"), py::arg("dtype") = py::none(), py::arg("device") = py::none());
  module.def("frombuffer", &TensorFromRawBuffer, py::arg("buffer"), py::kw_only(), py::arg("dtype"),
             py::arg("count") = -1, py::arg("offset") = 0);
  auto filled = [](double value) {
    return [value](const py::args& sizes, py::handle dtype, py::handle device) {
      return engine::Full(ParseSizes(sizes, "size"), value, DTypeOr(dtype, DType::kFloat32),
                          DeviceArgument(device));
    };
  };
  for (auto [name, value] :
       {std::pair{"zeros", 0.0}, std::pair{"ones", 1.0}, std::pair{"empty", 0.0}}) {
    module.def(name, filled(value), py::kw_only(), py::arg("dtype") = py::none(),
               py::arg("device") = py::none());
  }
  module.def(
      "full",
      [](py::handle size, py::handle fill_value, py::handle dtype, py::handle device) {
        const Device on = DeviceArgument(device);
        DType fallback = PyBool_Check(fill_value.ptr())   ? DType::kBool
                         : PyLong_Check(fill_value.ptr()) ? DType::kInt64
                                                          : DType::kFloat32;
        const DType target = DTypeOr(dtype, fallback);
        Tensor output = Tensor::Empty(ParseShape(size, "full"), target);
        output.CopyFrom(ValueForWrite(fill_value, target));
        return output.To(on);
      },
      py::arg("size"), py::arg("fill_value"), py::kw_only(), py::arg("dtype") = py::none(),
      py::arg("device") = py::none());
  auto filled_like = [](double value) {
    return [value](const Tensor& like, py::handle dtype) {
      return engine::Full(like.shape(), value, DTypeOr(dtype, like.dtype()), like.device());
    };
  };
  for (auto [name, value] :
       {std::pair{"zeros_like", 0.0}, std::pair{"ones_like", 1.0}, std::pair{"empty_like", 0.0}}) {
    module.def(name, filled_like(value), py::arg("input"), py::kw_only(),
               py::arg("dtype") = py::none());
  }
  module.def(
      "full_like",
      [](const Tensor& like, py::handle value, py::handle dtype) {
        const DType target = DTypeOr(dtype, like.dtype());
        Tensor output = Tensor::Empty(like.shape(), target);
        output.CopyFrom(ValueForWrite(value, target));
        return output.To(like.device());
      },
      py::arg("input"), py::arg("fill_value"), py::kw_only(), py::arg("dtype") = py::none());
  module.def(
      "arange",
      [](py::handle start, py::handle end, py::handle step, py::handle dtype, py::handle device) {
        const Device on = DeviceArgument(device);
        bool integral = true;
        for (py::handle bound : {start, end, step}) {
          integral = integral && (bound.is_none() || PyLong_Check(bound.ptr()) != 0);
        }
        const DType target = DTypeOr(dtype, integral ? DType::kInt64 : DType::kFloat32);
        if (integral && engine::IsIntegral(target)) {
          return engine::IntegerArange(end.is_none() ? 0 : start.cast<int64_t>(),
                                       end.is_none() ? start.cast<int64_t>() : end.cast<int64_t>(),
                                       step.cast<int64_t>(), target, on);
        }
        double first = end.is_none() ? 0 : start.cast<double>();
        double last = end.is_none() ? start.cast<double>() : end.cast<double>();
        return engine::Arange(first, last, step.cast<double>(), target, on);
      },
      py::arg("start"), py::arg("end") = py::none(), py::arg("step") = 1, py::kw_only(),
      py::arg("dtype") = py::none(), py::arg("device") = py::none());
  module.def(
      "eye",
      [](int64_t rows, std::optional<int64_t> columns, py::handle dtype, py::handle device) {
        return engine::Eye(rows, columns, DTypeOr(dtype, DType::kFloat32), DeviceArgument(device));
      },
      py::arg("n"), py::arg("m") = py::none(), py::kw_only(), py::arg("dtype") = py::none(),
      py::arg("device") = py::none());
  module.def(
      "linspace",
      [](double start, double end, int64_t steps, py::handle dtype, py::handle device) {
        return engine::Linspace(start, end, steps, DTypeOr(dtype, DType::kFloat32),
                                DeviceArgument(device));
      },
      py::arg("start"), py::arg("end"), py::arg("steps"), py::kw_only(),
      py::arg("dtype") = py::none(), py::arg("device") = py::none());
  for (auto [name, normal] : {std::pair{"rand", false}, std::pair{"randn", true}}) {
    module.def(
        name,
        [normal = normal](const py::args& sizes, py::handle seed, py::handle dtype,
                          py::handle device) {
          uint64_t chosen = seed.is_none() ? g_next_seed++ : seed.cast<uint64_t>();
          Shape shape = ParseSizes(sizes, "size");
          DType as = DTypeOr(dtype, DType::kFloat32);
          Device on = DeviceArgument(device);
          return normal ? engine::Randn(shape, chosen, as, on)
                        : engine::Rand(shape, chosen, as, on);
        },
        py::kw_only(), py::arg("seed") = py::none(), py::arg("dtype") = py::none(),
        py::arg("device") = py::none());
  }
  module.def(
      "manual_seed", [](uint64_t seed) { g_next_seed = seed; }, py::arg("seed"));
}

void BindJoining(py::module_& module) {
  auto cat = [](const std::vector<Tensor>& tensors, int64_t dim) {
    return engine::Cat(tensors, dim);
  };
  module.def("cat", cat, py::arg("tensors"), py::arg("dim") = 0);
  module.def("concat", cat, py::arg("tensors"), py::arg("dim") = 0);
  module.def(
      "stack",
      [](const std::vector<Tensor>& tensors, int64_t dim) { return engine::Stack(tensors, dim); },
      py::arg("tensors"), py::arg("dim") = 0);
  module.def(
      "where",
      [](const Tensor& condition, py::handle input, py::handle other) {
        const Tensor* like = TensorFromPython(input.ptr());
        if (like == nullptr) like = TensorFromPython(other.ptr());
        const Tensor& reference = like != nullptr ? *like : condition;
        if (like != nullptr) {
          RequireFitsWhereKept(input, like->dtype());
          RequireFitsWhereKept(other, like->dtype());
        }
        Operand a(input, reference);
        Operand b(other, reference);
        return engine::Where(condition, a.get(), b.get());
      },
      py::arg("condition"), py::arg("input"), py::arg("other"));
  module.def("result_type", [](py::handle a, py::handle b) {
    const Tensor* like = TensorFromPython(a.ptr());
    if (like == nullptr) like = TensorFromPython(b.ptr());
    if (like == nullptr) throw py::type_error("result_type needs at least one tensor");
    return DTypeObject(engine::ResultType(Operand(a, *like).get(), Operand(b, *like).get()));
  });
  module.def("promote_types", [](py::handle a, py::handle b) {
    return DTypeObject(engine::PromoteTypes(ParseDType(a), ParseDType(b)));
  });
  module.def("is_tensor",
             [](py::handle object) { return TensorFromPython(object.ptr()) != nullptr; });
  // Per calling thread, for the rest of the call into the copy (a request, or the script under
  // `orochi python`), under the server's pool: a model cannot take cores from the others.
  module.def(
      "set_num_threads",
      [](int threads) {
        OROCHI_CHECK_ARG(threads >= 1, "set_num_threads needs at least 1 thread, got " << threads);
        engine::SetCallerIntraOpLimit(threads);
      },
      py::arg("threads"));
  module.def("get_num_threads", &engine::CallerIntraOpThreads);
}

void BindNeuralNetwork(py::module_& module) {
  module.def(
      "linear",
      [](const Tensor& input, const Tensor& weight, py::handle bias) {
        std::optional<Tensor> b = MaybeTensor(bias);
        int64_t work = input.numel() * (weight.dim() > 0 ? weight.shape()[0] : 1);
        if (work < (int64_t{1} << 16)) return engine::Linear(input, weight, b);
        py::gil_scoped_release release;
        return engine::Linear(input, weight, b);
      },
      py::arg("input"), py::arg("weight"), py::arg("bias") = py::none());
  module.def(
      "conv1d",
      [](const Tensor& input, const Tensor& weight, py::handle bias, py::handle stride,
         py::handle padding, py::handle dilation, int64_t groups) {
        return ConvNd(1, input, weight, MaybeTensor(bias), stride, padding, dilation, groups);
      },
      py::arg("input"), py::arg("weight"), py::arg("bias") = py::none(), py::arg("stride") = 1,
      py::arg("padding") = 0, py::arg("dilation") = 1, py::arg("groups") = 1);
  // conv2d with Orochi's keyword-only epilogue: relu?(conv2d(...) + residual?), fused.
  module.def(
      "conv2d",
      [](const Tensor& input, const Tensor& weight, py::handle bias, py::handle stride,
         py::handle padding, py::handle dilation, int64_t groups, py::handle residual,
         py::handle activation) {
        return ConvNd(2, input, weight, MaybeTensor(bias), stride, padding, dilation, groups,
                      MaybeTensor(residual), activation);
      },
      py::arg("input"), py::arg("weight"), py::arg("bias") = py::none(), py::arg("stride") = 1,
      py::arg("padding") = 0, py::arg("dilation") = 1, py::arg("groups") = 1, py::kw_only(),
      py::arg("residual") = py::none(), py::arg("activation") = py::none());
  // orochi.nn.utils.fusion's fold: read-only results, shared by every copy that folds the same
  // batch norm into the same loaded weight (engine::FoldBatchNorm).
  module.def(
      "_fold_batch_norm",
      [](const Tensor& conv_weight, py::handle conv_bias, const Tensor& running_mean,
         const Tensor& running_var, double eps, py::handle weight, py::handle bias) {
        engine::FoldedConv folded =
            engine::FoldBatchNorm(conv_weight, MaybeTensor(conv_bias), running_mean, running_var,
                                  eps, MaybeTensor(weight), MaybeTensor(bias));
        return py::make_tuple(folded.weight, folded.bias);
      },
      py::arg("conv_weight"), py::arg("conv_bias"), py::arg("running_mean"), py::arg("running_var"),
      py::arg("eps"), py::arg("weight"), py::arg("bias"));
  for (auto [name, is_max] : {std::pair{"max_pool2d", true}, std::pair{"avg_pool2d", false}}) {
    bool max = is_max;
    module.def(
        name,
        [max](const Tensor& input, py::handle kernel_size, py::handle stride, py::handle padding) {
          std::optional<std::array<int64_t, 2>> strides;
          if (!stride.is_none()) strides = Pair(stride, "stride");
          auto kernel = Pair(kernel_size, "kernel_size");
          auto pads = Pair(padding, "padding");
          return max ? engine::MaxPool2d(input, kernel, strides, pads)
                     : engine::AvgPool2d(input, kernel, strides, pads);
        },
        py::arg("input"), py::arg("kernel_size"), py::arg("stride") = py::none(),
        py::arg("padding") = 0);
  }
  module.def(
      "adaptive_avg_pool2d",
      [](const Tensor& input, py::handle output_size) {
        if (input.dim() != 3 && input.dim() != 4) {
          throw py::value_error("adaptive_avg_pool2d: expected a 3-D or 4-D input, got shape " +
                                engine::ShapeString(input.shape()));
        }
        std::array<int64_t, 2> size{};
        if (PyLong_Check(output_size.ptr()) != 0) {
          size = Pair(output_size, "output_size");
        } else {
          // None keeps the input's size along that dim, as in PyTorch.
          auto items = py::reinterpret_borrow<py::sequence>(output_size);
          if (items.size() != 2) throw py::value_error("output_size must be an int or a pair");
          for (size_t i = 0; i < 2; ++i) {
            size[i] = items[i].is_none() ? input.shape()[input.dim() - 2 + static_cast<int64_t>(i)]
                                         : items[i].cast<int64_t>();
          }
        }
        return engine::AdaptiveAvgPool2d(input, size);
      },
      py::arg("input"), py::arg("output_size"));
  module.def(
      "batch_norm",
      [](const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
         py::handle weight, py::handle bias, double eps) {
        return engine::BatchNorm(input, running_mean, running_var, MaybeTensor(weight),
                                 MaybeTensor(bias), eps);
      },
      py::arg("input"), py::arg("running_mean"), py::arg("running_var"),
      py::arg("weight") = py::none(), py::arg("bias") = py::none(), py::arg("eps") = 1e-5);
  module.def(
      "layer_norm",
      [](const Tensor& input, py::handle normalized_shape, py::handle weight, py::handle bias,
         double eps) {
        return engine::LayerNorm(input, ParseShape(normalized_shape, "normalized_shape"),
                                 MaybeTensor(weight), MaybeTensor(bias), eps);
      },
      py::arg("input"), py::arg("normalized_shape"), py::arg("weight") = py::none(),
      py::arg("bias") = py::none(), py::arg("eps") = 1e-5);
  module.def(
      "rms_norm",
      [](const Tensor& input, py::handle normalized_shape, py::handle weight, double eps) {
        return engine::RmsNorm(input, ParseShape(normalized_shape, "normalized_shape"),
                               MaybeTensor(weight), eps);
      },
      py::arg("input"), py::arg("normalized_shape"), py::arg("weight") = py::none(),
      py::arg("eps") = 1e-6);
  module.def(
      "embedding",
      [](const Tensor& input, const Tensor& weight) { return engine::Embedding(input, weight); },
      py::arg("input"), py::arg("weight"));
  module.def(
      "gelu",
      [](const Tensor& input, const std::string& approximate) {
        if (approximate == "none") return engine::Unary(Op::gelu, input);
        if (approximate == "tanh") return engine::Unary(Op::gelu_tanh, input);
        throw py::value_error("gelu: approximate must be 'none' or 'tanh', got '" + approximate +
                              "'");
      },
      py::arg("input"), py::arg("approximate") = "none");
  module.def(
      "silu", [](const Tensor& input) { return engine::Unary(Op::silu, input); }, py::arg("input"));
  module.def(
      "scaled_dot_product_attention",
      [](const Tensor& query, const Tensor& key, const Tensor& value, py::handle attn_mask,
         double dropout_p, bool is_causal, std::optional<double> scale) {
        if (dropout_p != 0) {
          throw py::value_error(
              "scaled_dot_product_attention: dropout_p must be 0 "
              "(Orochi runs inference only)");
        }
        if (key.dim() < 2 || query.dim() < 2 || value.dim() < 2) {
          throw py::value_error(
              "scaled_dot_product_attention: query, key and value need at least 2 dims "
              "[..., L, E]");
        }
        std::optional<Tensor> mask = MaybeTensor(attn_mask);
        int64_t work = query.numel() * key.shape()[key.dim() - 2];
        if (work < (int64_t{1} << 16)) {
          return engine::ScaledDotProductAttention(query, key, value, mask, is_causal, scale);
        }
        py::gil_scoped_release release;
        return engine::ScaledDotProductAttention(query, key, value, mask, is_causal, scale);
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::arg("attn_mask") = py::none(),
      py::arg("dropout_p") = 0.0, py::arg("is_causal") = false, py::kw_only(),
      py::arg("scale") = py::none());
  module.def(
      "pad",
      [](const Tensor& input, const std::vector<int64_t>& pad, const std::string& mode,
         double value) {
        if (mode != "constant") {
          throw py::value_error("pad: only mode='constant' is supported, got '" + mode + "'");
        }
        return engine::Pad(input, pad, value);
      },
      py::arg("input"), py::arg("pad"), py::arg("mode") = "constant", py::arg("value") = 0.0);
}

void BindSafetensors(py::module_& module) {
  module.def(
      "load_safetensors",
      [](py::handle source) {
        if (PyBytes_Check(source.ptr()) != 0 || PyByteArray_Check(source.ptr()) != 0 ||
            PyMemoryView_Check(source.ptr()) != 0) {
          // An image in memory: copied once into engine memory that outlives this copy.
          Py_buffer view;
          if (PyObject_GetBuffer(source.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
            throw py::error_already_set();
          }
          const auto size = static_cast<size_t>(view.len);
          engine::StoragePtr storage = engine::Storage::Allocate(size);
          if (size > 0) std::memcpy(storage->mutable_data(), view.buf, size);
          PyBuffer_Release(&view);
          storage->MarkReadOnly();
          Result<engine::SafetensorsContents> contents = engine::ParseSafetensors(storage);
          if (!contents.ok()) ThrowStatus(contents.status());
          return SafetensorsToPython(*contents);
        }
        auto path = py::str(py::module_::import("os").attr("fspath")(source)).cast<std::string>();
        Result<engine::SafetensorsContents> contents = [&] {
          py::gil_scoped_release release;
          return engine::LoadSafetensors(path);
        }();
        if (!contents.ok()) ThrowStatus(contents.status());
        return SafetensorsToPython(*contents);
      },
      py::arg("source"));
  module.def(
      "save_safetensors",
      [](const py::dict& tensors, py::handle path, py::handle metadata) {
        std::map<std::string, std::string> entries;
        if (!metadata.is_none()) {
          for (auto [key, value] : py::reinterpret_borrow<py::dict>(metadata)) {
            entries.emplace(key.cast<std::string>(), value.cast<std::string>());
          }
        }
        auto target = py::str(py::module_::import("os").attr("fspath")(path)).cast<std::string>();
        Status status = engine::SaveSafetensors(target, TensorDict(tensors), entries);
        if (!status.ok()) ThrowStatus(status);
      },
      py::arg("tensors"), py::arg("path"), py::arg("metadata") = py::none());
}

// pybind11 fixes the signature (a by-value exception_ptr).
void TranslateEngineErrors(
    std::exception_ptr error) {  // NOLINT(performance-unnecessary-value-param)
  try {
    if (error) std::rethrow_exception(error);
  } catch (const engine::Error& engine_error) {
    PyObject* type = PyExc_RuntimeError;
    switch (engine_error.status().code()) {
      case StatusCode::kUnimplemented:
        type = PyExc_NotImplementedError;
        break;
      case StatusCode::kResourceExhausted:
        type = PyExc_MemoryError;
        break;
      case StatusCode::kOutOfRange:
        type = PyExc_IndexError;
        break;
      default:
        break;
    }
    PyErr_SetString(type, engine_error.status().message().c_str());
  }
}

// The engine's device API for orochi.cuda (the Python module keeps PyTorch's names).
void BindDevices(py::module_& module) {
  module.def("_cuda_device_count", [] { return engine::DeviceCount(engine::DeviceType::kCuda); });
  // Python keeps PyTorch-like strings: "" when the device can be used, else why not.
  module.def("_cuda_unavailable_reason",
             [] { return engine::DeviceTypeStatus(engine::DeviceType::kCuda).message(); });
  module.def(
      "_device_problem",
      [](const std::string& name) {
        Device device;
        if (!engine::ParseDevice(name, &device)) {
          throw py::value_error("unknown device '" + name +
                                "' (expected 'cpu', 'cuda' or 'cuda:N')");
        }
        return engine::DeviceStatus(device).message();
      },
      py::arg("name"));
  module.def(
      "_synchronize",
      [](py::handle device) {
        Device target = ParseDevice(device);
        py::gil_scoped_release unlocked;  // other threads of this copy may run meanwhile
        engine::Synchronize(target);
      },
      py::arg("device"));
  module.def(
      "_memory_stats",
      [](py::handle device) {
        engine::DeviceMemoryStats stats = engine::MemoryStats(ParseDevice(device));
        py::dict result;
        result["allocated_bytes"] = stats.allocated_bytes;
        result["reserved_bytes"] = stats.allocated_bytes + stats.cached_bytes;
        result["cached_bytes"] = stats.cached_bytes;
        result["peak_allocated_bytes"] = stats.peak_allocated_bytes;
        result["total_bytes"] = stats.total_bytes;
        result["allocations"] = stats.allocations;
        result["cache_hits"] = stats.cache_hits;
        return result;
      },
      py::arg("device"));
  module.def(
      "_empty_cache", [](py::handle device) { engine::EmptyCache(ParseDevice(device)); },
      py::arg("device"));
  module.def("_set_allow_tf32", &engine::SetAllowTf32, py::arg("allow"));
  module.def("_allow_tf32", &engine::AllowTf32);
}

}  // namespace

void BindFunctions(py::module_& module) {
  BindCreation(module);
  BindDevices(module);
  BindJoining(module);
  BindNeuralNetwork(module);
  BindSafetensors(module);
}

}  // namespace orochi::copy::bindings

namespace orochi::copy {

PyObject* InitEngineModule() {
  namespace py = pybind11;
  static PyModuleDef definition{};
  try {
    py::detail::get_internals();
    py::module_ module = py::module_::create_extension_module(
        "_orochi_engine", "The shared tensor engine, bound into this interpreter copy.",
        &definition);
    py::register_exception_translator(&bindings::TranslateEngineErrors);
    bindings::BindValueTypes(module);
    bindings::BindTensor(module);
    bindings::BindFunctions(module);
    return module.release().ptr();
  } catch (py::error_already_set& error) {
    error.restore();
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_ImportError, error.what());
  }
  return nullptr;
}

void ReleaseEngineBindings() {
  namespace detail = pybind11::detail;
  detail::internals** internals = detail::get_internals_pp();
  if (internals == nullptr || *internals == nullptr) return;
  // pybind11 leaks this key on purpose (extension modules are never unloaded); copies are.
  auto life_support = (*internals)->shared_data.find("_life_support");
  if (life_support != (*internals)->shared_data.end()) {
    auto* data = static_cast<detail::local_internals::shared_loader_life_support_data*>(
        life_support->second);
    PyThread_tss_free(data->loader_life_support_tls_key);
    delete data;
  }
  delete *internals;  // its destructor frees the thread-state key
  *internals = nullptr;
}

}  // namespace orochi::copy

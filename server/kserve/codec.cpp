#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "orochi/base/check.h"
#include "orochi/engine/dtype.h"
#include "orochi/engine/error.h"
#include "orochi/engine/tensor.h"
#include "orochi/server/kserve_codec.h"
#include "request_json.h"
#include "shared_memory.h"
#include "unsupported_fields.h"

namespace orochi::server::kserve {
namespace {

using interpreters::BytesTensor;
using interpreters::NamedTensor;
using packaging::DataType;
using packaging::Manifest;
using packaging::TensorSpec;

Status Bad(const std::string& message) { return InvalidArgument(message); }

// A tensor of `size` bytes that `fill` writes into its memory. `source` is where the bytes come
// from (the parameter that gave their size, or gRPC's raw contents), for the error when `size`
// is not what the shape needs.
Result<engine::Tensor> TensorFilledBy(const TensorSpec& spec, const engine::Shape& shape,
                                      uint64_t size, std::string_view source,
                                      const std::function<Status(std::byte*)>& fill) {
  const engine::DType dtype = *packaging::EngineDType(spec.datatype);
  const auto expected = static_cast<size_t>(engine::NumElements(shape)) * engine::ItemSize(dtype);
  if (size != expected) {
    return Bad("input '" + spec.name + "': " + std::string(source) + " is " + std::to_string(size) +
               " bytes, but shape " + engine::ShapeString(shape) + " of " +
               std::string(DataTypeName(spec.datatype)) + " needs " + std::to_string(expected));
  }
  engine::Tensor tensor = engine::Tensor::Empty(shape, dtype);
  if (expected > 0) OROCHI_RETURN_IF_ERROR(fill(static_cast<std::byte*>(tensor.mutable_data())));
  if (dtype == engine::DType::kBool) {
    auto* flags = tensor.mutable_data_as<uint8_t>();
    for (size_t i = 0; i < expected; ++i) flags[i] = flags[i] != 0 ? 1 : 0;
  }
  return tensor;
}

Result<engine::Tensor> TensorFromBinary(const TensorSpec& spec, const engine::Shape& shape,
                                        std::string_view bytes, std::string_view source) {
  return TensorFilledBy(spec, shape, bytes.size(), source, [bytes](std::byte* to) {
    std::memcpy(to, bytes.data(), bytes.size());
    return Status::Ok();
  });
}

Result<BytesTensor> BytesFromBinary(const TensorSpec& spec, const engine::Shape& shape,
                                    std::string_view bytes) {
  BytesTensor tensor{shape, {}};
  // Elements past the shape's are only counted, for the error: as strings, 4 bytes of body
  // each would take 32 bytes of memory before the count was checked.
  const auto needed = static_cast<size_t>(engine::NumElements(shape));
  size_t elements = 0;
  tensor.items.reserve(std::min(needed, bytes.size() / 4));  // each takes 4 bytes at least
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 4) {
      return Bad("input '" + spec.name + "': truncated BYTES element length");
    }
    uint32_t length = 0;
    std::memcpy(&length, bytes.data() + at, 4);
    at += 4;
    if (bytes.size() - at < length) {
      return Bad("input '" + spec.name + "': a BYTES element runs past its data");
    }
    if (++elements <= needed) tensor.items.emplace_back(bytes.substr(at, length));
    at += length;
  }
  if (elements != needed) {
    return Bad("input '" + spec.name + "' has " + std::to_string(elements) +
               " BYTES elements, but shape " + engine::ShapeString(shape) + " needs " +
               std::to_string(engine::NumElements(shape)));
  }
  return tensor;
}

Status CheckShape(const Manifest& manifest, const TensorSpec& spec, const engine::Shape& shape) {
  std::vector<int64_t> expected = spec.shape;
  if (manifest.max_batch_size > 0) expected.insert(expected.begin(), -1);
  bool matches = expected.size() == shape.size();
  for (size_t i = 0; matches && i < shape.size(); ++i) {
    matches = shape[i] >= 0 && (expected[i] == -1 || expected[i] == shape[i]);
  }
  if (!matches) {
    return Bad("input '" + spec.name + "' has shape " + engine::ShapeString(shape) +
               ", but the model expects " + engine::ShapeString(expected) + " (-1 is any size)");
  }
  if (manifest.max_batch_size > 0 && (shape[0] < 1 || shape[0] > manifest.max_batch_size)) {
    return Bad("input '" + spec.name + "' has a batch of " + std::to_string(shape[0]) +
               "; the model takes 1 to " + std::to_string(manifest.max_batch_size));
  }
  return Status::Ok();
}

// A value as JSON. Floats are written in the fewest digits that read back as the same value of
// their own type (0.1 for FP32's 0.1, not 0.10000000149011612; FP16's 0.1 too, not
// 0.099975586), with ".0" on whole numbers so that they stay floats to a JSON reader. NaN and
// infinities are not JSON; they are written as NaN, Infinity and -Infinity, as Triton and Python's
// json module write and read them.
template <typename T>
void AppendNumber(T value, std::string* out) {
  char text[64];
  if constexpr (std::is_same_v<T, bool>) {
    *out += value ? "true" : "false";
  } else if constexpr (std::is_integral_v<T>) {
    *out += std::string_view(text, std::to_chars(text, text + sizeof(text), value).ptr);
  } else {
    using Written = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const auto number = engine::Convert<Written>(value);
    if (std::isnan(number)) {
      *out += "NaN";
    } else if (std::isinf(number)) {
      *out += number > 0 ? "Infinity" : "-Infinity";
    } else {
      std::string_view written;
      if constexpr (std::is_same_v<T, Written>) {
        written = {text, std::to_chars(text, text + sizeof(text), number).ptr};
      } else {
        // FP16 and BF16 have no shortest form in the library: the fewest significant digits
        // that read back (through double, as requests are read) as this value, written as the
        // float they make (65504 is 65500.0, as numpy writes it). Float's 9 digits always do.
        float shortest = number;
        for (int digits = 1; digits <= 9; ++digits) {
          const char* end =
              std::to_chars(text, text + sizeof(text), number, std::chars_format::general, digits)
                  .ptr;
          double back = 0;
          std::from_chars(text, end, back);
          if (engine::Convert<T>(back).bits == value.bits) {
            shortest = static_cast<float>(back);
            break;
          }
        }
        written = {text, std::to_chars(text, text + sizeof(text), shortest).ptr};
      }
      *out += written;
      if (written.find_first_of(".e") == std::string_view::npos) *out += ".0";
    }
  }
}

// The request's parameters that are the model's: all but those the server reads. The document
// keeps an object's keys sorted, as RequestParameters wants them.
Result<interpreters::RequestParameters> ModelParameters(const Json& parameters) {
  interpreters::RequestParameters read;
  for (const auto& [name, value] : parameters.items()) {
    if (name == "timeout" || name == "binary_data_output" ||
        InferRequestBuilder::IsSequenceParameter(name)) {
      continue;
    }
    switch (value.type()) {
      case Json::value_t::boolean:
        read.emplace_back(name, value.get<bool>());
        break;
      case Json::value_t::number_integer:
        read.emplace_back(name, value.get<int64_t>());
        break;
      case Json::value_t::number_unsigned:
        if (value.get<uint64_t>() <= uint64_t{INT64_MAX}) {
          read.emplace_back(name, static_cast<int64_t>(value.get<uint64_t>()));
        } else {
          read.emplace_back(name, value.get<double>());
        }
        break;
      case Json::value_t::number_float:
        read.emplace_back(name, value.get<double>());
        break;
      case Json::value_t::string:
        read.emplace_back(name, value.get<std::string>());
        break;
      default:
        return Bad("parameter " + Quoted(name) + " must be a string, a number or a boolean, not " +
                   std::string(value.type_name()) + " (KServe v2 parameters)");
    }
  }
  return read;
}

// A parameter's JSON value for InferRequestBuilder::SequenceParameter.
InferRequestBuilder::WireValue WireValueOf(const Json& value) {
  switch (value.type()) {
    case Json::value_t::boolean:
      return value.get<bool>();
    case Json::value_t::number_integer:
      return value.get<int64_t>();
    case Json::value_t::number_unsigned:
      return value.get<uint64_t>();
    case Json::value_t::number_float:
      return value.get<double>();
    case Json::value_t::string:
      return value.get<std::string>();
    default:
      return std::monostate();
  }
}

const TensorSpec& OutputSpec(const Manifest& manifest, const std::string& name) {
  auto spec = std::find_if(manifest.outputs.begin(), manifest.outputs.end(),
                           [&](const TensorSpec& candidate) { return candidate.name == name; });
  OROCHI_INTERNAL_ASSERT(spec != manifest.outputs.end(), "an output the manifest does not declare");
  return *spec;
}

// Triton's classification extension: along the last dim (the classes), the `count` largest
// scores as "score:index", or "score:index:label" where `labels` names the class; largest
// first. Ties go to the lower index, NaN ranks above every number (as torch.topk ranks it),
// and a count past the classes gives them all.
BytesTensor Classify(const engine::Tensor& output, int64_t count,
                     const std::vector<std::string>* labels) {
  const engine::Tensor scores = output.Contiguous();
  engine::Shape shape = scores.shape();
  if (shape.empty()) shape.push_back(1);
  const int64_t classes = shape.back();
  const int64_t kept = std::min(count, classes);
  const int64_t vectors = classes == 0 ? 0 : scores.numel() / classes;
  BytesTensor result;
  shape.back() = kept;
  result.shape = shape;
  result.items.reserve(static_cast<size_t>(vectors * kept));
  std::vector<int64_t> order(static_cast<size_t>(classes));
  engine::VisitDType(scores.dtype(), [&]<typename T>() {
    for (int64_t vector = 0; vector < vectors; ++vector) {
      const T* row = scores.data_as<T>() + vector * classes;
      auto above = [&](int64_t a, int64_t b) {
        if constexpr (std::is_integral_v<T>) {
          // Not through double, which cannot tell 2^62 from 2^62 + 1 apart.
          return row[a] > row[b];
        } else {
          const auto left = engine::Convert<double>(row[a]);
          const auto right = engine::Convert<double>(row[b]);
          if (std::isnan(left) || std::isnan(right)) return std::isnan(left) && !std::isnan(right);
          return left > right;
        }
      };
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(
          order.begin(), order.begin() + kept, order.end(),
          [&](int64_t a, int64_t b) { return above(a, b) || (!above(b, a) && a < b); });
      for (int64_t rank = 0; rank < kept; ++rank) {
        std::string item;
        AppendNumber(row[order[rank]], &item);
        item += ':' + std::to_string(order[rank]);
        if (labels != nullptr && order[rank] < static_cast<int64_t>(labels->size())) {
          item += ':' + (*labels)[order[rank]];
        }
        result.items.push_back(std::move(item));
      }
    }
  });
  return result;
}

// Triton's shared-memory parameters of an input's or output's `object` (`what`, for errors):
// nullopt when it has none, else all that it needs, or an error naming what is missing.
Result<std::optional<SharedMemoryRef>> ReadSharedMemoryRef(const Json& object,
                                                           const std::string& what) {
  auto parameters = object.find("parameters");
  using Found = std::optional<SharedMemoryRef>;
  if (parameters == object.end() || !parameters->is_object()) return Found();
  auto region = parameters->find("shared_memory_region");
  auto offset = parameters->find("shared_memory_offset");
  auto size = parameters->find("shared_memory_byte_size");
  if (region == parameters->end()) {
    // Without a region they would be silently meaningless: refused instead.
    if (offset != parameters->end() || size != parameters->end()) {
      return Bad(what +
                 ": shared_memory_offset and shared_memory_byte_size need "
                 "shared_memory_region (the name of a registered region)");
    }
    return Found();
  }
  if (!region->is_string() || region->get_ref<const std::string&>().empty()) {
    return Bad(what + ": shared_memory_region must be the name of a registered region");
  }
  if (size == parameters->end()) {
    return Bad(what + ": shared_memory_region needs shared_memory_byte_size");
  }
  if (!size->is_number_unsigned()) {
    return Bad(what + ": shared_memory_byte_size must be a non-negative integer");
  }
  SharedMemoryRef ref;
  ref.region = region->get<std::string>();
  ref.byte_size = size->get<uint64_t>();
  if (offset != parameters->end()) {
    if (!offset->is_number_unsigned()) {
      return Bad(what + ": shared_memory_offset must be a non-negative integer");
    }
    ref.offset = offset->get<uint64_t>();
  }
  return Found(std::move(ref));
}

bool BinaryRequested(const Json& parameters) {
  auto found = parameters.find("binary_data");
  return found != parameters.end() && found->is_boolean() && found->get<bool>();
}

// A classification count as JSON gives it: a count past INT64_MAX (read as unsigned) is still
// a positive count, of all classes; anything else but a positive integer is refused.
Result<int64_t> ClassCount(const Json& classes, const std::string& output_name) {
  if (classes.is_number_unsigned() && classes.get<uint64_t>() >= 1) {
    return static_cast<int64_t>(std::min<uint64_t>(classes.get<uint64_t>(), INT64_MAX));
  }
  if (classes.is_number_integer() && classes.get<int64_t>() >= 1) return classes.get<int64_t>();
  return Bad("output '" + output_name +
             "': classification must be a positive integer (how many classes to return)");
}

Result<InferRequest> ReadInferRequest(const Manifest& manifest, std::string_view body,
                                      std::optional<size_t> json_length,
                                      const ParseLimits& limits) {
  std::string_view json_text = body;
  std::string_view binary;
  if (json_length) {
    if (*json_length > body.size()) {
      return Bad("Inference-Header-Content-Length is " + std::to_string(*json_length) +
                 ", but the body has only " + std::to_string(body.size()) + " bytes");
    }
    json_text = body.substr(0, *json_length);
    binary = body.substr(*json_length);
  }
  OROCHI_ASSIGN_OR_RETURN(RequestJson read,
                          ReadRequestJson(json_text, manifest, limits.max_json_depth));
  const Json& json = read.document;
  if (!json.is_object()) return Bad("the request must be a JSON object");
  OROCHI_RETURN_IF_ERROR(RefuseUnsupportedFields(json));
  InferRequestBuilder builder(manifest);
  InferRequest& request = builder.request();
  if (auto id = json.find("id"); id != json.end()) {
    if (!id->is_string()) return Bad("'id' must be a string");
    request.id = id->get<std::string>();
  }
  if (auto parameters = json.find("parameters"); parameters != json.end()) {
    if (!parameters->is_object()) return Bad("'parameters' must be an object");
    if (auto timeout = parameters->find("timeout"); timeout != parameters->end()) {
      if (!timeout->is_number_integer() || timeout->get<int64_t>() < 0) {
        return Bad("parameter 'timeout' must be a non-negative integer (microseconds)");
      }
      request.timeout = std::chrono::microseconds(timeout->get<int64_t>());
    }
    if (auto output = parameters->find("binary_data_output"); output != parameters->end()) {
      if (!output->is_boolean()) return Bad("parameter 'binary_data_output' must be a boolean");
      request.all_outputs_binary = output->get<bool>();
    }
    for (const auto& [name, value] : parameters->items()) {
      if (InferRequestBuilder::IsSequenceParameter(name)) {
        OROCHI_RETURN_IF_ERROR(builder.SequenceParameter(name, WireValueOf(value)));
      }
    }
    OROCHI_ASSIGN_OR_RETURN(request.parameters, ModelParameters(*parameters));
  }
  auto inputs = json.find("inputs");
  if (inputs == json.end() || !inputs->is_array()) return Bad("'inputs' must be an array");

  size_t binary_at = 0;
  for (size_t index = 0; index < inputs->size(); ++index) {
    const Json& input = (*inputs)[index];
    if (!input.is_object()) return Bad("each input must be an object");
    auto name = input.find("name");
    auto datatype = input.find("datatype");
    if (name == input.end() || !name->is_string()) return Bad("an input has no 'name'");
    const std::string input_name = name->get<std::string>();
    if (datatype == input.end() || !datatype->is_string()) {
      return Bad("input '" + input_name + "' has no 'datatype'");
    }
    OROCHI_ASSIGN_OR_RETURN(engine::Shape shape, ReadShape(input, input_name));
    OROCHI_ASSIGN_OR_RETURN(const TensorSpec* spec,
                            builder.CheckInput(input_name, datatype->get<std::string>(), shape));

    OROCHI_ASSIGN_OR_RETURN(std::optional<SharedMemoryRef> shared,
                            ReadSharedMemoryRef(input, "input '" + input_name + "'"));
    std::optional<size_t> binary_size;
    if (auto parameters = input.find("parameters");
        parameters != input.end() && parameters->is_object()) {
      if (auto size = parameters->find("binary_data_size"); size != parameters->end()) {
        if (!size->is_number_unsigned()) {
          return Bad("input '" + input_name + "': binary_data_size must be a non-negative integer");
        }
        binary_size = size->get<size_t>();
      }
    }
    // Both would leave one of them unread: which one the client meant is a guess.
    if (binary_size &&
        (input.contains("data") || (index < read.data.size() && read.data[index] != nullptr))) {
      return Bad("input '" + input_name +
                 "' has both 'data' and binary_data_size: send its values one way");
    }
    if (shared) {
      // Its bytes are in one place: two would leave one of them silently unread.
      if (binary_size) {
        return Bad("input '" + input_name +
                   "' has both shared_memory_region and binary_data_size: its bytes are either "
                   "in shared memory or in the body");
      }
      if (input.contains("data")) {  // the document keeps the key, its value read or not
        return Bad("input '" + input_name +
                   "' has both shared_memory_region and 'data': its values are either in "
                   "shared memory or in the request");
      }
      // Read from the region by ResolveSharedMemory, once the registry is at hand.
      builder.AddSharedMemoryInput(input_name, std::move(*shared), shape);
    } else if (binary_size) {
      if (!json_length) {
        return Bad("input '" + input_name +
                   "' uses binary_data_size, but the request has no "
                   "Inference-Header-Content-Length header");
      }
      if (*binary_size > binary.size() - binary_at) {
        return Bad("input '" + input_name + "': binary_data_size runs past the end of the body");
      }
      std::string_view bytes = binary.substr(binary_at, *binary_size);
      binary_at += *binary_size;
      OROCHI_ASSIGN_OR_RETURN(NamedTensor tensor,
                              builder.FromRaw(*spec, shape, bytes, "binary_data_size"));
      builder.AddInput(std::move(tensor));
    } else {
      std::unique_ptr<TensorData> data =
          index < read.data.size() ? std::move(read.data[index]) : nullptr;
      if (data == nullptr) {  // the document kept it: not an array
        auto in_document = input.find("data");
        if (in_document == input.end()) {
          return Bad("input '" + input_name + "' has neither 'data' nor binary_data_size");
        }
        data = TensorData::For(*spec, std::nullopt);
        data->Feed(*in_document);
      }
      NamedTensor tensor{input_name, engine::Tensor()};
      OROCHI_ASSIGN_OR_RETURN(tensor.value, data->Finish(shape));
      builder.AddInput(std::move(tensor));
    }
  }
  if (json_length && binary_at != binary.size()) {
    return Bad("the body has " + std::to_string(binary.size() - binary_at) +
               " bytes of binary data that no input claims");
  }

  if (auto outputs = json.find("outputs"); outputs != json.end()) {
    if (!outputs->is_array()) return Bad("'outputs' must be an array");
    for (const Json& output : *outputs) {
      auto name = output.find("name");
      if (!output.is_object() || name == output.end() || !name->is_string()) {
        return Bad("each requested output needs a 'name'");
      }
      const std::string output_name = name->get<std::string>();
      bool binary_output = false;
      std::optional<int64_t> classes;
      if (auto parameters = output.find("parameters");
          parameters != output.end() && parameters->is_object()) {
        if (auto binary_data = parameters->find("binary_data");
            binary_data != parameters->end() && !binary_data->is_boolean()) {
          return Bad("output '" + output_name + "': binary_data must be a boolean");
        }
        OROCHI_ASSIGN_OR_RETURN(std::optional<SharedMemoryRef> shared,
                                ReadSharedMemoryRef(output, "output '" + output_name + "'"));
        if (shared) {
          // Each would choose another place for the same bytes, or other bytes for the place.
          if (BinaryRequested(*parameters)) {
            return Bad("output '" + output_name +
                       "' asks for both binary_data and shared_memory_region: its bytes go to "
                       "one place");
          }
          if (parameters->contains("classification")) {
            return Bad("output '" + output_name +
                       "': classification cannot be written to shared memory; ask for the "
                       "classes in the response, or for the scores in shared memory");
          }
          OROCHI_RETURN_IF_ERROR(
              builder.RequestSharedMemoryOutput(output_name, std::move(*shared)));
          continue;
        }
        binary_output = BinaryRequested(*parameters);
        if (auto count = parameters->find("classification"); count != parameters->end()) {
          OROCHI_ASSIGN_OR_RETURN(classes, ClassCount(*count, output_name));
        }
      }
      OROCHI_RETURN_IF_ERROR(builder.RequestOutput(output_name, binary_output, classes));
    }
  }
  return builder.Finish();
}

}  // namespace

Result<const TensorSpec*> InferRequestBuilder::CheckInput(const std::string& name,
                                                          std::string_view datatype,
                                                          const engine::Shape& shape) const {
  auto spec = std::find_if(manifest_.inputs.begin(), manifest_.inputs.end(),
                           [&](const TensorSpec& candidate) { return candidate.name == name; });
  if (spec == manifest_.inputs.end()) {
    return Bad("unexpected input '" + name + "' for model '" + manifest_.name + "'");
  }
  if (inputs_.count(name) != 0) return Bad("input '" + name + "' is given twice");
  if (datatype != DataTypeName(spec->datatype)) {
    return Bad("input '" + name + "' has datatype " + std::string(datatype) +
               ", but the model expects " + std::string(DataTypeName(spec->datatype)));
  }
  OROCHI_RETURN_IF_ERROR(CheckShape(manifest_, *spec, shape));
  return &*spec;
}

Result<NamedTensor> InferRequestBuilder::FromRaw(const TensorSpec& spec, const engine::Shape& shape,
                                                 std::string_view bytes,
                                                 std::string_view source) const {
  NamedTensor tensor{spec.name, engine::Tensor()};
  if (spec.datatype == DataType::kBytes) {
    OROCHI_ASSIGN_OR_RETURN(tensor.value, BytesFromBinary(spec, shape, bytes));
  } else {
    OROCHI_ASSIGN_OR_RETURN(tensor.value, TensorFromBinary(spec, shape, bytes, source));
  }
  return tensor;
}

void InferRequestBuilder::AddInput(NamedTensor input) {
  std::string name = input.name;
  const auto* tensor = std::get_if<engine::Tensor>(&input.value);
  rows_[name] = tensor != nullptr ? (tensor->shape().empty() ? 0 : tensor->shape()[0])
                                  : (std::get<BytesTensor>(input.value).shape.empty()
                                         ? 0
                                         : std::get<BytesTensor>(input.value).shape[0]);
  inputs_.emplace(std::move(name), std::move(input));
}

void InferRequestBuilder::AddSharedMemoryInput(const std::string& name, SharedMemoryRef where,
                                               const engine::Shape& shape) {
  rows_[name] = shape.empty() ? 0 : shape[0];
  inputs_.emplace(name, NamedTensor{name, engine::Tensor()});
  request_.shared_memory_inputs[name] = {std::move(where), shape};
}

Status InferRequestBuilder::RequestSharedMemoryOutput(const std::string& name,
                                                      SharedMemoryRef where) {
  OROCHI_RETURN_IF_ERROR(RequestOutput(name, /*binary=*/false, std::nullopt));
  request_.shared_memory_outputs[name] = std::move(where);
  return Status::Ok();
}

Status InferRequestBuilder::RequestOutput(const std::string& name, bool binary,
                                          std::optional<int64_t> classes) {
  bool known = false;
  for (const TensorSpec& spec : manifest_.outputs) known = known || spec.name == name;
  if (!known) {  // before OutputSpec, which wants a declared name
    return Bad("unexpected requested output '" + name + "' for model '" + manifest_.name + "'");
  }
  // Asked twice, e.g. with two classifications, one answer would silently override the other.
  if (std::find(request_.outputs.begin(), request_.outputs.end(), name) != request_.outputs.end()) {
    return Bad("output '" + name + "' is requested twice");
  }
  request_.outputs.push_back(name);
  if (binary) request_.binary_outputs.insert(name);
  if (classes) {
    if (*classes < 1) {
      return Bad("output '" + name +
                 "': classification must be a positive integer (how many classes to return)");
    }
    if (OutputSpec(manifest_, name).datatype == DataType::kBytes) {
      return Bad("output '" + name + "' is BYTES: classification needs an output of scores");
    }
    request_.classification[name] = *classes;
  }
  return Status::Ok();
}

bool InferRequestBuilder::IsSequenceParameter(std::string_view name) {
  return name == "sequence_id" || name == "sequence_start" || name == "sequence_end";
}

Status InferRequestBuilder::SequenceParameter(const std::string& name, const WireValue& value) {
  sequence_given_ = true;
  if (name == "sequence_id") {
    if (const auto* number = std::get_if<int64_t>(&value); number != nullptr && *number >= 0) {
      sequence_.id = std::to_string(*number);
    } else if (const auto* unsigned_number = std::get_if<uint64_t>(&value)) {
      sequence_.id = std::to_string(*unsigned_number);
    } else if (const auto* text = std::get_if<std::string>(&value);
               text != nullptr && !text->empty()) {
      sequence_.id = Quoted(*text);
    } else {
      return Bad("parameter 'sequence_id' must be an unsigned integer or a non-empty string");
    }
    return Status::Ok();
  }
  const auto* flag = std::get_if<bool>(&value);
  if (flag == nullptr) return Bad("parameter '" + name + "' must be a boolean");
  (name == "sequence_start" ? sequence_.start : sequence_.end) = *flag;
  return Status::Ok();
}

Result<InferRequest> InferRequestBuilder::Finish() {
  if (manifest_.sequence) {
    if (sequence_.id.empty()) {
      return Bad("model " + manifest_.name +
                 " is stateful: each request names its sequence with the parameter "
                 "'sequence_id' (an unsigned integer or a string), and a sequence's first request "
                 "sets 'sequence_start': true");
    }
    request_.sequence = sequence_;
  } else if (sequence_given_) {
    return Bad("model " + manifest_.name +
               " is not stateful (its manifest declares no \"sequence\"): the parameters "
               "sequence_id, sequence_start and sequence_end apply only to stateful models");
  }
  for (const TensorSpec& spec : manifest_.inputs) {
    auto found = inputs_.find(spec.name);
    if (found == inputs_.end()) return Bad("input '" + spec.name + "' is missing");
    if (manifest_.max_batch_size > 0) {
      // From the shapes as given: a shared-memory input has no value yet.
      const int64_t rows = rows_.at(spec.name);
      if (request_.rows != 0 && rows != request_.rows) {
        return Bad("inputs disagree on the batch size (" + std::to_string(request_.rows) + " and " +
                   std::to_string(rows) + ")");
      }
      request_.rows = rows;
    }
    request_.inputs.push_back(std::move(found->second));
  }
  inputs_.clear();
  return std::move(request_);
}

ResponseTensors SelectResponseTensors(const Manifest& manifest, const InferRequest& request,
                                      const std::vector<NamedTensor>& outputs,
                                      const OutputLabels& labels) {
  ResponseTensors selected;
  for (size_t i = 0; i < outputs.size() && i < manifest.outputs.size(); ++i) {
    const NamedTensor& output = outputs[i];
    if (!request.outputs.empty() && std::find(request.outputs.begin(), request.outputs.end(),
                                              output.name) == request.outputs.end()) {
      continue;
    }
    ResponseTensor item{&output.name, manifest.outputs[i].datatype, {}};
    item.binary = request.all_outputs_binary || request.binary_outputs.count(output.name) != 0;
    if (auto shared = request.shared_memory_outputs.find(output.name);
        shared != request.shared_memory_outputs.end()) {
      item.shared_memory = &shared->second;
      item.binary = false;
    }
    if (auto count = request.classification.find(output.name);
        count != request.classification.end()) {
      auto names = labels.find(output.name);
      selected.classes.push_back(std::make_unique<BytesTensor>(
          Classify(std::get<engine::Tensor>(output.value), count->second,
                   names == labels.end() ? nullptr : &names->second)));
      item.datatype = DataType::kBytes;
      item.bytes = selected.classes.back().get();
    } else if (const auto* bytes = std::get_if<BytesTensor>(&output.value)) {
      item.bytes = bytes;
    } else {
      const auto& tensor = std::get<engine::Tensor>(output.value);
      if (tensor.is_contiguous()) {
        item.tensor = &tensor;
      } else {
        selected.contiguous.push_back(std::make_unique<engine::Tensor>(tensor.Contiguous()));
        item.tensor = selected.contiguous.back().get();
      }
    }
    item.shape = item.tensor != nullptr ? item.tensor->shape() : item.bytes->shape;
    selected.tensors.push_back(item);
  }
  return selected;
}

namespace {

// An output's shape, whichever kind of tensor it is.
engine::Shape ShapeOf(const std::variant<engine::Tensor, BytesTensor>& value) {
  const auto* tensor = std::get_if<engine::Tensor>(&value);
  return tensor != nullptr ? tensor->shape() : std::get<BytesTensor>(value).shape;
}

// The bytes of a tensor as the binary extension and shared memory carry it: the elements in
// row-major order, BYTES elements each after its 4-byte little-endian length.
size_t SerializedSize(const std::variant<engine::Tensor, BytesTensor>& value) {
  if (const auto* tensor = std::get_if<engine::Tensor>(&value)) {
    return static_cast<size_t>(tensor->numel()) * engine::ItemSize(tensor->dtype());
  }
  size_t size = 0;
  for (const std::string& item : std::get<BytesTensor>(value).items) size += 4 + item.size();
  return size;
}

// Writes `value` serialized into `region` at `offset`: a tensor's bytes straight from its
// memory, BYTES elements through a buffer.
Status WriteSerialized(const SharedMemoryRegion& region, uint64_t offset,
                       const std::variant<engine::Tensor, BytesTensor>& value,
                       std::string_view what) {
  if (const auto* tensor = std::get_if<engine::Tensor>(&value)) {
    const engine::Tensor contiguous = tensor->Contiguous();
    return region.Write(
        offset, std::span(static_cast<const std::byte*>(contiguous.data()), SerializedSize(value)),
        what);
  }
  std::vector<std::byte> serialized(SerializedSize(value));
  std::byte* to = serialized.data();
  for (const std::string& item : std::get<BytesTensor>(value).items) {
    const auto length = static_cast<uint32_t>(item.size());
    std::memcpy(to, &length, 4);
    if (!item.empty()) std::memcpy(to + 4, item.data(), item.size());
    to += 4 + item.size();
  }
  return region.Write(offset, serialized, what);
}

// The region `ref` names, for `what`: its lookup's error as a request error.
Result<std::shared_ptr<const SharedMemoryRegion>> RegionFor(const SharedMemoryRegistry& registry,
                                                            const SharedMemoryRef& ref,
                                                            const std::string& what) {
  Result<std::shared_ptr<const SharedMemoryRegion>> region = registry.Find(ref.region);
  if (!region.ok()) return Bad(what + ": " + region.status().message());
  return region;
}

Status ResolveSharedMemoryUnchecked(const Manifest& manifest, const SharedMemoryRegistry& registry,
                                    InferRequest* request) {
  for (auto& entry : request->shared_memory_inputs) {
    // Not a structured binding: lambdas below name it, which C++20 allows but clang 14 does not.
    const std::string& name = entry.first;
    SharedMemoryInput& input = entry.second;
    const std::string what = "input '" + name + "'";
    SharedMemoryRef& where = input.where;
    OROCHI_ASSIGN_OR_RETURN(where.mapped, RegionFor(registry, where, what));
    auto spec = std::find_if(manifest.inputs.begin(), manifest.inputs.end(),
                             [&](const TensorSpec& candidate) { return candidate.name == name; });
    auto slot = std::find_if(request->inputs.begin(), request->inputs.end(),
                             [&](const NamedTensor& tensor) { return tensor.name == name; });
    OROCHI_INTERNAL_ASSERT(spec != manifest.inputs.end() && slot != request->inputs.end(),
                           "a shared-memory input that the request or the model lacks");
    // Read with one copy, from the region into the tensor (BYTES through a buffer, which
    // its elements are cut from).
    OROCHI_RETURN_IF_ERROR(where.mapped->CheckRange(where.offset, where.byte_size, what));
    if (spec->datatype == DataType::kBytes) {
      std::vector<std::byte> serialized(where.byte_size);
      OROCHI_RETURN_IF_ERROR(
          where.mapped->ReadInto(where.offset, where.byte_size, what, serialized.data()));
      OROCHI_ASSIGN_OR_RETURN(
          BytesTensor value,
          BytesFromBinary(*spec, input.shape,
                          std::string_view(reinterpret_cast<const char*>(serialized.data()),
                                           serialized.size())));
      slot->value = std::move(value);
    } else {
      OROCHI_ASSIGN_OR_RETURN(engine::Tensor value,
                              TensorFilledBy(*spec, input.shape, where.byte_size,
                                             "shared_memory_byte_size", [&](std::byte* to) {
                                               return where.mapped->ReadInto(
                                                   where.offset, where.byte_size, what, to);
                                             }));
      slot->value = std::move(value);
    }
  }
  // Checked before the model runs, so that a mistake costs no inference.
  for (auto& [name, where] : request->shared_memory_outputs) {
    const std::string what = "output '" + name + "'";
    OROCHI_ASSIGN_OR_RETURN(where.mapped, RegionFor(registry, where, what));
    OROCHI_RETURN_IF_ERROR(where.mapped->CheckHeld(where.offset, where.byte_size, what));
  }
  return Status::Ok();
}

}  // namespace

Status ResolveSharedMemory(const Manifest& manifest, const SharedMemoryRegistry& registry,
                           InferRequest* request) {
  try {
    return ResolveSharedMemoryUnchecked(manifest, registry, request);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("the request needs more memory than the server can allocate");
  }
}

Status WriteSharedMemoryOutputs(const Manifest& manifest, const InferRequest& request,
                                const std::vector<NamedTensor>& outputs) {
  // Every output is checked before any is written: a refused request leaves the regions as
  // they were (except when a CUDA device itself refuses a copy, which only the copy shows).
  std::vector<std::pair<const NamedTensor*, const SharedMemoryRef*>> writes;
  for (const NamedTensor& output : outputs) {
    auto shared = request.shared_memory_outputs.find(output.name);
    if (shared == request.shared_memory_outputs.end()) continue;
    const SharedMemoryRef& where = shared->second;
    OROCHI_INTERNAL_ASSERT(where.mapped != nullptr,
                           "WriteSharedMemoryOutputs before ResolveSharedMemory");
    const size_t needed = SerializedSize(output.value);
    if (needed > where.byte_size) {
      return Bad("output '" + output.name + "' of model '" + manifest.name + "' has " +
                 std::to_string(needed) + " bytes (shape " +
                 engine::ShapeString(ShapeOf(output.value)) +
                 "), more than its shared_memory_byte_size " + std::to_string(where.byte_size) +
                 " in shared memory region '" + where.region + "' at offset " +
                 std::to_string(where.offset));
    }
    OROCHI_RETURN_IF_ERROR(
        where.mapped->CheckHeld(where.offset, needed, "output '" + output.name + "'"));
    writes.emplace_back(&output, &where);
  }
  for (const auto& [output, where] : writes) {
    OROCHI_RETURN_IF_ERROR(WriteSerialized(*where->mapped, where->offset, output->value,
                                           "output '" + output->name + "'"));
  }
  return Status::Ok();
}

std::optional<std::chrono::steady_clock::time_point> RequestDeadline(
    const InferRequest& request, std::chrono::steady_clock::time_point received,
    std::chrono::milliseconds default_timeout) {
  // Longer than this is no deadline at all: INT64_MAX microseconds would overflow the
  // nanosecond clock (and the watchdog adds its grace on top), wrapping into a deadline that
  // has already passed.
  constexpr std::chrono::microseconds kNoDeadlineFrom = std::chrono::hours(24 * 365 * 100);
  if (request.timeout) {
    if (*request.timeout < kNoDeadlineFrom) return received + *request.timeout;
    return std::nullopt;
  }
  if (default_timeout.count() > 0) return received + default_timeout;
  return std::nullopt;
}

Result<InferRequest> ParseInferRequest(const Manifest& manifest, std::string_view body,
                                       std::optional<size_t> json_length,
                                       const ParseLimits& limits) {
  // A tensor that cannot be allocated is a request too large for the server now, not a crash.
  try {
    return ReadInferRequest(manifest, body, json_length, limits);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("the request needs more memory than the server can allocate");
  } catch (const engine::Error& error) {
    return error.status();
  }
}

EncodedResponse EncodeInferResponse(const Manifest& manifest, const InferRequest& request,
                                    const std::vector<NamedTensor>& outputs,
                                    const OutputLabels& labels) {
  // Written straight into the body: a document node per value would take many times the
  // tensor's size for the large outputs that matter.
  const ResponseTensors selected = SelectResponseTensors(manifest, request, outputs, labels);
  std::string json;
  std::string binary;
  size_t values = 0;  // to be written as JSON
  for (const ResponseTensor& output : selected.tensors) {
    if (output.tensor != nullptr && !output.binary && output.shared_memory == nullptr) {
      values += static_cast<size_t>(output.tensor->numel());
    }
  }
  // Room for a typical float ("-0.12345678,"): reserved and never written costs address space,
  // not memory, while growing past it copies the whole body.
  json.reserve(256 + values * 12);
  json += "{\"model_name\":" + Quoted(manifest.name) + ",\"model_version\":\"" +
          std::to_string(manifest.version) + "\"";
  if (!request.id.empty()) json += ",\"id\":" + Quoted(request.id);
  json += ",\"outputs\":[";
  bool first = true;
  for (const ResponseTensor& output : selected.tensors) {
    json += first ? "{" : ",{";
    first = false;
    json += "\"name\":" + Quoted(*output.name) + ",\"datatype\":\"" +
            std::string(DataTypeName(output.datatype)) +
            "\",\"shape\":" + Json(output.shape).dump();
    if (output.shared_memory != nullptr) {
      // Its bytes are in the region already (WriteSharedMemoryOutputs): only where they are.
      size_t written = 0;
      if (output.tensor != nullptr) {
        written =
            static_cast<size_t>(output.tensor->numel()) * engine::ItemSize(output.tensor->dtype());
      } else {
        for (const std::string& item : output.bytes->items) written += 4 + item.size();
      }
      json += ",\"parameters\":{\"shared_memory_region\":" + Quoted(output.shared_memory->region) +
              ",\"shared_memory_offset\":" + std::to_string(output.shared_memory->offset) +
              ",\"shared_memory_byte_size\":" + std::to_string(written) + "}}";
      continue;
    }
    const size_t binary_before = binary.size();
    if (output.bytes != nullptr) {
      if (output.binary) {
        for (const std::string& item : output.bytes->items) {
          auto length = static_cast<uint32_t>(item.size());
          binary.append(reinterpret_cast<const char*>(&length), 4);
          binary += item;
        }
      } else {
        json += ",\"data\":[";
        for (size_t k = 0; k < output.bytes->items.size(); ++k) {
          if (k > 0) json += ',';
          json += Quoted(output.bytes->items[k]);
        }
        json += ']';
      }
    } else {
      const engine::Tensor& tensor = *output.tensor;
      if (output.binary) {
        binary.append(static_cast<const char*>(tensor.data()),
                      static_cast<size_t>(tensor.numel()) * engine::ItemSize(tensor.dtype()));
      } else {
        json += ",\"data\":[";
        engine::VisitDType(tensor.dtype(), [&]<typename T>() {
          const T* data = tensor.data_as<T>();
          for (int64_t k = 0; k < tensor.numel(); ++k) {
            if (k > 0) json += ',';
            AppendNumber(data[k], &json);
          }
        });
        json += ']';
      }
    }
    if (output.binary) {
      json +=
          ",\"parameters\":{\"binary_data_size\":" + std::to_string(binary.size() - binary_before) +
          "}";
    }
    json += '}';
  }
  json += "]}";
  EncodedResponse encoded;
  encoded.body = std::move(json);
  if (!binary.empty() || request.all_outputs_binary || !request.binary_outputs.empty()) {
    encoded.json_length = encoded.body.size();
    encoded.body += binary;
  }
  return encoded;
}

}  // namespace orochi::server::kserve

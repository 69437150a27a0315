#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "orochi/engine/dtype.h"
#include "orochi/server/kserve_codec.h"

namespace orochi::server::kserve {
namespace {

using interpreters::BytesTensor;
using interpreters::NamedTensor;
using Json = nlohmann::json;
using packaging::DataType;
using packaging::Manifest;
using packaging::TensorSpec;

Status Bad(const std::string& message) { return InvalidArgument(message); }

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

Result<Json> ParseJson(std::string_view text, int max_depth) {
  bool too_deep = false;
  Json json = Json::parse(
      text.begin(), text.end(),
      [&](int depth, Json::parse_event_t, Json&) {
        too_deep = too_deep || depth > max_depth;
        return true;
      },
      /*allow_exceptions=*/false);
  if (too_deep) {
    return Bad("the request JSON is nested deeper than the limit of " + std::to_string(max_depth));
  }
  if (json.is_discarded()) return Bad("the request body is not valid JSON");
  return json;
}

void Flatten(const Json& data, std::vector<const Json*>* leaves) {
  if (data.is_array()) {
    for (const Json& item : data) Flatten(item, leaves);
  } else {
    leaves->push_back(&data);
  }
}

// Nested `data` must follow the shape exactly (flat data is the other accepted form): a ragged
// or differently nested list with the right number of values is a mistake, not a layout.
bool NestedAsShaped(const Json& data, const engine::Shape& shape, size_t depth) {
  if (depth == shape.size()) return !data.is_array();
  if (!data.is_array() || static_cast<int64_t>(data.size()) != shape[depth]) return false;
  return std::all_of(data.begin(), data.end(),
                     [&](const Json& item) { return NestedAsShaped(item, shape, depth + 1); });
}

bool IsNested(const Json& data) {
  return data.is_array() &&
         std::any_of(data.begin(), data.end(), [](const Json& item) { return item.is_array(); });
}

Result<engine::Tensor> TensorFromJson(const TensorSpec& spec, const engine::Shape& shape,
                                      const std::vector<const Json*>& leaves) {
  const engine::DType dtype = *packaging::EngineDType(spec.datatype);
  engine::Tensor tensor = engine::Tensor::Empty(shape, dtype);
  Status status;
  engine::VisitDType(dtype, [&]<typename T>() {
    T* out = tensor.mutable_data_as<T>();
    for (const Json* leaf : leaves) {
      if constexpr (std::is_same_v<T, bool>) {
        if (!leaf->is_boolean()) {
          status =
              Bad("input '" + spec.name + "' is BOOL: expected true or false, got " + leaf->dump());
          return;
        }
        *out++ = leaf->get<bool>();
      } else if constexpr (std::is_integral_v<T>) {
        if (!leaf->is_number_integer()) {
          status = Bad("input '" + spec.name + "' is " + std::string(DataTypeName(spec.datatype)) +
                       ": expected integers, got " + leaf->dump());
          return;
        }
        // Compared in the value's own signedness (nlohmann keeps non-negative integers
        // unsigned, up to 2^64-1) before narrowing: 300 for UINT8 or 2^64-1 for INT64 must
        // not wrap into another number the model would silently use.
        using Limits = std::numeric_limits<T>;
        const bool in_range = leaf->is_number_unsigned() ? std::in_range<T>(leaf->get<uint64_t>())
                                                         : std::in_range<T>(leaf->get<int64_t>());
        if (!in_range) {
          status =
              Bad("input '" + spec.name + "' is " + std::string(DataTypeName(spec.datatype)) +
                  ": " + leaf->dump() + " is out of its range [" + std::to_string(+Limits::min()) +
                  ", " + std::to_string(+Limits::max()) + "]");
          return;
        }
        *out++ = leaf->is_number_unsigned() ? static_cast<T>(leaf->get<uint64_t>())
                                            : static_cast<T>(leaf->get<int64_t>());
      } else {
        if (!leaf->is_number()) {
          status = Bad("input '" + spec.name + "' is " + std::string(DataTypeName(spec.datatype)) +
                       ": expected numbers, got " + leaf->dump());
          return;
        }
        *out++ = engine::Convert<T>(leaf->get<double>());
      }
    }
  });
  OROCHI_RETURN_IF_ERROR(status);
  return tensor;
}

Result<engine::Tensor> TensorFromBinary(const TensorSpec& spec, const engine::Shape& shape,
                                        std::string_view bytes) {
  const engine::DType dtype = *packaging::EngineDType(spec.datatype);
  const auto expected = static_cast<size_t>(engine::NumElements(shape)) * engine::ItemSize(dtype);
  if (bytes.size() != expected) {
    return Bad("input '" + spec.name + "': binary_data_size is " + std::to_string(bytes.size()) +
               " bytes, but shape " + ShapeText(shape) + " of " +
               std::string(DataTypeName(spec.datatype)) + " needs " + std::to_string(expected));
  }
  engine::Tensor tensor = engine::Tensor::Empty(shape, dtype);
  if (expected > 0) std::memcpy(tensor.mutable_data(), bytes.data(), expected);
  if (dtype == engine::DType::kBool) {
    auto* flags = tensor.mutable_data_as<uint8_t>();
    for (size_t i = 0; i < expected; ++i) flags[i] = flags[i] != 0 ? 1 : 0;
  }
  return tensor;
}

Result<BytesTensor> BytesFromBinary(const TensorSpec& spec, const engine::Shape& shape,
                                    std::string_view bytes) {
  BytesTensor tensor{shape, {}};
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
    tensor.items.emplace_back(bytes.substr(at, length));
    at += length;
  }
  if (static_cast<int64_t>(tensor.items.size()) != engine::NumElements(shape)) {
    return Bad("input '" + spec.name + "' has " + std::to_string(tensor.items.size()) +
               " BYTES elements, but shape " + ShapeText(shape) + " needs " +
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
    return Bad("input '" + spec.name + "' has shape " + ShapeText(shape) +
               ", but the model expects " + ShapeText(expected) + " (-1 is any size)");
  }
  if (manifest.max_batch_size > 0 && (shape[0] < 1 || shape[0] > manifest.max_batch_size)) {
    return Bad("input '" + spec.name + "' has a batch of " + std::to_string(shape[0]) +
               "; the model takes 1 to " + std::to_string(manifest.max_batch_size));
  }
  return Status::Ok();
}

bool BinaryRequested(const Json& parameters) {
  auto found = parameters.find("binary_data");
  return found != parameters.end() && found->is_boolean() && found->get<bool>();
}

}  // namespace

Result<InferRequest> ParseInferRequest(const Manifest& manifest, std::string_view body,
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
  OROCHI_ASSIGN_OR_RETURN(Json json, ParseJson(json_text, limits.max_json_depth));
  if (!json.is_object()) return Bad("the request must be a JSON object");
  InferRequest request;
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
      request.all_outputs_binary = output->is_boolean() && output->get<bool>();
    }
  }
  auto inputs = json.find("inputs");
  if (inputs == json.end() || !inputs->is_array()) return Bad("'inputs' must be an array");

  std::map<std::string, const TensorSpec*> specs;
  for (const TensorSpec& spec : manifest.inputs) specs[spec.name] = &spec;
  std::map<std::string, NamedTensor> parsed;
  size_t binary_at = 0;
  for (const Json& input : *inputs) {
    if (!input.is_object()) return Bad("each input must be an object");
    auto name = input.find("name");
    auto datatype = input.find("datatype");
    auto shape_json = input.find("shape");
    if (name == input.end() || !name->is_string()) return Bad("an input has no 'name'");
    const std::string input_name = name->get<std::string>();
    auto spec_entry = specs.find(input_name);
    if (spec_entry == specs.end()) {
      return Bad("unexpected input '" + input_name + "' for model '" + manifest.name + "'");
    }
    const TensorSpec& spec = *spec_entry->second;
    if (parsed.count(input_name) != 0) return Bad("input '" + input_name + "' is given twice");
    if (datatype == input.end() || !datatype->is_string()) {
      return Bad("input '" + input_name + "' has no 'datatype'");
    }
    if (datatype->get<std::string>() != DataTypeName(spec.datatype)) {
      return Bad("input '" + input_name + "' has datatype " + datatype->get<std::string>() +
                 ", but the model expects " + std::string(DataTypeName(spec.datatype)));
    }
    if (shape_json == input.end() || !shape_json->is_array()) {
      return Bad("input '" + input_name + "' has no 'shape'");
    }
    engine::Shape shape;
    for (const Json& size : *shape_json) {
      if (!size.is_number_integer() || size.get<int64_t>() < 0) {
        return Bad("input '" + input_name + "': shape must hold non-negative integers");
      }
      shape.push_back(size.get<int64_t>());
    }
    if (shape.size() > engine::kMaxDims) return Bad("input '" + input_name + "': too many dims");
    OROCHI_RETURN_IF_ERROR(CheckShape(manifest, spec, shape));
    int64_t elements = 1;
    for (int64_t size : shape) {
      if (__builtin_mul_overflow(elements, size, &elements) || elements > (int64_t{1} << 40)) {
        return Bad("input '" + input_name + "': shape " + ShapeText(shape) + " is too large");
      }
    }

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
    NamedTensor tensor{input_name, engine::Tensor()};
    if (binary_size) {
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
      if (spec.datatype == DataType::kBytes) {
        OROCHI_ASSIGN_OR_RETURN(BytesTensor value, BytesFromBinary(spec, shape, bytes));
        tensor.value = std::move(value);
      } else {
        OROCHI_ASSIGN_OR_RETURN(engine::Tensor value, TensorFromBinary(spec, shape, bytes));
        tensor.value = std::move(value);
      }
    } else {
      auto data = input.find("data");
      if (data == input.end()) {
        return Bad("input '" + input_name + "' has neither 'data' nor binary_data_size");
      }
      if (IsNested(*data) && !NestedAsShaped(*data, shape, 0)) {
        return Bad("input '" + input_name + "' has nested data that does not follow its shape " +
                   ShapeText(shape) + " (send it flat, or nested exactly as the shape)");
      }
      std::vector<const Json*> leaves;
      Flatten(*data, &leaves);
      if (static_cast<int64_t>(leaves.size()) != elements) {
        return Bad("input '" + input_name + "' has " + std::to_string(leaves.size()) +
                   " values, but shape " + ShapeText(shape) + " needs " + std::to_string(elements));
      }
      if (spec.datatype == DataType::kBytes) {
        BytesTensor value{shape, {}};
        for (const Json* leaf : leaves) {
          if (!leaf->is_string()) {
            return Bad("input '" + input_name + "' is BYTES: expected strings");
          }
          value.items.push_back(leaf->get<std::string>());
        }
        tensor.value = std::move(value);
      } else {
        OROCHI_ASSIGN_OR_RETURN(engine::Tensor value, TensorFromJson(spec, shape, leaves));
        tensor.value = std::move(value);
      }
    }
    parsed.emplace(input_name, std::move(tensor));
  }
  if (json_length && binary_at != binary.size()) {
    return Bad("the body has " + std::to_string(binary.size() - binary_at) +
               " bytes of binary data that no input claims");
  }
  for (const TensorSpec& spec : manifest.inputs) {
    auto found = parsed.find(spec.name);
    if (found == parsed.end()) return Bad("input '" + spec.name + "' is missing");
    if (manifest.max_batch_size > 0) {
      const auto& value = found->second.value;
      int64_t rows = std::holds_alternative<engine::Tensor>(value)
                         ? std::get<engine::Tensor>(value).shape()[0]
                         : std::get<BytesTensor>(value).shape[0];
      if (request.rows != 0 && rows != request.rows) {
        return Bad("inputs disagree on the batch size (" + std::to_string(request.rows) + " and " +
                   std::to_string(rows) + ")");
      }
      request.rows = rows;
    }
    request.inputs.push_back(std::move(found->second));
  }

  if (auto outputs = json.find("outputs"); outputs != json.end()) {
    if (!outputs->is_array()) return Bad("'outputs' must be an array");
    for (const Json& output : *outputs) {
      auto name = output.find("name");
      if (!output.is_object() || name == output.end() || !name->is_string()) {
        return Bad("each requested output needs a 'name'");
      }
      const std::string output_name = name->get<std::string>();
      bool known = false;
      for (const TensorSpec& spec : manifest.outputs) known = known || spec.name == output_name;
      if (!known) {
        return Bad("unexpected requested output '" + output_name + "' for model '" + manifest.name +
                   "'");
      }
      request.outputs.push_back(output_name);
      if (auto parameters = output.find("parameters");
          parameters != output.end() && parameters->is_object() && BinaryRequested(*parameters)) {
        request.binary_outputs.insert(output_name);
      }
    }
  }
  return request;
}

EncodedResponse EncodeInferResponse(const Manifest& manifest, const InferRequest& request,
                                    const std::vector<NamedTensor>& outputs) {
  Json response{{"model_name", manifest.name}, {"model_version", std::to_string(manifest.version)}};
  if (!request.id.empty()) response["id"] = request.id;
  Json listed = Json::array();
  std::string binary;
  for (size_t i = 0; i < outputs.size() && i < manifest.outputs.size(); ++i) {
    const NamedTensor& output = outputs[i];
    const TensorSpec& spec = manifest.outputs[i];
    if (!request.outputs.empty() && std::find(request.outputs.begin(), request.outputs.end(),
                                              output.name) == request.outputs.end()) {
      continue;
    }
    const bool as_binary =
        request.all_outputs_binary || request.binary_outputs.count(output.name) != 0;
    Json entry{{"name", output.name}, {"datatype", std::string(DataTypeName(spec.datatype))}};
    size_t binary_before = binary.size();
    Json data = Json::array();
    if (const auto* bytes = std::get_if<BytesTensor>(&output.value)) {
      entry["shape"] = bytes->shape;
      for (const std::string& item : bytes->items) {
        if (as_binary) {
          auto length = static_cast<uint32_t>(item.size());
          binary.append(reinterpret_cast<const char*>(&length), 4);
          binary += item;
        } else {
          data.push_back(item);
        }
      }
    } else {
      const engine::Tensor tensor = std::get<engine::Tensor>(output.value).Contiguous();
      entry["shape"] = tensor.shape();
      if (as_binary) {
        binary.append(static_cast<const char*>(tensor.data()),
                      static_cast<size_t>(tensor.numel()) * engine::ItemSize(tensor.dtype()));
      } else {
        engine::VisitDType(tensor.dtype(), [&]<typename T>() {
          const T* values = tensor.data_as<T>();
          for (int64_t k = 0; k < tensor.numel(); ++k) {
            if constexpr (std::is_same_v<T, bool>) {
              data.push_back(values[k]);
            } else if constexpr (std::is_integral_v<T>) {
              data.push_back(static_cast<int64_t>(values[k]));
            } else {
              data.push_back(engine::Convert<double>(values[k]));
            }
          }
        });
      }
    }
    if (as_binary) {
      entry["parameters"] = {{"binary_data_size", binary.size() - binary_before}};
    } else {
      entry["data"] = std::move(data);
    }
    listed.push_back(std::move(entry));
  }
  response["outputs"] = std::move(listed);
  EncodedResponse encoded;
  encoded.body = response.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (!binary.empty() || request.all_outputs_binary || !request.binary_outputs.empty()) {
    encoded.json_length = encoded.body.size();
    encoded.body += binary;
  }
  return encoded;
}

}  // namespace orochi::server::kserve

#include "unsupported_fields.h"

#include <algorithm>
#include <initializer_list>
#include <string_view>

namespace orochi::server::kserve {
namespace {

using Json = nlohmann::json;

bool OneOf(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// `text` as a JSON string, for messages: quotes and control characters escaped.
std::string Named(const std::string& text) {
  return Json(text).dump(-1, ' ', false, Json::error_handler_t::replace);
}

// "input 'x'" / "output 3" (an output or input without a usable name yet).
std::string TensorName(const char* kind, const Json& tensor, size_t index) {
  if (tensor.is_object()) {
    auto name = tensor.find("name");
    if (name != tensor.end() && name->is_string()) {
      return std::string(kind) + " " + Named(name->get<std::string>());
    }
  }
  return std::string(kind) + " " + std::to_string(index);
}

Status CheckTensor(const char* kind, const Json& tensor, size_t index,
                   std::initializer_list<std::string_view> keys,
                   std::initializer_list<std::string_view> parameters, const char* keys_text,
                   const char* parameters_text) {
  if (!tensor.is_object()) return Status::Ok();  // refused as such by the codec
  const std::string name = TensorName(kind, tensor, index);
  for (const auto& [key, value] : tensor.items()) {
    if (!OneOf(key, keys)) {
      return InvalidArgument(name + " has the key " + Named(key) +
                             ", which Orochi does not implement (an " + kind + " holds " +
                             keys_text + ")");
    }
  }
  auto found = tensor.find("parameters");
  if (found == tensor.end()) return Status::Ok();
  if (!found->is_object()) {
    return InvalidArgument(name + ": 'parameters' must be an object");
  }
  for (const auto& [parameter, value] : found->items()) {
    if (!OneOf(parameter, parameters)) {
      return InvalidArgument(name + " has the parameter " + Named(parameter) +
                             ", which Orochi does not implement (an " + kind + " takes only " +
                             parameters_text + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

bool IsReservedParameter(std::string_view name) { return name == "priority"; }

Status RefuseReservedParameter(const std::string& name) {
  return InvalidArgument(
      "parameter " + Named(name) +
      " is not supported: Orochi does not implement request priorities, and does not pass "
      "Triton's reserved parameters to the model; remove it");
}

Status RefuseUnsupportedFields(const Json& request) {
  for (const auto& [key, value] : request.items()) {
    if (!OneOf(key, {"id", "parameters", "inputs", "outputs"})) {
      return InvalidArgument("the request has the key " + Named(key) +
                             ", which Orochi does not implement (a request holds id, "
                             "parameters, inputs and outputs)");
    }
  }
  if (auto parameters = request.find("parameters");
      parameters != request.end() && parameters->is_object()) {
    for (const auto& [name, value] : parameters->items()) {
      if (IsReservedParameter(name)) return RefuseReservedParameter(name);
    }
  }
  if (auto inputs = request.find("inputs"); inputs != request.end() && inputs->is_array()) {
    for (size_t i = 0; i < inputs->size(); ++i) {
      OROCHI_RETURN_IF_ERROR(
          CheckTensor("input", (*inputs)[i], i, {"name", "datatype", "shape", "parameters", "data"},
                      {"binary_data_size", "shared_memory_region", "shared_memory_offset",
                       "shared_memory_byte_size"},
                      "name, datatype, shape, parameters and data",
                      "binary_data_size and shared_memory_region, _offset and _byte_size"));
    }
  }
  if (auto outputs = request.find("outputs"); outputs != request.end() && outputs->is_array()) {
    for (size_t i = 0; i < outputs->size(); ++i) {
      OROCHI_RETURN_IF_ERROR(CheckTensor(
          "output", (*outputs)[i], i, {"name", "parameters"},
          {"binary_data", "classification", "shared_memory_region", "shared_memory_offset",
           "shared_memory_byte_size"},
          "name and parameters",
          "binary_data, classification and shared_memory_region, _offset and _byte_size"));
    }
  }
  return Status::Ok();
}

}  // namespace orochi::server::kserve

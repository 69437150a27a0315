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
#include <type_traits>
#include <utility>

#include "orochi/base/check.h"
#include "orochi/engine/dtype.h"
#include "orochi/engine/error.h"
#include "orochi/server/kserve_codec.h"
#include "request_json.h"
#include "unsupported_fields.h"

namespace orochi::server::kserve {
namespace {

using interpreters::BytesTensor;
using interpreters::NamedTensor;
using packaging::DataType;
using packaging::Manifest;
using packaging::TensorSpec;

Status Bad(const std::string& message) { return InvalidArgument(message); }

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
    if (name == "timeout" || name == "binary_data_output") continue;
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

bool BinaryRequested(const Json& parameters) {
  auto found = parameters.find("binary_data");
  return found != parameters.end() && found->is_boolean() && found->get<bool>();
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
      if (!output->is_boolean()) return Bad("parameter 'binary_data_output' must be a boolean");
      request.all_outputs_binary = output->get<bool>();
    }
    OROCHI_ASSIGN_OR_RETURN(request.parameters, ModelParameters(*parameters));
  }
  auto inputs = json.find("inputs");
  if (inputs == json.end() || !inputs->is_array()) return Bad("'inputs' must be an array");

  std::map<std::string, const TensorSpec*> specs;
  for (const TensorSpec& spec : manifest.inputs) specs[spec.name] = &spec;
  std::map<std::string, NamedTensor> parsed;
  size_t binary_at = 0;
  for (size_t index = 0; index < inputs->size(); ++index) {
    const Json& input = (*inputs)[index];
    if (!input.is_object()) return Bad("each input must be an object");
    auto name = input.find("name");
    auto datatype = input.find("datatype");
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
    OROCHI_ASSIGN_OR_RETURN(engine::Shape shape, ReadShape(input, input_name));
    OROCHI_RETURN_IF_ERROR(CheckShape(manifest, spec, shape));

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
    // Both would leave one of them unread: which one the client meant is a guess.
    if (binary_size &&
        (input.contains("data") || (index < read.data.size() && read.data[index] != nullptr))) {
      return Bad("input '" + input_name +
                 "' has both 'data' and binary_data_size: send its values one way");
    }
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
      std::unique_ptr<TensorData> data =
          index < read.data.size() ? std::move(read.data[index]) : nullptr;
      if (data == nullptr) {  // the document kept it: not an array
        auto in_document = input.find("data");
        if (in_document == input.end()) {
          return Bad("input '" + input_name + "' has neither 'data' nor binary_data_size");
        }
        data = TensorData::For(spec, std::nullopt);
        data->Feed(*in_document);
      }
      OROCHI_ASSIGN_OR_RETURN(tensor.value, data->Finish(shape));
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
      if (!known) {  // before OutputSpec, which wants a declared name
        return Bad("unexpected requested output '" + output_name + "' for model '" + manifest.name +
                   "'");
      }
      // Asked twice, e.g. with two classifications, one answer would silently override the other.
      if (std::find(request.outputs.begin(), request.outputs.end(), output_name) !=
          request.outputs.end()) {
        return Bad("output '" + output_name + "' is requested twice");
      }
      request.outputs.push_back(output_name);
      auto parameters = output.find("parameters");
      if (parameters == output.end() || !parameters->is_object()) continue;
      if (auto binary_data = parameters->find("binary_data"); binary_data != parameters->end()) {
        if (!binary_data->is_boolean()) {
          return Bad("output '" + output_name + "': binary_data must be a boolean");
        }
      }
      if (BinaryRequested(*parameters)) request.binary_outputs.insert(output_name);
      if (auto classes = parameters->find("classification"); classes != parameters->end()) {
        // A count past INT64_MAX (read as unsigned) is still a positive count: all classes.
        const bool positive = classes->is_number_unsigned()
                                  ? classes->get<uint64_t>() >= 1
                                  : classes->is_number_integer() && classes->get<int64_t>() >= 1;
        if (!positive) {
          return Bad("output '" + output_name +
                     "': classification must be a positive integer (how many classes to return)");
        }
        if (OutputSpec(manifest, output_name).datatype == DataType::kBytes) {
          return Bad("output '" + output_name +
                     "' is BYTES: classification needs an output of scores");
        }
        request.classification[output_name] =
            classes->is_number_unsigned()
                ? static_cast<int64_t>(std::min<uint64_t>(classes->get<uint64_t>(), INT64_MAX))
                : classes->get<int64_t>();
      }
    }
  }
  return request;
}

}  // namespace

Result<InferRequest> ParseInferRequest(const Manifest& manifest, std::string_view body,
                                       std::optional<size_t> json_length,
                                       const ParseLimits& limits) {
  // A tensor that cannot be allocated is a request too large for the server now, not a crash.
  try {
    return ReadInferRequest(manifest, body, json_length, limits);
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kResourceExhausted,
                  "the request needs more memory than the server can allocate");
  } catch (const engine::Error& error) {
    return error.status();
  }
}

EncodedResponse EncodeInferResponse(const Manifest& manifest, const InferRequest& request,
                                    const std::vector<NamedTensor>& outputs,
                                    const OutputLabels& labels) {
  // Written straight into the body: a document node per value would take many times the
  // tensor's size for the large outputs that matter.
  auto selected = [&](const std::string& name) {
    return request.outputs.empty() ||
           std::find(request.outputs.begin(), request.outputs.end(), name) != request.outputs.end();
  };
  auto as_binary = [&](const std::string& name) {
    return request.all_outputs_binary || request.binary_outputs.count(name) != 0;
  };
  std::string json;
  std::string binary;
  size_t values = 0;  // to be written as JSON
  for (const NamedTensor& output : outputs) {
    const auto* tensor = std::get_if<engine::Tensor>(&output.value);
    if (tensor != nullptr && selected(output.name) && !as_binary(output.name) &&
        request.classification.count(output.name) == 0) {
      values += static_cast<size_t>(tensor->numel());
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
  for (size_t i = 0; i < outputs.size() && i < manifest.outputs.size(); ++i) {
    const NamedTensor& output = outputs[i];
    const TensorSpec& spec = manifest.outputs[i];
    if (!selected(output.name)) continue;
    const bool binary_output = as_binary(output.name);
    std::optional<BytesTensor> classes;
    if (auto count = request.classification.find(output.name);
        count != request.classification.end()) {
      auto names = labels.find(output.name);
      classes = Classify(std::get<engine::Tensor>(output.value), count->second,
                         names == labels.end() ? nullptr : &names->second);
    }
    json += first ? "{" : ",{";
    first = false;
    json += "\"name\":" + Quoted(output.name) + ",\"datatype\":\"" +
            std::string(DataTypeName(classes ? DataType::kBytes : spec.datatype)) + "\",\"shape\":";
    const size_t binary_before = binary.size();
    const BytesTensor* bytes = classes ? &*classes : std::get_if<BytesTensor>(&output.value);
    if (bytes != nullptr) {
      json += Json(bytes->shape).dump();
      if (binary_output) {
        for (const std::string& item : bytes->items) {
          auto length = static_cast<uint32_t>(item.size());
          binary.append(reinterpret_cast<const char*>(&length), 4);
          binary += item;
        }
      } else {
        json += ",\"data\":[";
        for (size_t k = 0; k < bytes->items.size(); ++k) {
          if (k > 0) json += ',';
          json += Quoted(bytes->items[k]);
        }
        json += ']';
      }
    } else {
      const engine::Tensor tensor = std::get<engine::Tensor>(output.value).Contiguous();
      json += Json(tensor.shape()).dump();
      if (binary_output) {
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
    if (binary_output) {
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

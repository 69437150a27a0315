#include "infer_codec.h"

#include <google/protobuf/reflection.h>
#include <google/protobuf/unknown_field_set.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string_view>
#include <utility>

#include "kserve/request_json.h"
#include "kserve/unsupported_fields.h"
#include "orochi/engine/error.h"

namespace orochi::server::grpc_api {
namespace {

using inference::InferParameter;
using inference::InferTensorContents;
using interpreters::NamedTensor;
using packaging::DataType;
using packaging::TensorSpec;
using ParameterMap = google::protobuf::Map<std::string, InferParameter>;

Status Bad(const std::string& message) { return InvalidArgument(message); }

Result<kserve::InferRequest> ReadChecked(const packaging::Manifest& manifest,
                                         const inference::ModelInferRequest& message);

// Parameters that belong to HTTP or to shared memory (which gRPC does not serve here): refused
// by name rather than passed to the model as if they were its own, which would drop their
// meaning without a word. Triton's reserved ones are refused as HTTP refuses them.
constexpr std::string_view kUnimplementedRequestParameters[] = {"binary_data_output"};
constexpr std::string_view kUnimplementedTensorParameters[] = {"binary_data", "binary_data_size"};
constexpr std::string_view kSharedMemoryParameters[] = {
    "shared_memory_region", "shared_memory_offset", "shared_memory_byte_size"};

template <size_t N>
bool Listed(const std::string_view (&names)[N], const std::string& name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

// A parameter of a feature this server does not serve over gRPC (`what`: where it was, or empty).
Status UnimplementedParameter(const std::string& what, const std::string& name) {
  std::string message = what.empty() ? "" : what + ": ";
  if (name.starts_with("binary_data")) {
    message += "parameter '" + name +
               "' belongs to HTTP's binary extension; over gRPC, send values in "
               "raw_input_contents (outputs always come back in raw_output_contents)";
  } else {
    message += "parameter '" + name + "' is not supported by this server";
  }
  return Unimplemented(std::move(message));
}

// An integer parameter that must be >= `minimum`, as int64 or uint64 (clients send either).
Result<int64_t> IntegerParameter(const InferParameter& value, const std::string& what,
                                 int64_t minimum) {
  int64_t number = 0;
  if (value.parameter_choice_case() == InferParameter::kInt64Param) {
    number = value.int64_param();
  } else if (value.parameter_choice_case() == InferParameter::kUint64Param) {
    number = static_cast<int64_t>(
        std::min<uint64_t>(value.uint64_param(), std::numeric_limits<int64_t>::max()));
  } else {
    return Bad(what + " must be an integer (int64_param or uint64_param)");
  }
  if (number < minimum) return Bad(what + " must be at least " + std::to_string(minimum));
  return number;
}

Result<interpreters::ParameterValue> ModelParameter(const std::string& name,
                                                    const InferParameter& value) {
  switch (value.parameter_choice_case()) {
    case InferParameter::kBoolParam:
      return interpreters::ParameterValue(value.bool_param());
    case InferParameter::kInt64Param:
      return interpreters::ParameterValue(value.int64_param());
    case InferParameter::kUint64Param:
      // As JSON reads it: past int64, a double.
      if (value.uint64_param() <= uint64_t{INT64_MAX}) {
        return interpreters::ParameterValue(static_cast<int64_t>(value.uint64_param()));
      }
      return interpreters::ParameterValue(static_cast<double>(value.uint64_param()));
    case InferParameter::kDoubleParam:
      return interpreters::ParameterValue(value.double_param());
    case InferParameter::kStringParam:
      return interpreters::ParameterValue(value.string_param());
    case InferParameter::PARAMETER_CHOICE_NOT_SET:
      break;
  }
  return Bad("parameter '" + name + "' has no value");
}

// A parameter's value for InferRequestBuilder::SequenceParameter.
kserve::InferRequestBuilder::WireValue WireValueOf(const InferParameter& value) {
  switch (value.parameter_choice_case()) {
    case InferParameter::kBoolParam:
      return value.bool_param();
    case InferParameter::kInt64Param:
      return value.int64_param();
    case InferParameter::kUint64Param:
      return value.uint64_param();
    case InferParameter::kDoubleParam:
      return value.double_param();
    case InferParameter::kStringParam:
      return value.string_param();
    case InferParameter::PARAMETER_CHOICE_NOT_SET:
      break;
  }
  return std::monostate();
}

// Triton's shared-memory parameters of a tensor (`what`, for errors): nullopt when it has none,
// else all that it needs, or an error naming what is missing; the other parameters are
// refused by name.
Result<std::optional<kserve::SharedMemoryRef>> ReadTensorParameters(
    const ParameterMap& parameters, const std::string& what,
    std::initializer_list<std::string_view> also_allowed) {
  using Found = std::optional<kserve::SharedMemoryRef>;
  for (const auto& [name, value] : parameters) {
    if (Listed(kSharedMemoryParameters, name) ||
        std::find(also_allowed.begin(), also_allowed.end(), name) != also_allowed.end()) {
      continue;
    }
    if (Listed(kUnimplementedTensorParameters, name)) return UnimplementedParameter(what, name);
    std::string message = what;
    message += ": parameter '";
    message += name;
    message += "' is not a parameter this server knows";
    return Bad(message);
  }
  auto region = parameters.find("shared_memory_region");
  auto offset = parameters.find("shared_memory_offset");
  auto size = parameters.find("shared_memory_byte_size");
  if (region == parameters.end()) {
    if (offset != parameters.end() || size != parameters.end()) {
      return Bad(what +
                 ": shared_memory_offset and shared_memory_byte_size need shared_memory_region "
                 "(the name of a registered region)");
    }
    return Found();
  }
  if (region->second.parameter_choice_case() != InferParameter::kStringParam ||
      region->second.string_param().empty()) {
    return Bad(what +
               ": shared_memory_region must be the name of a registered region "
               "(string_param)");
  }
  if (size == parameters.end()) {
    return Bad(what + ": shared_memory_region needs shared_memory_byte_size");
  }
  kserve::SharedMemoryRef ref;
  ref.region = region->second.string_param();
  OROCHI_ASSIGN_OR_RETURN(int64_t byte_size,
                          IntegerParameter(size->second, what + ": shared_memory_byte_size", 0));
  ref.byte_size = static_cast<uint64_t>(byte_size);
  if (offset != parameters.end()) {
    OROCHI_ASSIGN_OR_RETURN(int64_t at,
                            IntegerParameter(offset->second, what + ": shared_memory_offset", 0));
    ref.offset = static_cast<uint64_t>(at);
  }
  return Found(std::move(ref));
}

// The one contents field a datatype's values travel in, and how many values each holds.
int ContentsField(DataType datatype) {
  switch (datatype) {
    case DataType::kBool:
      return InferTensorContents::kBoolContentsFieldNumber;
    case DataType::kInt8:
    case DataType::kInt16:
    case DataType::kInt32:
      return InferTensorContents::kIntContentsFieldNumber;
    case DataType::kInt64:
      return InferTensorContents::kInt64ContentsFieldNumber;
    case DataType::kUInt8:
      return InferTensorContents::kUintContentsFieldNumber;
    case DataType::kFp32:
      return InferTensorContents::kFp32ContentsFieldNumber;
    case DataType::kFp64:
      return InferTensorContents::kFp64ContentsFieldNumber;
    case DataType::kBytes:
      return InferTensorContents::kBytesContentsFieldNumber;
    case DataType::kFp16:
    case DataType::kBf16:
      return 0;  // no typed field: raw contents only
  }
  return 0;
}

// Typed contents into a tensor, through the converter that reads JSON values: the same range
// checks and the same errors.
Result<NamedTensor> FromContents(const TensorSpec& spec, const engine::Shape& shape,
                                 const InferTensorContents& contents) {
  const int field = ContentsField(spec.datatype);
  if (field == 0) {
    return Bad("input '" + spec.name + "' is " + std::string(DataTypeName(spec.datatype)) +
               ", which has no typed contents field: send it in raw_input_contents");
  }
  const auto* reflection = contents.GetReflection();
  const auto* descriptor = contents.GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const auto* other = descriptor->field(i);
    if (other->number() != field && reflection->FieldSize(contents, other) > 0) {
      return Bad("input '" + spec.name + "' is " + std::string(DataTypeName(spec.datatype)) +
                 ", but its values are in contents." + other->name() + " (expected contents." +
                 descriptor->FindFieldByNumber(field)->name() + ")");
    }
  }
  std::unique_ptr<kserve::TensorData> data = kserve::TensorData::For(spec, shape);
  data->StartArray();
  switch (field) {
    case InferTensorContents::kBoolContentsFieldNumber:
      for (bool value : contents.bool_contents()) data->Bool(value);
      break;
    case InferTensorContents::kIntContentsFieldNumber:
      for (int32_t value : contents.int_contents()) data->Integer(value);
      break;
    case InferTensorContents::kInt64ContentsFieldNumber:
      for (int64_t value : contents.int64_contents()) data->Integer(value);
      break;
    case InferTensorContents::kUintContentsFieldNumber:
      for (uint32_t value : contents.uint_contents()) data->Unsigned(value);
      break;
    case InferTensorContents::kFp32ContentsFieldNumber:
      for (float value : contents.fp32_contents()) data->Float(value);
      break;
    case InferTensorContents::kFp64ContentsFieldNumber:
      for (double value : contents.fp64_contents()) data->Float(value);
      break;
    case InferTensorContents::kBytesContentsFieldNumber:
      for (const std::string& value : contents.bytes_contents()) data->String(std::string(value));
      break;
    default:
      break;
  }
  data->EndArray();
  NamedTensor tensor{spec.name, engine::Tensor()};
  OROCHI_ASSIGN_OR_RETURN(tensor.value, data->Finish(shape));
  return tensor;
}

// The number of the first field `message` carries that the schema does not declare, or 0.
int FirstUnknown(const google::protobuf::Message& message) {
  const google::protobuf::UnknownFieldSet& unknown =
      message.GetReflection()->GetUnknownFields(message);
  return unknown.empty() ? 0 : unknown.field(0).number();
}

// The same through a parameter map's values, named "parameters[key].N".
std::string UnknownInParameters(const ParameterMap& parameters, const std::string& prefix) {
  for (const auto& [name, value] : parameters) {
    if (int number = FirstUnknown(value); number != 0) {
      std::string path = prefix;
      path += "parameters[";
      path += name;
      path += "].";
      path += std::to_string(number);
      return path;
    }
  }
  return {};
}

}  // namespace

std::string UnknownFieldPath(const inference::ModelInferRequest& message) {
  // Walked through the generated accessors rather than reflection, which would build map
  // entries for every parameter map of every request.
  if (int number = FirstUnknown(message); number != 0) return std::to_string(number);
  if (std::string found = UnknownInParameters(message.parameters(), ""); !found.empty()) {
    return found;
  }
  for (int i = 0; i < message.inputs_size(); ++i) {
    const auto& input = message.inputs(i);
    const std::string prefix = "inputs[" + std::to_string(i) + "].";
    if (int number = FirstUnknown(input); number != 0) return prefix + std::to_string(number);
    if (std::string found = UnknownInParameters(input.parameters(), prefix); !found.empty()) {
      return found;
    }
    if (input.has_contents()) {
      if (int number = FirstUnknown(input.contents()); number != 0) {
        return prefix + "contents." + std::to_string(number);
      }
    }
  }
  for (int i = 0; i < message.outputs_size(); ++i) {
    const auto& output = message.outputs(i);
    const std::string prefix = "outputs[" + std::to_string(i) + "].";
    if (int number = FirstUnknown(output); number != 0) return prefix + std::to_string(number);
    if (std::string found = UnknownInParameters(output.parameters(), prefix); !found.empty()) {
      return found;
    }
  }
  return {};
}

Result<kserve::InferRequest> ReadInferRequest(const packaging::Manifest& manifest,
                                              const inference::ModelInferRequest& message) {
  // A tensor that cannot be allocated is a request too large for the server now, not a crash.
  try {
    return ReadChecked(manifest, message);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("the request needs more memory than the server can allocate");
  } catch (const engine::Error& error) {
    return error.status();
  }
}

namespace {

Result<kserve::InferRequest> ReadChecked(const packaging::Manifest& manifest,
                                         const inference::ModelInferRequest& message) {
  kserve::InferRequestBuilder builder(manifest);
  kserve::InferRequest& request = builder.request();
  request.id = message.id();

  // Sorted by name, as the model's parameters are handed over (a protobuf map has no order).
  std::vector<std::pair<std::string, const InferParameter*>> parameters;
  for (const auto& [name, value] : message.parameters()) parameters.emplace_back(name, &value);
  std::sort(parameters.begin(), parameters.end());
  for (const auto& [name, value] : parameters) {
    if (name == "timeout") {
      OROCHI_ASSIGN_OR_RETURN(int64_t micros,
                              IntegerParameter(*value, "parameter 'timeout' (microseconds)", 0));
      request.timeout = std::chrono::microseconds(micros);
    } else if (kserve::IsReservedParameter(name)) {
      return kserve::RefuseReservedParameter(name);
    } else if (kserve::InferRequestBuilder::IsSequenceParameter(name)) {
      OROCHI_RETURN_IF_ERROR(builder.SequenceParameter(name, WireValueOf(*value)));
    } else if (Listed(kUnimplementedRequestParameters, name)) {
      return UnimplementedParameter("", name);
    } else {
      OROCHI_ASSIGN_OR_RETURN(interpreters::ParameterValue read, ModelParameter(name, *value));
      request.parameters.emplace_back(name, std::move(read));
    }
  }

  // Inputs in shared memory carry no values in the message: raw_input_contents holds those of
  // the others, in order (as Triton's clients send them).
  std::vector<std::optional<kserve::SharedMemoryRef>> shared(message.inputs_size());
  int in_message = 0;
  for (int index = 0; index < message.inputs_size(); ++index) {
    const auto& input = message.inputs(index);
    OROCHI_ASSIGN_OR_RETURN(
        shared[index],
        ReadTensorParameters(input.parameters(), "input '" + input.name() + "'", {}));
    if (!shared[index]) ++in_message;
  }
  const bool raw = message.raw_input_contents_size() > 0;
  if (raw && message.raw_input_contents_size() != in_message) {
    return Bad("raw_input_contents has " + std::to_string(message.raw_input_contents_size()) +
               " entries, but the request has " + std::to_string(in_message) +
               " inputs: send every input's values there, in the order of `inputs` (leaving "
               "out those in shared memory), or none");
  }
  int raw_at = 0;
  for (int index = 0; index < message.inputs_size(); ++index) {
    const auto& input = message.inputs(index);
    OROCHI_ASSIGN_OR_RETURN(
        engine::Shape shape,
        kserve::CheckInputShape({input.shape().begin(), input.shape().end()}, input.name()));
    OROCHI_ASSIGN_OR_RETURN(const TensorSpec* spec,
                            builder.CheckInput(input.name(), input.datatype(), shape));
    if (shared[index]) {
      if (input.has_contents()) {
        return Bad("input '" + input.name() +
                   "' has both shared_memory_region and contents: its values are either in "
                   "shared memory or in the request");
      }
      builder.AddSharedMemoryInput(input.name(), std::move(*shared[index]), shape);
    } else if (raw) {
      if (input.has_contents()) {
        return Bad("input '" + input.name() +
                   "' has contents, but the request also has raw_input_contents: use one or "
                   "the other");
      }
      OROCHI_ASSIGN_OR_RETURN(NamedTensor tensor,
                              builder.FromRaw(*spec, shape, message.raw_input_contents(raw_at++),
                                              "raw_input_contents"));
      builder.AddInput(std::move(tensor));
    } else {
      OROCHI_ASSIGN_OR_RETURN(NamedTensor tensor, FromContents(*spec, shape, input.contents()));
      builder.AddInput(std::move(tensor));
    }
  }

  for (const auto& output : message.outputs()) {
    const std::string what = "output '" + output.name() + "'";
    OROCHI_ASSIGN_OR_RETURN(std::optional<kserve::SharedMemoryRef> shared,
                            ReadTensorParameters(output.parameters(), what, {"classification"}));
    std::optional<int64_t> classes;
    if (auto count = output.parameters().find("classification");
        count != output.parameters().end()) {
      if (shared) {
        return Bad(what +
                   ": classification cannot be written to shared memory; ask for the classes in "
                   "the response, or for the scores in shared memory");
      }
      OROCHI_ASSIGN_OR_RETURN(
          classes, IntegerParameter(count->second,
                                    what + ": classification (how many classes to return)", 1));
    }
    if (shared) {
      OROCHI_RETURN_IF_ERROR(builder.RequestSharedMemoryOutput(output.name(), std::move(*shared)));
    } else {
      OROCHI_RETURN_IF_ERROR(builder.RequestOutput(output.name(), /*binary=*/true, classes));
    }
  }
  return builder.Finish();
}

}  // namespace

void WriteInferResponse(const packaging::Manifest& manifest, const kserve::InferRequest& request,
                        const std::vector<NamedTensor>& outputs, const kserve::OutputLabels& labels,
                        inference::ModelInferResponse* response) {
  response->set_model_name(manifest.name);
  response->set_model_version(std::to_string(manifest.version));
  response->set_id(request.id);
  const kserve::ResponseTensors selected =
      kserve::SelectResponseTensors(manifest, request, outputs, labels);
  for (const kserve::ResponseTensor& output : selected.tensors) {
    auto* tensor = response->add_outputs();
    tensor->set_name(*output.name);
    tensor->set_datatype(std::string(DataTypeName(output.datatype)));
    for (int64_t size : output.shape) tensor->add_shape(size);
    std::string* raw = response->add_raw_output_contents();
    size_t bytes = 0;
    if (output.tensor != nullptr) {
      bytes =
          static_cast<size_t>(output.tensor->numel()) * engine::ItemSize(output.tensor->dtype());
    } else {
      for (const std::string& item : output.bytes->items) bytes += 4 + item.size();
    }
    if (output.shared_memory != nullptr) {
      // In the region already (WriteSharedMemoryOutputs): where, and how many bytes. Its raw
      // entry stays empty, so that the others keep their positions (clients index
      // raw_output_contents as `outputs`).
      auto& parameters = *tensor->mutable_parameters();
      parameters["shared_memory_region"].set_string_param(output.shared_memory->region);
      parameters["shared_memory_offset"].set_uint64_param(output.shared_memory->offset);
      parameters["shared_memory_byte_size"].set_uint64_param(bytes);
    } else if (output.bytes != nullptr) {
      raw->reserve(bytes);
      for (const std::string& item : output.bytes->items) {
        auto length = static_cast<uint32_t>(item.size());
        raw->append(reinterpret_cast<const char*>(&length), 4);
        raw->append(item);
      }
    } else {
      raw->assign(static_cast<const char*>(output.tensor->data()), bytes);
    }
  }
}

}  // namespace orochi::server::grpc_api

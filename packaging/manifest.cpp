#include "orochi/packaging/manifest.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace orochi::packaging {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxNameBytes = 128;

Status Problem(const std::string& path, const std::string& message) {
  return InvalidArgument("manifest.json: " + path + ": " + message);
}

std::string TypeName(const Json& value) { return value.type_name(); }

bool IsIdentifierPath(std::string_view text) {
  if (text.empty()) return false;
  bool start = true;
  for (char c : text) {
    bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    bool digit = c >= '0' && c <= '9';
    if (c == '.') {
      if (start) return false;
      start = true;
    } else if (letter || (digit && !start)) {
      start = false;
    } else {
      return false;
    }
  }
  return !start;
}

// "labels.txt", "classes/imagenet.txt": relative, no empty, "." or ".." parts.
bool IsResourcePath(std::string_view path) {
  if (path.empty() || path.front() == '/') return false;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t end = std::min(path.find('/', start), path.size());
    const std::string_view part = path.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

Result<std::string> String(const Json& object, const std::string& path, const char* key,
                           bool required) {
  auto found = object.find(key);
  if (found == object.end()) {
    if (required) return Problem(path, std::string("missing required key '") + key + "'");
    return std::string();
  }
  if (!found->is_string()) {
    return Problem(path + "." + key, "expected a string, got " + TypeName(*found));
  }
  return found->get<std::string>();
}

Result<std::optional<int64_t>> Integer(const Json& object, const std::string& path, const char* key,
                                       int64_t minimum) {
  auto found = object.find(key);
  if (found == object.end()) return std::optional<int64_t>();
  if (!found->is_number_integer()) {
    return Problem(path + "." + key, "expected an integer, got " + TypeName(*found));
  }
  if (found->is_number_unsigned() &&
      found->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Problem(path + "." + key, "expected an integer that fits in 64 bits, got " +
                                         std::to_string(found->get<uint64_t>()));
  }
  auto value = found->get<int64_t>();
  if (value < minimum) {
    return Problem(path + "." + key, "expected an integer >= " + std::to_string(minimum) +
                                         ", got " + std::to_string(value));
  }
  return std::optional<int64_t>(value);
}

Status OnlyKeys(const Json& object, const std::string& path,
                std::initializer_list<const char*> keys) {
  for (const auto& [key, value] : object.items()) {
    bool known = false;
    for (const char* allowed : keys) known = known || key == allowed;
    if (!known) return Problem(std::string(path).append(".").append(key), "unknown key");
  }
  return Status::Ok();
}

Result<std::vector<TensorSpec>> Tensors(const Json& manifest, const char* key) {
  const std::string path = std::string("$.") + key;
  auto found = manifest.find(key);
  if (found == manifest.end()) {
    return Problem("$", std::string("missing required key '") + key + "'");
  }
  if (!found->is_array() || found->empty()) {
    return Problem(path, "expected a non-empty array of tensor descriptions");
  }
  std::vector<TensorSpec> specs;
  std::set<std::string> names;
  for (size_t i = 0; i < found->size(); ++i) {
    const Json& entry = (*found)[i];
    const std::string at = path + "[" + std::to_string(i) + "]";
    if (!entry.is_object()) return Problem(at, "expected an object, got " + TypeName(entry));
    const bool output = std::string_view(key) == "outputs";
    OROCHI_RETURN_IF_ERROR(output ? OnlyKeys(entry, at, {"name", "datatype", "shape", "labels"})
                                  : OnlyKeys(entry, at, {"name", "datatype", "shape"}));
    TensorSpec spec;
    OROCHI_ASSIGN_OR_RETURN(spec.name, String(entry, at, "name", true));
    if (!IsName(spec.name)) {
      return Problem(at + ".name", "'" + spec.name +
                                       "' is not a valid tensor name (letters, digits, '_', '.', "
                                       "'-', starting with a letter or digit)");
    }
    if (!names.insert(spec.name).second) {
      return Problem(at + ".name", "duplicate tensor name '" + spec.name + "'");
    }
    OROCHI_ASSIGN_OR_RETURN(std::string datatype, String(entry, at, "datatype", true));
    if (!ParseDataType(datatype, &spec.datatype)) {
      std::string hint =
          datatype.starts_with("UINT") ? " (UINT16, UINT32 and UINT64 have no engine dtype)" : "";
      std::string message = "unknown datatype '" + datatype + "'";
      message += hint;
      message +=
          "; expected BOOL, UINT8, INT8, INT16, INT32, INT64, FP16, BF16, FP32, FP64 or "
          "BYTES";
      return Problem(at + ".datatype", message);
    }
    auto shape = entry.find("shape");
    if (shape == entry.end()) return Problem(at, "missing required key 'shape'");
    if (!shape->is_array()) return Problem(at + ".shape", "expected an array of integers");
    for (size_t d = 0; d < shape->size(); ++d) {
      const Json& dim = (*shape)[d];
      const std::string dim_path = at + ".shape[" + std::to_string(d) + "]";
      if (!dim.is_number_integer() || (dim.get<int64_t>() < 1 && dim.get<int64_t>() != -1)) {
        return Problem(dim_path, "expected an integer >= 1 or -1, got " + dim.dump());
      }
      spec.shape.push_back(dim.get<int64_t>());
    }
    if (output) {
      OROCHI_ASSIGN_OR_RETURN(spec.labels, String(entry, at, "labels", false));
      if (entry.contains("labels") && !IsResourcePath(spec.labels)) {
        return Problem(at + ".labels", "'" + spec.labels +
                                           "' is not a path below resources/ (relative, "
                                           "without '..')");
      }
      if (!spec.labels.empty() && spec.datatype == DataType::kBytes) {
        return Problem(at + ".labels", "a BYTES output has no scores to label");
      }
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

// A parse callback that finds the first key given twice in one object, which nlohmann would
// otherwise resolve silently by keeping the last value: which of two "inputs" did the author
// mean? It follows the parse to name the object by its JSON path.
//
// Past kMostNesting levels it follows nothing more and reports the depth instead: each level
// keeps its path, so a manifest of 60 KB nested 30,000 deep once held 1.8 GB of paths.
class DuplicateKeyFinder {
 public:
  static constexpr size_t kMostNesting = 64;

  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    const bool starts =
        event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start;
    const bool ends =
        event == Json::parse_event_t::object_end || event == Json::parse_event_t::array_end;
    if (levels_past_limit_ > 0 || (starts && containers_.size() == kMostNesting)) {
      if (starts && levels_past_limit_++ == 0 && too_deep_.ok()) {
        too_deep_ =
            Problem(containers_.back().path, "nested deeper than " + std::to_string(kMostNesting) +
                                                 " levels of objects and arrays");
      }
      if (ends && levels_past_limit_ > 0) --levels_past_limit_;
      if (levels_past_limit_ > 0 || ends) return true;
    }
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        containers_.push_back({PathOfNextValue(), event == Json::parse_event_t::object_start});
        break;
      case Json::parse_event_t::key: {
        Container& object = containers_.back();
        object.key = parsed.get<std::string>();
        if (!object.keys.insert(object.key).second && duplicate_.ok()) {
          duplicate_ = Problem(object.path, "the key '" + object.key + "' appears more than once");
        }
        break;
      }
      case Json::parse_event_t::value:
        PathOfNextValue();  // counts the item of an array
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        containers_.pop_back();
        break;
    }
    return true;
  }

  const Status& duplicate() const { return duplicate_; }
  const Status& too_deep() const { return too_deep_; }

 private:
  struct Container {
    std::string path;
    bool is_object = false;
    std::set<std::string> keys;  // of an object, so far
    std::string key;             // of an object: the key of the value being parsed
    size_t items = 0;            // of an array: the items begun so far
  };

  // The path of the value that begins now; an array counts it as its next item.
  std::string PathOfNextValue() {
    if (containers_.empty()) return "$";
    Container& parent = containers_.back();
    if (parent.is_object) return parent.path + "." + parent.key;
    return parent.path + "[" + std::to_string(parent.items++) + "]";
  }

  std::vector<Container> containers_;
  Status duplicate_;
  size_t levels_past_limit_ = 0;  // containers begun past kMostNesting and not yet ended
  Status too_deep_;
};

// The "sequence" key of a stateful model. Its requests run one at a time in the copy that holds
// their sequence's state, so it neither batches nor streams (both would need a state per row or
// per response that the sequence contract does not have).
Result<std::optional<Manifest::Sequence>> SequenceSettings(const Json& json,
                                                           const Manifest& manifest) {
  auto found = json.find("sequence");
  if (found == json.end()) return std::optional<Manifest::Sequence>();
  if (!found->is_object()) {
    return Problem("$.sequence", "expected an object, got " + TypeName(*found));
  }
  OROCHI_RETURN_IF_ERROR(
      OnlyKeys(*found, "$.sequence", {"idle_timeout_ms", "max_sequences_per_copy"}));
  if (manifest.streaming) {
    return Problem("$.sequence",
                   "a streaming model cannot also be stateful (\"sequence\"): its streams "
                   "already keep their state for as long as they run");
  }
  if (manifest.max_batch_size != 0) {
    return Problem("$.max_batch_size",
                   "a stateful model (\"sequence\") runs each request alone with its "
                   "sequence's state: max_batch_size must be 0, got " +
                       std::to_string(manifest.max_batch_size));
  }
  Manifest::Sequence sequence;
  OROCHI_ASSIGN_OR_RETURN(sequence.idle_timeout_ms,
                          Integer(*found, "$.sequence", "idle_timeout_ms", 1));
  OROCHI_ASSIGN_OR_RETURN(sequence.max_sequences_per_copy,
                          Integer(*found, "$.sequence", "max_sequences_per_copy", 1));
  return std::optional<Manifest::Sequence>(sequence);
}

// The "openai" key: which input takes the prompt and which output carries the text. Both must be
// BYTES of one element, and the prompt input the model's only one (an OpenAI request has nothing
// to give another).
Result<std::optional<Manifest::OpenAi>> OpenAiMapping(const Json& json, const Manifest& manifest) {
  auto found = json.find("openai");
  if (found == json.end()) return std::optional<Manifest::OpenAi>();
  if (!found->is_object()) {
    return Problem("$.openai", "expected an object, got " + TypeName(*found));
  }
  OROCHI_RETURN_IF_ERROR(OnlyKeys(*found, "$.openai", {"text_input", "text_output", "tokens"}));
  if (!manifest.streaming) {
    return Problem("$.openai",
                   "only a streaming model (\"streaming\": true) is served on the "
                   "OpenAI-compatible endpoint");
  }
  Manifest::OpenAi mapping;
  if (found->contains("text_input")) {
    OROCHI_ASSIGN_OR_RETURN(mapping.text_input, String(*found, "$.openai", "text_input", true));
  }
  if (found->contains("text_output")) {
    OROCHI_ASSIGN_OR_RETURN(mapping.text_output, String(*found, "$.openai", "text_output", true));
  }
  if (found->contains("tokens")) {
    OROCHI_ASSIGN_OR_RETURN(std::string tokens, String(*found, "$.openai", "tokens", true));
    if (tokens != "bytes") {
      return Problem("$.openai.tokens",
                     "expected \"bytes\" (one token per byte of UTF-8), got '" + tokens + "'");
    }
    mapping.byte_tokens = true;
  }
  auto one_text = [](const std::vector<TensorSpec>& specs, const std::string& name) {
    return std::any_of(specs.begin(), specs.end(), [&](const TensorSpec& spec) {
      return spec.name == name && spec.datatype == DataType::kBytes && spec.shape.size() == 1 &&
             (spec.shape[0] == 1 || spec.shape[0] == -1);
    });
  };
  if (!one_text(manifest.inputs, mapping.text_input) || manifest.inputs.size() != 1) {
    return Problem("$.openai.text_input",
                   "'" + mapping.text_input +
                       "' must be the model's only input, BYTES of shape [1]: an OpenAI request "
                       "gives a prompt and nothing else");
  }
  if (!one_text(manifest.outputs, mapping.text_output)) {
    return Problem(
        "$.openai.text_output",
        "'" + mapping.text_output + "' must be an output of the model, BYTES of shape [1]");
  }
  return std::optional<Manifest::OpenAi>(mapping);
}

}  // namespace

std::string_view DataTypeName(DataType datatype) {
  switch (datatype) {
#define OROCHI_DATATYPE_NAME(name, text, dtype) \
  case DataType::name:                          \
    return text;
    OROCHI_PACKAGE_DATATYPES(OROCHI_DATATYPE_NAME)
#undef OROCHI_DATATYPE_NAME
  }
  return "?";
}

bool ParseDataType(std::string_view text, DataType* datatype) {
#define OROCHI_DATATYPE_PARSE(name, spelling, dtype) \
  if (text == (spelling)) {                          \
    *datatype = DataType::name;                      \
    return true;                                     \
  }
  OROCHI_PACKAGE_DATATYPES(OROCHI_DATATYPE_PARSE)
#undef OROCHI_DATATYPE_PARSE
  return false;
}

std::optional<engine::DType> EngineDType(DataType datatype) {
  if (datatype == DataType::kBytes) return std::nullopt;
  switch (datatype) {
#define OROCHI_DATATYPE_DTYPE(name, text, dtype) \
  case DataType::name:                           \
    return dtype;
    OROCHI_PACKAGE_DATATYPES(OROCHI_DATATYPE_DTYPE)
#undef OROCHI_DATATYPE_DTYPE
  }
  return std::nullopt;
}

bool IsName(std::string_view text) {
  if (text.empty() || text.size() > kMaxNameBytes) return false;
  auto alnum = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  };
  if (!alnum(text.front())) return false;
  for (char c : text) {
    if (!alnum(c) && c != '_' && c != '.' && c != '-') return false;
  }
  return true;
}

Result<Manifest> ParseManifest(std::string_view text) {
  // nlohmann skips a byte order mark, which JSON (RFC 8259) does not allow in what is written;
  // refused, so that every tool that reads the package reads the same text.
  if (text.starts_with("\xEF\xBB\xBF")) {
    return Problem("$",
                   "the file starts with a UTF-8 byte order mark (BOM); save it as UTF-8 without "
                   "one");
  }
  DuplicateKeyFinder duplicates;
  Json json = Json::parse(text.begin(), text.end(), std::ref(duplicates),
                          /*allow_exceptions=*/false);
  if (json.is_discarded()) return Problem("$", "not valid JSON");
  OROCHI_RETURN_IF_ERROR(duplicates.too_deep());
  OROCHI_RETURN_IF_ERROR(duplicates.duplicate());
  if (!json.is_object()) return Problem("$", "expected a JSON object, got " + TypeName(json));
  OROCHI_RETURN_IF_ERROR(
      OnlyKeys(json, "$",
               {"format_version", "name", "version", "entry", "description", "inputs", "outputs",
                "max_batch_size", "instances", "device", "requires", "parameters",
                "max_request_bytes", "streaming", "max_live_sequences", "openai", "sequence"}));
  Manifest manifest;
  OROCHI_ASSIGN_OR_RETURN(std::optional<int64_t> format, Integer(json, "$", "format_version", 1));
  if (!format) return Problem("$", "missing required key 'format_version'");
  if (*format != kManifestFormatVersion) {
    return Problem("$.format_version", "this Orochi reads format version " +
                                           std::to_string(kManifestFormatVersion) + ", got " +
                                           std::to_string(*format));
  }
  OROCHI_ASSIGN_OR_RETURN(manifest.name, String(json, "$", "name", true));
  if (!IsName(manifest.name)) {
    return Problem("$.name", "'" + manifest.name +
                                 "' is not a valid model name (1-128 letters, digits, '_', '.', "
                                 "'-', starting with a letter or digit)");
  }
  OROCHI_ASSIGN_OR_RETURN(std::optional<int64_t> version, Integer(json, "$", "version", 1));
  if (!version) return Problem("$", "missing required key 'version'");
  manifest.version = *version;
  OROCHI_ASSIGN_OR_RETURN(std::string entry, String(json, "$", "entry", true));
  size_t colon = entry.find(':');
  if (colon == std::string::npos || !IsIdentifierPath(entry.substr(0, colon)) ||
      !IsIdentifierPath(entry.substr(colon + 1))) {
    return Problem("$.entry", "expected 'module:Class' (dotted Python names), got '" + entry + "'");
  }
  manifest.entry_module = entry.substr(0, colon);
  manifest.entry_class = entry.substr(colon + 1);
  OROCHI_ASSIGN_OR_RETURN(manifest.description, String(json, "$", "description", false));
  OROCHI_ASSIGN_OR_RETURN(manifest.inputs, Tensors(json, "inputs"));
  OROCHI_ASSIGN_OR_RETURN(manifest.outputs, Tensors(json, "outputs"));
  OROCHI_ASSIGN_OR_RETURN(std::optional<int64_t> batch, Integer(json, "$", "max_batch_size", 0));
  manifest.max_batch_size = batch.value_or(0);
  OROCHI_ASSIGN_OR_RETURN(manifest.instances, Integer(json, "$", "instances", 1));
  if (auto streaming = json.find("streaming"); streaming != json.end()) {
    if (!streaming->is_boolean()) {
      return Problem("$.streaming", "expected true or false, got " + TypeName(*streaming));
    }
    manifest.streaming = streaming->get<bool>();
  }
  if (manifest.streaming && manifest.max_batch_size != 0) {
    return Problem("$.max_batch_size",
                   "a streaming model takes no batch dimension (its requests are batched step by "
                   "step through the step interface instead): max_batch_size must be 0, got " +
                       std::to_string(manifest.max_batch_size));
  }
  OROCHI_ASSIGN_OR_RETURN(std::optional<int64_t> live, Integer(json, "$", "max_live_sequences", 1));
  if (live && !manifest.streaming) {
    return Problem("$.max_live_sequences",
                   "only a streaming model (\"streaming\": true) has live sequences");
  }
  manifest.max_live_sequences = live.value_or(16);
  OROCHI_ASSIGN_OR_RETURN(manifest.max_request_bytes, Integer(json, "$", "max_request_bytes", 1));
  if (json.contains("device")) {
    OROCHI_ASSIGN_OR_RETURN(manifest.device, String(json, "$", "device", true));
    bool cuda = manifest.device.starts_with("cuda") &&
                (manifest.device.size() == 4 ||
                 (manifest.device[4] == ':' && manifest.device.size() > 5 &&
                  manifest.device.find_first_not_of("0123456789", 5) == std::string::npos));
    if (manifest.device != "cpu" && !cuda) {
      return Problem("$.device",
                     "expected 'cpu', 'cuda' or 'cuda:N', got '" + manifest.device + "'");
    }
  }
  if (auto requires_list = json.find("requires"); requires_list != json.end()) {
    if (!requires_list->is_array()) {
      return Problem("$.requires",
                     "expected an array of Python module names, got " + TypeName(*requires_list));
    }
    for (size_t i = 0; i < requires_list->size(); ++i) {
      const Json& module = (*requires_list)[i];
      std::string path = "$.requires[" + std::to_string(i) + "]";
      if (!module.is_string() || !IsIdentifierPath(module.get<std::string>())) {
        return Problem(path, "expected a Python module name such as 'numpy', got " + module.dump());
      }
      const auto& name = module.get_ref<const std::string&>();
      if (std::find(manifest.required_modules.begin(), manifest.required_modules.end(), name) !=
          manifest.required_modules.end()) {
        return Problem(path, "'" + name + "' is listed twice");
      }
      manifest.required_modules.push_back(name);
    }
  }
  if (auto parameters = json.find("parameters"); parameters != json.end()) {
    if (!parameters->is_object()) {
      return Problem("$.parameters", "expected an object, got " + TypeName(*parameters));
    }
    for (const auto& [key, value] : parameters->items()) {
      if (!value.is_string() && !value.is_number() && !value.is_boolean()) {
        return Problem("$.parameters." + key,
                       "expected a string, number or boolean, got " + TypeName(value));
      }
    }
    manifest.parameters_json = parameters->dump();
  }
  OROCHI_ASSIGN_OR_RETURN(manifest.openai, OpenAiMapping(json, manifest));
  OROCHI_ASSIGN_OR_RETURN(manifest.sequence, SequenceSettings(json, manifest));
  manifest.json = json.dump();
  return manifest;
}

}  // namespace orochi::packaging

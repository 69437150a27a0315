// manifest.json: what a model package declares about itself (docs/PACKAGE_FORMAT.md).
//
// ParseManifest checks the whole schema and reports the first problem with its JSON path, e.g.
// "$.inputs[0].shape[1]: expected an integer >= 1 or -1, got 0". Unknown keys are errors, so a
// misspelt key is caught instead of silently ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "orochi/base/status.h"
#include "orochi/engine/dtype.h"

namespace orochi::packaging {

inline constexpr int kManifestFormatVersion = 1;

// KServe v2 tensor datatypes a package may declare. X(enumerator, v2 name, engine dtype); BYTES
// has no engine dtype (it travels as a list of byte strings).
#define OROCHI_PACKAGE_DATATYPES(X)          \
  X(kBool, "BOOL", engine::DType::kBool)     \
  X(kUInt8, "UINT8", engine::DType::kUInt8)  \
  X(kInt8, "INT8", engine::DType::kInt8)     \
  X(kInt16, "INT16", engine::DType::kInt16)  \
  X(kInt32, "INT32", engine::DType::kInt32)  \
  X(kInt64, "INT64", engine::DType::kInt64)  \
  X(kFp16, "FP16", engine::DType::kFloat16)  \
  X(kBf16, "BF16", engine::DType::kBFloat16) \
  X(kFp32, "FP32", engine::DType::kFloat32)  \
  X(kFp64, "FP64", engine::DType::kFloat64)  \
  X(kBytes, "BYTES", engine::DType::kUInt8)

enum class DataType : uint8_t {
#define OROCHI_DATATYPE_ENUM(name, text, dtype) name,
  OROCHI_PACKAGE_DATATYPES(OROCHI_DATATYPE_ENUM)
#undef OROCHI_DATATYPE_ENUM
};

std::string_view DataTypeName(DataType datatype);
bool ParseDataType(std::string_view text, DataType* datatype);
// The engine dtype that carries `datatype`; nullopt for BYTES.
std::optional<engine::DType> EngineDType(DataType datatype);

struct TensorSpec {
  std::string name;
  DataType datatype = DataType::kFp32;
  // -1 marks a variable dim. With max_batch_size > 0 the batch dim is implied and not listed.
  std::vector<int64_t> shape;
  // Outputs only, optional: a file below resources/ naming the classes along the last dim, one
  // per line, for the classification extension ("score:index:label").
  std::string labels;
};

struct Manifest {
  int format_version = kManifestFormatVersion;
  std::string name;          // [A-Za-z0-9][A-Za-z0-9_.-]*, at most 128 bytes
  int64_t version = 1;       // >= 1
  std::string entry_module;  // dotted module path under code/
  std::string entry_class;   // (possibly dotted) attribute of that module
  std::string description;
  std::vector<TensorSpec> inputs;    // at least one
  std::vector<TensorSpec> outputs;   // at least one
  int64_t max_batch_size = 0;        // 0: no batching
  std::optional<int64_t> instances;  // copies to load into; every copy when absent
  // The largest request body (JSON and binary data) the model takes; the server's body limit
  // when absent. For models whose cost grows with their input, so that one request cannot hold
  // a copy for minutes or take gigabytes.
  std::optional<int64_t> max_request_bytes;
  std::string device = "cpu";  // "cpu", "cuda" or "cuda:N"
  // A streaming model answers each request with any number of responses: its predict() is a
  // generator, or its entry class has the step interface (start/step/finish). max_batch_size
  // is 0 for it.
  bool streaming = false;
  // Step interface: the most sequences one copy steps together (one step() call).
  int64_t max_live_sequences = 16;
  // A streaming text generator served on the OpenAI-compatible endpoint (/v1): the input that
  // takes the prompt and the output that carries the generated text (BYTES, one element each),
  // and whether one token is one byte of UTF-8 (then responses report token usage).
  struct OpenAi {
    std::string text_input = "text_input";
    std::string text_output = "text_output";
    bool byte_tokens = false;
  };
  std::optional<OpenAi> openai;
  // A stateful model (Triton's sequence batcher): each request belongs to a sequence named by
  // its sequence_id, whose state lives in one copy and reaches predict(inputs, state). Unset
  // fields take the server's defaults.
  struct Sequence {
    std::optional<int64_t> idle_timeout_ms;         // >= 1: an idle sequence is freed after it
    std::optional<int64_t> max_sequences_per_copy;  // >= 1: live sequences one copy holds
  };
  std::optional<Sequence> sequence;
  // Python modules from outside the package ("requires"), e.g. "numpy": the server's
  // python.site_packages must provide each, or loading fails naming the module.
  std::vector<std::string> required_modules;
  std::string parameters_json = "{}";  // default parameters: a JSON object
  std::string json;                    // the whole manifest, as parsed
};

// Errors are kInvalidArgument, "manifest.json: <path>: <problem>"; a key given twice in one
// object and a leading UTF-8 byte order mark are problems too.
Result<Manifest> ParseManifest(std::string_view text);

// Whether `text` is a valid model or tensor name: 1-128 ASCII letters, digits, '_', '.' and
// '-', starting with a letter or digit. A model name is therefore one path component.
bool IsName(std::string_view text);

}  // namespace orochi::packaging

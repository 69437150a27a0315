// Fuzzes the KServe request codec (server/include/orochi/server/kserve_codec.h) as the server's
// infer handler calls it: ParseInferRequest on a body from the client, for a model's manifest,
// with or without the binary tensor extension's Inference-Header-Content-Length. A refusal
// (an error Status) is an answer; an exception out of it, a crash or a sanitizer report is a
// finding. A request it accepts is answered as the handler would: EncodeInferResponse with
// outputs of the manifest's shapes, so that what the request chooses about its answer (binary
// outputs, classification counts, selected outputs) is fuzzed too.
//
// Input: byte 0 chooses the manifest (bits 0-1) and whether the request uses the binary
// extension (bit 2); bytes 1-2, little-endian, are then the JSON's length (the header's value,
// possibly past the body, which must be refused). The rest is the body.
#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "orochi/engine/dtype.h"
#include "orochi/engine/tensor.h"
#include "orochi/packaging/manifest.h"
#include "orochi/server/kserve_codec.h"

namespace {

using orochi::interpreters::BytesTensor;
using orochi::interpreters::NamedTensor;
using orochi::packaging::DataType;
using orochi::packaging::Manifest;
using orochi::packaging::TensorSpec;
namespace engine = orochi::engine;
namespace kserve = orochi::server::kserve;

Manifest MakeManifest(std::string name, std::vector<TensorSpec> inputs,
                      std::vector<TensorSpec> outputs, int64_t max_batch_size) {
  Manifest manifest;
  manifest.name = std::move(name);
  manifest.version = 2;
  manifest.entry_module = "model";
  manifest.entry_class = "Model";
  manifest.inputs = std::move(inputs);
  manifest.outputs = std::move(outputs);
  manifest.max_batch_size = max_batch_size;
  return manifest;
}

// Manifests that reach every path of the reader: every datatype with a batch dim (the
// integration tests' echo model), fixed multi-dim shapes without batching, and variable dims
// inside a batch.
std::vector<Manifest> MakeManifests() {
  std::vector<Manifest> manifests;
  std::vector<TensorSpec> every_input;
  std::vector<TensorSpec> every_output;
  for (DataType datatype : {DataType::kBool, DataType::kUInt8, DataType::kInt8, DataType::kInt16,
                            DataType::kInt32, DataType::kInt64, DataType::kFp16, DataType::kBf16,
                            DataType::kFp32, DataType::kFp64, DataType::kBytes}) {
    std::string suffix(orochi::packaging::DataTypeName(datatype));
    std::transform(suffix.begin(), suffix.end(), suffix.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    every_input.push_back({"in_" + suffix, datatype, {-1}});
    every_output.push_back({"out_" + suffix, datatype, {-1}});
  }
  every_output.push_back({"batch", DataType::kInt64, {1}});
  manifests.push_back(MakeManifest("echo", every_input, every_output, 64));
  manifests.push_back(MakeManifest(
      "fixed", {{"x", DataType::kFp32, {2, 3}}, {"text", DataType::kBytes, {2}}},
      {{"y", DataType::kFp32, {2, 3}}, {"scores", DataType::kFp16, {10}, "labels.txt"}}, 0));
  manifests.push_back(MakeManifest(
      "images",
      {{"image", DataType::kUInt8, {4, 4, 3}},
       {"mask", DataType::kBool, {-1, -1}},
       {"ids", DataType::kInt64, {-1}}},
      {{"digit", DataType::kInt64, {1}}, {"probabilities", DataType::kBf16, {-1, 10}}}, 4));
  manifests.push_back(
      MakeManifest("scalar", {{"n", DataType::kInt32, {}}}, {{"m", DataType::kFp64, {}}}, 0));
  return manifests;
}

// Outputs of `manifest`'s declared shapes (variable dims 3, the batch dim the request's rows),
// their values the input's bytes over and over: NaNs, infinities and ties for the
// classification's ordering.
std::vector<NamedTensor> MakeOutputs(const Manifest& manifest, int64_t rows,
                                     std::string_view values) {
  std::vector<NamedTensor> outputs;
  size_t at = 0;
  auto next_byte = [&] { return values.empty() ? char{0} : values[at++ % values.size()]; };
  for (const TensorSpec& spec : manifest.outputs) {
    engine::Shape shape;
    if (manifest.max_batch_size > 0) shape.push_back(rows);
    for (int64_t dim : spec.shape) shape.push_back(dim == -1 ? 3 : dim);
    if (spec.datatype == DataType::kBytes) {
      BytesTensor bytes{shape, {}};
      for (int64_t i = 0; i < engine::NumElements(shape); ++i) {
        bytes.items.emplace_back(static_cast<size_t>(i % 5), next_byte());
      }
      outputs.push_back({spec.name, std::move(bytes)});
      continue;
    }
    engine::Tensor tensor =
        engine::Tensor::Empty(shape, *orochi::packaging::EngineDType(spec.datatype));
    auto* out = static_cast<char*>(tensor.mutable_data());
    const size_t bytes = static_cast<size_t>(tensor.numel()) * engine::ItemSize(tensor.dtype());
    for (size_t i = 0; i < bytes; ++i) out[i] = next_byte();
    if (spec.datatype == DataType::kBool) {  // a bool is 0 or 1, as the engine makes them
      for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<char>(out[i] & 1);
    }
    outputs.push_back({spec.name, std::move(tensor)});
  }
  return outputs;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<Manifest> manifests = MakeManifests();
  if (size < 3) return 0;
  const Manifest& manifest = manifests[data[0] & 3];
  std::optional<size_t> json_length;
  if ((data[0] & 4) != 0) json_length = size_t{data[1]} | size_t{data[2]} << 8;
  // The body in a buffer of its own size, so that AddressSanitizer sees a read past its end.
  const std::string body(reinterpret_cast<const char*>(data) + 3, size - 3);

  // The server's default limits (http.max_json_depth).
  orochi::Result<kserve::InferRequest> request =
      kserve::ParseInferRequest(manifest, body, json_length, kserve::ParseLimits{64});
  if (!request.ok()) return 0;
  const std::vector<NamedTensor> outputs = MakeOutputs(manifest, request->rows, body);
  // Package::Open has checked that a labels file names every class.
  static const kserve::OutputLabels labels = {
      {"scores", {"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}}};
  kserve::EncodeInferResponse(manifest, *request, outputs, labels);
  return 0;
}

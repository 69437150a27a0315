// `orochi pack`, `orochi inspect` and `orochi run`: model packages from the command line.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "orochi/engine/dtype.h"
#include "orochi/interpreters/interpreter.h"
#include "orochi/interpreters/interpreter_manager.h"
#include "orochi/interpreters/model.h"
#include "orochi/packaging/manifest.h"
#include "orochi/packaging/package.h"
#include "orochi/packaging/zip.h"
#include "orochi/server/kserve_codec.h"
#include "orochi/server/model_source.h"

namespace orochi::cli {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using packaging::Manifest;
using packaging::Package;

int Fail(const Status& status) {
  std::fprintf(stderr, "orochi: %s\n", status.message().c_str());
  if (!status.detail().empty()) std::fprintf(stderr, "%s", status.detail().c_str());
  return 1;
}

Result<std::string> ReadFile(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return NotFound("cannot read " + path.string());
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// --- pack --------------------------------------------------------------------------------------

// The files of a package directory, as archive members. Hidden files and Python caches are
// left out; symlinks and anything outside the four top-level names are errors.
Result<std::vector<packaging::ZipEntry>> CollectMembers(const fs::path& directory) {
  std::vector<packaging::ZipEntry> entries;
  if (!fs::is_directory(directory)) return NotFound(directory.string() + " is not a directory");
  for (const fs::directory_entry& top : fs::directory_iterator(directory)) {
    std::string name = top.path().filename().string();
    if (name.front() == '.') continue;
    if (name != "manifest.json" && name != "code" && name != "weights" && name != "resources") {
      return InvalidArgument(top.path().string() +
                             ": a package directory holds only manifest.json, code/, weights/ "
                             "and resources/");
    }
  }
  if (!fs::exists(directory / "manifest.json")) {
    return InvalidArgument(directory.string() + " has no manifest.json");
  }
  std::vector<fs::path> files{directory / "manifest.json"};
  for (const char* folder : {"code", "weights", "resources"}) {
    if (!fs::exists(directory / folder)) continue;
    for (auto it = fs::recursive_directory_iterator(directory / folder);
         it != fs::recursive_directory_iterator(); ++it) {
      std::string leaf = it->path().filename().string();
      if (leaf.front() == '.' || leaf == "__pycache__") {
        if (it->is_directory()) it.disable_recursion_pending();
        continue;
      }
      if (it->is_symlink()) {
        return InvalidArgument(it->path().string() +
                               " is a symbolic link; packages hold only "
                               "regular files");
      }
      if (it->is_regular_file() && it->path().extension() != ".pyc") files.push_back(it->path());
    }
  }
  for (const fs::path& file : files) {
    OROCHI_ASSIGN_OR_RETURN(std::string data, ReadFile(file));
    std::string name = fs::relative(file, directory).generic_string();
    bool weights = name.starts_with("weights/");
    entries.push_back({name, std::move(data), weights});
  }
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  return entries;
}

// Compiles every Python file in a private copy, so that a syntax error stops the pack with its
// file and line instead of surfacing when the server loads the model.
Status CompileCode(const std::vector<packaging::ZipEntry>& entries) {
  OROCHI_ASSIGN_OR_RETURN(std::unique_ptr<interpreters::Interpreter> copy,
                          interpreters::Interpreter::Create({}));
  OROCHI_RETURN_IF_ERROR(
      copy->Exec("def _compile(source, name):\n"
                 "    compile(source, name, 'exec', dont_inherit=True)\n"));
  for (const packaging::ZipEntry& entry : entries) {
    if (!entry.name.starts_with("code/") || fs::path(entry.name).extension() != ".py") continue;
    std::vector<interpreters::Value> arguments{interpreters::Bytes{entry.data}, entry.name};
    Result<interpreters::Value> compiled = copy->Call("__main__:_compile", arguments);
    if (!compiled.ok()) {
      return InvalidArgument(entry.name + " does not compile: " + compiled.status().message());
    }
  }
  return Status::Ok();
}

int Pack(const PackOptions& options) {
  const std::string& output = options.output;
  Result<std::vector<packaging::ZipEntry>> entries = CollectMembers(options.directory);
  if (!entries.ok()) return Fail(entries.status());
  auto manifest_entry = std::find_if(entries->begin(), entries->end(), [](const auto& entry) {
    return entry.name == "manifest.json";
  });
  Result<Manifest> manifest = packaging::ParseManifest(manifest_entry->data);
  if (!manifest.ok()) return Fail(manifest.status());
  if (options.set_version) {
    // The manifest is rewritten with its keys in their order, so only the version changes.
    nlohmann::ordered_json edited = nlohmann::ordered_json::parse(manifest_entry->data);
    edited["version"] = *options.set_version;
    manifest_entry->data = edited.dump(2) + "\n";
    manifest = packaging::ParseManifest(manifest_entry->data);
    if (!manifest.ok()) return Fail(manifest.status());
  }
  if (!options.no_compile) {
    if (Status compiled = CompileCode(*entries); !compiled.ok()) return Fail(compiled);
  }
  if (Status written = packaging::WriteZip(output, *entries); !written.ok()) return Fail(written);
  // Read back with the server's reader: what pack writes, the server accepts.
  Result<std::unique_ptr<Package>> package = Package::Open(output);
  if (!package.ok()) {
    fs::remove(output);
    return Fail(package.status());
  }
  uint64_t weight_bytes = 0;
  for (const auto& file : (*package)->weights_files()) weight_bytes += file.bytes;
  std::printf(
      "packed %s version %lld: %zu code files, %zu weight tensors (%llu bytes), %zu "
      "resources -> %s (%llu bytes)\n",
      manifest->name.c_str(), static_cast<long long>(manifest->version), (*package)->code().size(),
      (*package)->weights().size(), static_cast<unsigned long long>(weight_bytes),
      (*package)->resources().size(), output.c_str(),
      static_cast<unsigned long long>(fs::file_size(output)));
  return 0;
}

// --- inspect -----------------------------------------------------------------------------------

Json ShapeJson(const engine::Shape& shape) {
  Json array = Json::array();
  for (int64_t size : shape) array.push_back(size);
  return array;
}

int Inspect(const std::string& path, bool as_json) {
  Result<std::unique_ptr<Package>> opened = Package::Open(path);
  if (!opened.ok()) return Fail(opened.status());
  const Package& package = **opened;
  Json report;
  report["manifest"] = Json::parse(package.manifest().json);
  Json members = Json::array();
  for (const packaging::ZipMember& member : package.archive().members()) {
    members.push_back({{"name", member.name},
                       {"size", member.size},
                       {"compressed_size", member.compressed_size},
                       {"stored", member.stored}});
  }
  report["members"] = members;
  Json weights = Json::array();
  for (const packaging::WeightsFile& file : package.weights_files()) {
    Json tensors = Json::array();
    for (const auto& [name, tensor] : file.tensors) {
      tensors.push_back(
          {{"name", name},
           {"dtype", std::string(engine::DTypeName(tensor.dtype()))},
           {"shape", ShapeJson(tensor.shape())},
           {"bytes", tensor.numel() * static_cast<int64_t>(engine::ItemSize(tensor.dtype()))}});
    }
    weights.push_back({{"file", file.member}, {"bytes", file.bytes}, {"tensors", tensors}});
  }
  report["weights"] = weights;
  if (as_json) {
    std::printf("%s\n", report.dump(2).c_str());
    return 0;
  }
  const Manifest& manifest = package.manifest();
  std::printf("%s version %lld  (entry %s:%s, device %s, max_batch_size %lld)\n",
              manifest.name.c_str(), static_cast<long long>(manifest.version),
              manifest.entry_module.c_str(), manifest.entry_class.c_str(), manifest.device.c_str(),
              static_cast<long long>(manifest.max_batch_size));
  if (!manifest.description.empty()) std::printf("  %s\n", manifest.description.c_str());
  if (!manifest.required_modules.empty()) {
    std::string modules;
    for (const std::string& module : manifest.required_modules) {
      modules += (modules.empty() ? "" : ", ") + module;
    }
    std::printf("requires: %s\n", modules.c_str());
  }
  for (const auto* group : {&manifest.inputs, &manifest.outputs}) {
    std::printf("%s:\n", group == &manifest.inputs ? "inputs" : "outputs");
    for (const packaging::TensorSpec& spec : *group) {
      std::printf("  %-24s %-6s %s\n", spec.name.c_str(),
                  std::string(packaging::DataTypeName(spec.datatype)).c_str(),
                  ShapeJson(spec.shape).dump().c_str());
    }
  }
  std::printf("members:\n");
  for (const packaging::ZipMember& member : package.archive().members()) {
    std::printf("  %-48s %12llu bytes  %s\n", member.name.c_str(),
                static_cast<unsigned long long>(member.size),
                member.stored ? "stored" : "deflated");
  }
  std::printf("weights:\n");
  for (const packaging::WeightsFile& file : package.weights_files()) {
    std::printf("  %s (%llu bytes)\n", file.member.c_str(),
                static_cast<unsigned long long>(file.bytes));
    for (const auto& [name, tensor] : file.tensors) {
      std::printf("    %-40s %-9s %s\n", name.c_str(),
                  std::string(engine::DTypeName(tensor.dtype())).c_str(),
                  ShapeJson(tensor.shape()).dump().c_str());
    }
  }
  return 0;
}

// --- run ---------------------------------------------------------------------------------------

// The shape of nested JSON arrays, read along their first elements (the codec then checks
// that the data fills it).
std::vector<int64_t> NestedShape(const Json& data) {
  std::vector<int64_t> shape;
  const Json* probe = &data;
  while (probe->is_array()) {
    shape.push_back(static_cast<int64_t>(probe->size()));
    if (probe->empty()) break;
    probe = &(*probe)[0];
  }
  return shape;
}

// The --input arguments as a KServe v2 request body.
Result<std::string> RequestFromInputs(const Manifest& manifest,
                                      const std::vector<std::string>& inputs) {
  Json request{{"inputs", Json::array()}};
  for (const std::string& argument : inputs) {
    size_t equals = argument.find('=');
    if (equals == std::string::npos) {
      return InvalidArgument("--input takes NAME=JSON or NAME=@FILE, got '" + argument + "'");
    }
    std::string name = argument.substr(0, equals);
    std::string text = argument.substr(equals + 1);
    if (!text.empty() && text[0] == '@') {
      Result<std::string> file = ReadFile(text.substr(1));
      if (!file.ok()) return file.status();
      text = *file;
    }
    auto spec = std::find_if(manifest.inputs.begin(), manifest.inputs.end(),
                             [&](const auto& input) { return input.name == name; });
    if (spec == manifest.inputs.end()) {
      return InvalidArgument("the model has no input named '" + name + "'");
    }
    Json data = Json::parse(text, nullptr, false);
    if (data.is_discarded()) {
      return InvalidArgument("--input " + name + ": not valid JSON");
    }
    request["inputs"].push_back({{"name", name},
                                 {"datatype", std::string(packaging::DataTypeName(spec->datatype))},
                                 {"shape", NestedShape(data)},
                                 {"data", data}});
  }
  return request.dump();
}

// A streaming model's responses, each printed (one JSON line, KServe v2's response) as soon as
// the model produces it.
int RunStream(interpreters::InterpreterManager& manager, interpreters::ReplicatedModel& model,
              const Package& package, const server::kserve::InferRequest& request) {
  constexpr uint64_t kStream = 1;
  interpreters::InterpreterManager::Lease copy = manager.AcquireSlot(model.slots().front());
  Result<interpreters::ReplicatedModel::StreamKind> kind =
      model.StreamOpen(*copy, kStream, request.inputs, request.parameters);
  if (!kind.ok()) return Fail(kind.status());
  auto print = [&](const std::vector<interpreters::NamedTensor>& outputs) {
    server::kserve::EncodedResponse response =
        server::kserve::EncodeInferResponse(package.manifest(), request, outputs, package.labels());
    std::string_view json = response.body;
    if (response.json_length) json = json.substr(0, *response.json_length);
    std::printf("%s\n",
                Json::parse(json).dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
    std::fflush(stdout);
  };
  while (true) {
    if (*kind == interpreters::ReplicatedModel::StreamKind::kGenerator) {
      Result<std::optional<std::vector<interpreters::NamedTensor>>> next =
          model.StreamNext(*copy, kStream);
      if (!next.ok()) return Fail(next.status());
      if (!next->has_value()) return 0;
      print(**next);
      continue;
    }
    Result<std::vector<interpreters::ReplicatedModel::StepResult>> stepped =
        model.StreamStep(*copy, {kStream});
    if (!stepped.ok()) return Fail(stepped.status());
    interpreters::ReplicatedModel::StepResult& result = stepped->front();
    if (result.outputs) print(*result.outputs);
    if (!result.error.ok()) return Fail(result.error);
    if (result.finished) return 0;
  }
}

int Run(const RunOptions& options) {
  Result<std::unique_ptr<Package>> opened = Package::Open(options.path);
  if (!opened.ok()) return Fail(opened.status());
  std::shared_ptr<Package> package = std::move(opened).value();
  const Manifest& manifest = package->manifest();

  // The request is read by the server's own codec, so `run` accepts what the server accepts.
  Result<std::string> body = options.request_path.empty()
                                 ? RequestFromInputs(manifest, options.inputs)
                                 : ReadFile(options.request_path);
  if (!body.ok()) return Fail(body.status());
  Result<server::kserve::InferRequest> parsed =
      server::kserve::ParseInferRequest(manifest, *body, std::nullopt, {});
  if (!parsed.ok()) return Fail(parsed.status());
  // No server, so no registered regions: inputs named there would reach the model empty, and
  // outputs asked for there would be listed without being written anywhere.
  if (!parsed->shared_memory_inputs.empty() || !parsed->shared_memory_outputs.empty()) {
    return Fail(InvalidArgument(
        "the request names system shared memory (shared_memory_region), which only a server "
        "has: give `orochi run` the data in the request"));
  }

  interpreters::ManagerOptions manager_options;
  manager_options.copies = options.copies;
  manager_options.flags.extra_paths = options.site_packages;
  Result<std::unique_ptr<interpreters::InterpreterManager>> manager =
      interpreters::InterpreterManager::Create(std::move(manager_options));
  if (!manager.ok()) return Fail(manager.status());
  Result<std::unique_ptr<interpreters::ReplicatedModel>> model =
      interpreters::ReplicatedModel::Load(**manager,
                                          server::ModelSourceFrom(package, options.config));
  if (!model.ok()) return Fail(model.status());
  if (manifest.streaming) return RunStream(**manager, **model, *package, *parsed);
  // A stateful model's request runs as its sequence's first: its state lives for this run only.
  std::optional<interpreters::SequenceCall> sequence;
  if (parsed->sequence) {
    if (!parsed->sequence->start) {
      return Fail(InvalidArgument(
          "model " + manifest.name +
          " is stateful, and `orochi run` runs one request: it must "
          "start its sequence (\"sequence_start\": true), whose state lives for this run only"));
    }
    sequence = interpreters::SequenceCall{parsed->sequence->id, true, true};
  }
  Result<std::vector<interpreters::NamedTensor>> outputs =
      (*model)->Predict(parsed->inputs, parsed->parameters, sequence ? &*sequence : nullptr);
  if (!outputs.ok()) return Fail(outputs.status());
  server::kserve::EncodedResponse response =
      server::kserve::EncodeInferResponse(manifest, *parsed, *outputs, package->labels());
  // Binary outputs (asked for with the binary extension) stay out of the terminal.
  std::string_view json = response.body;
  if (response.json_length) json = json.substr(0, *response.json_length);
  std::printf("%s\n",
              Json::parse(json).dump(2, ' ', false, Json::error_handler_t::replace).c_str());
  if (response.json_length) {
    std::printf("(%zu bytes of binary output data not shown)\n",
                response.body.size() - *response.json_length);
  }
  return 0;
}

}  // namespace

int PackCommand(const PackOptions& options) { return Pack(options); }

int InspectCommand(const InspectOptions& options) { return Inspect(options.path, options.json); }

int RunCommand(const RunOptions& options) { return Run(options); }

}  // namespace orochi::cli

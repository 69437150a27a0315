#include "orochi/packaging/package.h"

#include <string>
#include <utility>

#include "orochi/engine/safetensors.h"

namespace orochi::packaging {
namespace {

constexpr std::string_view kManifest = "manifest.json";
constexpr std::string_view kCode = "code/";
constexpr std::string_view kWeights = "weights/";
constexpr std::string_view kResources = "resources/";
constexpr std::string_view kSafetensors = ".safetensors";

Status BadMember(const std::string& name, const std::string& rule) {
  return InvalidArgument("member '" + name + "': " + rule);
}

}  // namespace

Result<std::unique_ptr<Package>> Package::Open(const std::string& path,
                                               const PackageLimits& limits) {
  auto package = std::unique_ptr<Package>(new Package());
  package->path_ = path;
  Result<std::unique_ptr<ZipReader>> archive = ZipReader::Open(path, limits.zip);
  if (!archive.ok()) {
    return Status(archive.status().code(), path + ": " + archive.status().message());
  }
  package->archive_ = std::move(archive).value();
  const ZipReader& zip = *package->archive_;
  auto failed = [&path](const Status& status) {
    return Status(status.code(), path + ": " + status.message());
  };

  const ZipMember* manifest_member = nullptr;
  std::vector<const ZipMember*> weights_members;
  for (const ZipMember& member : zip.members()) {
    const std::string& name = member.name;
    if (name == kManifest) {
      manifest_member = &member;
    } else if (name.starts_with(kCode) || name.starts_with(kResources)) {
      continue;
    } else if (name.starts_with(kWeights)) {
      if (member.is_directory()) {
        if (name != kWeights) return failed(BadMember(name, "weights/ has no subdirectories"));
        continue;
      }
      std::string_view file = std::string_view(name).substr(kWeights.size());
      if (file.find('/') != std::string_view::npos || !file.ends_with(kSafetensors)) {
        return failed(BadMember(name, "weights/ holds only *.safetensors files"));
      }
      if (!member.stored) {
        return failed(BadMember(name,
                                "weights must be stored uncompressed, so that they can be "
                                "memory-mapped from the package"));
      }
      weights_members.push_back(&member);
    } else {
      return failed(BadMember(name, "outside manifest.json, code/, weights/ and resources/"));
    }
  }
  if (manifest_member == nullptr) return failed(InvalidArgument("no manifest.json"));
  if (manifest_member->size > limits.max_manifest_bytes) {
    return failed(BadMember(
        "manifest.json",
        "larger than the limit of " + std::to_string(limits.max_manifest_bytes) + " bytes"));
  }
  Result<std::string> manifest_text = zip.Read(*manifest_member);
  if (!manifest_text.ok()) return failed(manifest_text.status());
  Result<Manifest> manifest = ParseManifest(*manifest_text);
  if (!manifest.ok()) return failed(manifest.status());
  package->manifest_ = std::move(manifest).value();

  uint64_t code_bytes = 0;
  for (const ZipMember& member : zip.members()) {
    if (member.name.starts_with(kCode)) code_bytes += member.size;
  }
  if (code_bytes > limits.max_code_bytes) {
    return failed(InvalidArgument("code/ holds " + std::to_string(code_bytes) +
                                  " bytes uncompressed, over the limit of " +
                                  std::to_string(limits.max_code_bytes) +
                                  " (code is held in memory by every interpreter copy)"));
  }
  for (const ZipMember& member : zip.members()) {
    if (!member.name.starts_with(kCode) || member.is_directory()) continue;
    Result<std::string> source = zip.Read(member);
    if (!source.ok()) return failed(source.status());
    package->code_.emplace(member.name.substr(kCode.size()), std::move(source).value());
  }
  std::string module_path = package->manifest_.entry_module;
  for (char& c : module_path) c = c == '.' ? '/' : c;
  if (package->code_.count(module_path + ".py") == 0 &&
      package->code_.count(module_path + "/__init__.py") == 0) {
    return failed(InvalidArgument("the entry module '" + package->manifest_.entry_module +
                                  "' is not in the package (expected code/" + module_path +
                                  ".py or code/" + module_path + "/__init__.py)"));
  }

  for (size_t i = 0; i < package->manifest_.outputs.size(); ++i) {
    const TensorSpec& output = package->manifest_.outputs[i];
    if (output.labels.empty()) continue;
    const std::string at = "manifest.json: $.outputs[" + std::to_string(i) + "].labels: ";
    Result<std::string> text = package->ReadResource(output.labels);
    if (!text.ok()) return failed(InvalidArgument(at + text.status().message()));
    // One class a line; a last line break ends the last line, it starts no empty one.
    std::vector<std::string> labels;
    for (size_t start = 0; start < text->size();) {
      size_t end = std::min(text->find('\n', start), text->size());
      std::string line = text->substr(start, end - start);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      labels.push_back(std::move(line));
      start = end + 1;
    }
    const int64_t classes = output.shape.empty() ? 1 : output.shape.back();
    if (classes != -1 && static_cast<int64_t>(labels.size()) != classes) {
      return failed(InvalidArgument(at + "resources/" + output.labels + " has " +
                                    std::to_string(labels.size()) + " lines, but the output has " +
                                    std::to_string(classes) + " classes (its last dim)"));
    }
    package->labels_.emplace(output.name, std::move(labels));
  }

  for (const ZipMember* member : weights_members) {
    if (Status crc = zip.VerifyStored(*member); !crc.ok()) return failed(crc);
    Result<engine::SafetensorsContents> contents =
        engine::ParseSafetensors(zip.file(), member->data_offset, member->size);
    if (!contents.ok()) return failed(BadMember(member->name, contents.status().message()));
    WeightsFile file{member->name, member->size, std::move(contents->tensors)};
    for (const auto& [name, tensor] : file.tensors) {
      if (!package->weights_.emplace(name, tensor).second) {
        return failed(
            BadMember(member->name, "tensor '" + name + "' is also in another weights file"));
      }
    }
    package->weights_files_.push_back(std::move(file));
  }
  return package;
}

std::vector<std::string> Package::resources() const {
  std::vector<std::string> paths;
  for (const ZipMember& member : archive_->members()) {
    if (member.name.starts_with(kResources) && !member.is_directory()) {
      paths.push_back(member.name.substr(kResources.size()));
    }
  }
  return paths;
}

Result<std::string> Package::ReadResource(std::string_view path) const {
  const ZipMember* member = archive_->Find(std::string(kResources) + std::string(path));
  if (member == nullptr || member->is_directory()) {
    return NotFound("the package has no resource '" + std::string(path) + "'");
  }
  return archive_->Read(*member);
}

}  // namespace orochi::packaging

// A model package (.orochi), opened and validated (docs/PACKAGE_FORMAT.md).
//
// Open() checks everything before returning: the archive (zip.h), the layout (manifest.json,
// code/, weights/*.safetensors stored uncompressed, resources/), the manifest's schema, that
// the entry module exists, and every weights file's safetensors header against its data. It
// never writes or extracts anything. Weights are read-only tensors viewing the package file's
// one mapping, shared by whoever holds them; the mapping goes when the last tensor and the
// Package are gone.
//
// Thread-safety: a Package is immutable after Open; every method may be called from any thread.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "orochi/base/status.h"
#include "orochi/engine/tensor.h"
#include "orochi/packaging/manifest.h"
#include "orochi/packaging/zip.h"

namespace orochi::packaging {

struct PackageLimits {
  ZipLimits zip;
  size_t max_manifest_bytes = 1 << 20;
  // Uncompressed bytes of code/ all together: the code is read into memory and every
  // interpreter copy compiles its own, so it is bounded far below the archive's limits.
  uint64_t max_code_bytes = uint64_t{64} << 20;
};

struct WeightsFile {
  std::string member;  // "weights/model.safetensors"
  uint64_t bytes = 0;
  std::map<std::string, engine::Tensor> tensors;
};

class Package {
 public:
  // Errors: kNotFound (no file), kInvalidArgument (the message names the member and the rule).
  static Result<std::unique_ptr<Package>> Open(const std::string& path,
                                               const PackageLimits& limits = {});

  const std::string& path() const { return path_; }
  const Manifest& manifest() const { return manifest_; }
  const ZipReader& archive() const { return *archive_; }
  // Python sources under code/, keyed by their path below code/ ("model.py", "pkg/util.py").
  const std::map<std::string, std::string>& code() const { return code_; }
  const std::vector<WeightsFile>& weights_files() const { return weights_files_; }
  // Every tensor of every weights file, by name (names are unique across files).
  const std::map<std::string, engine::Tensor>& weights() const { return weights_; }
  // Paths below resources/ ("labels.txt").
  std::vector<std::string> resources() const;
  // A resource's bytes. Errors: kNotFound for a path that is not in the package.
  Result<std::string> ReadResource(std::string_view path) const;
  // The class names of the outputs whose manifest entry names a labels file, by output name.
  const std::map<std::string, std::vector<std::string>>& labels() const { return labels_; }

 private:
  Package() = default;
  std::string path_;
  std::unique_ptr<ZipReader> archive_;
  Manifest manifest_;
  std::map<std::string, std::string> code_;
  std::vector<WeightsFile> weights_files_;
  std::map<std::string, engine::Tensor> weights_;
  std::map<std::string, std::vector<std::string>> labels_;
};

}  // namespace orochi::packaging

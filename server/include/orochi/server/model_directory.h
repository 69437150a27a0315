// A model directory as KServe hands one to a serving runtime: `--model-dir /mnt/models`, filled
// from the InferenceService's storageUri by KServe's storage initializer, and `--model-name`, the
// InferenceService's name. It holds either a repository (<name>/<version>/model.orochi, the
// layout of models.repository) or a single .orochi package.
//
// The server never writes into it (KServe mounts it read-only). It serves from a repository of
// its own in a scratch directory instead: each version there is a link to the model directory's
// package, and the server's state and uploads stay in the scratch directory. A single package
// whose manifest names another model than `model_name` is copied there with the manifest's name
// replaced, since the repository serves a package under the name its manifest gives.
#pragma once

#include <memory>
#include <string>

#include "orochi/base/status.h"
#include "orochi/server/config.h"

namespace orochi::server {

class ModelDirectoryView {
 public:
  // Builds the scratch repository for `model_dir` in a new directory under `scratch_parent`.
  // A single package is served as `model_name` (its manifest's name when empty) at its
  // manifest's version; a repository's models keep their names. kInvalidArgument naming what was
  // found when the directory is neither (or both, or holds several packages), kNotFound when it
  // is not a directory.
  static Result<std::unique_ptr<ModelDirectoryView>> Create(const std::string& model_dir,
                                                            const std::string& model_name,
                                                            const std::string& scratch_parent);
  ModelDirectoryView(const ModelDirectoryView&) = delete;
  ModelDirectoryView& operator=(const ModelDirectoryView&) = delete;
  // Removes the scratch repository (the links, never what they point to).
  ~ModelDirectoryView();

  const std::string& repository() const { return repository_; }
  // What the model directory held, for the log: "a package served as NAME version N" or "a
  // repository of N models".
  const std::string& description() const { return description_; }
  bool is_repository() const { return is_repository_; }

 private:
  ModelDirectoryView() = default;
  std::string repository_;
  std::string description_;
  bool is_repository_ = false;
  int owner_ = 0;  // the process that made it, the one that removes it
};

// Resolves models.model_dir (with models.model_name) in `config`: builds the view in the
// temporary directory (TMPDIR, else /tmp), points models.repository at it and clears model_dir.
// Returns null when model_dir is not set. The view must outlive the server.
Result<std::unique_ptr<ModelDirectoryView>> PrepareModelDirectory(ServerConfig& config);

}  // namespace orochi::server

#include "orochi/server/model_directory.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>
#include <vector>

#include "log.h"
#include "orochi/packaging/package.h"
#include "orochi/packaging/zip.h"

namespace orochi::server {
namespace {

namespace fs = std::filesystem;

constexpr const char* kLayouts =
    "a model directory holds either one .orochi package or a repository "
    "(<name>/<version>/model.orochi)";

std::string Listed(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// The version directories of a repository's model directory that hold a package.
std::vector<std::string> VersionsWithPackage(const fs::path& model) {
  std::vector<std::string> versions;
  std::error_code error;
  for (auto it = fs::directory_iterator(model, error); !error && it != fs::directory_iterator();
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    const bool numeric = !name.empty() && name.size() <= 18 &&
                         name.find_first_not_of("0123456789") == std::string::npos &&
                         std::stoll(name) >= 1;
    if (numeric && it->is_directory() && fs::is_regular_file(it->path() / "model.orochi")) {
      versions.push_back(name);
    }
  }
  std::sort(versions.begin(), versions.end());
  return versions;
}

// What a model directory holds, looked at once.
struct Contents {
  std::vector<fs::path> packages;   // top-level *.orochi files
  std::vector<std::string> models;  // top-level directories with at least one packaged version
  std::vector<std::string> others;  // anything else that is not hidden
};

Result<Contents> Survey(const fs::path& directory) {
  Contents contents;
  std::error_code error;
  for (auto it = fs::directory_iterator(directory, error); !error && it != fs::directory_iterator();
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.front() == '.') continue;  // the storage initializer's and the server's own state
    if (it->is_regular_file() && it->path().extension() == ".orochi") {
      contents.packages.push_back(it->path());
    } else if (it->is_directory() && !VersionsWithPackage(it->path()).empty()) {
      contents.models.push_back(name);
    } else {
      contents.others.push_back(name);
    }
  }
  if (error) return Internal("cannot read " + directory.string() + ": " + error.message());
  std::sort(contents.packages.begin(), contents.packages.end());
  std::sort(contents.models.begin(), contents.models.end());
  std::sort(contents.others.begin(), contents.others.end());
  return contents;
}

Status Link(const fs::path& target, const fs::path& link) {
  std::error_code error;
  fs::create_directories(link.parent_path(), error);
  if (!error) fs::create_symlink(target, link, error);
  if (error) return Internal("cannot link " + link.string() + ": " + error.message());
  return Status::Ok();
}

// Writes `package` to `destination` with its manifest's name replaced by `name`: every other
// member byte for byte, stored members stored (weights stay mappable).
Status WriteRenamed(const packaging::Package& package, const std::string& name,
                    const fs::path& destination) {
  std::vector<packaging::ZipEntry> entries;
  for (const packaging::ZipMember& member : package.archive().members()) {
    if (member.is_directory()) continue;
    Result<std::string> data = package.archive().Read(member);
    if (!data.ok()) return data.status();
    if (member.name == "manifest.json") {
      // Keys keep their order, so that only the name changes.
      nlohmann::ordered_json manifest = nlohmann::ordered_json::parse(*data);
      manifest["name"] = name;
      *data = manifest.dump(2) + "\n";
    }
    entries.push_back({member.name, std::move(data).value(), member.stored});
  }
  std::error_code error;
  fs::create_directories(destination.parent_path(), error);
  if (error) return Internal("cannot create " + destination.parent_path().string());
  OROCHI_RETURN_IF_ERROR(packaging::WriteZip(destination.string(), entries));
  // What is served must be what the server's reader accepts.
  return packaging::Package::Open(destination.string()).status();
}

}  // namespace

Result<std::unique_ptr<ModelDirectoryView>> ModelDirectoryView::Create(
    const std::string& model_dir, const std::string& model_name,
    const std::string& scratch_parent) {
  std::error_code error;
  const fs::path directory = fs::absolute(model_dir, error);
  if (error || !fs::is_directory(directory, error)) {
    return NotFound("the model directory " + model_dir + " is not a directory");
  }
  OROCHI_ASSIGN_OR_RETURN(Contents contents, Survey(directory));
  if (contents.packages.size() > 1) {
    std::vector<std::string> names;
    for (const fs::path& package : contents.packages) names.push_back(package.filename());
    return InvalidArgument("the model directory " + model_dir + " holds " +
                           std::to_string(names.size()) + " packages (" + Listed(names) +
                           "): " + kLayouts);
  }
  if (!contents.packages.empty() && !contents.models.empty()) {
    return InvalidArgument("the model directory " + model_dir + " holds both a package (" +
                           contents.packages[0].filename().string() +
                           ") and a repository's models (" + Listed(contents.models) +
                           "): " + kLayouts);
  }
  if (contents.packages.empty() && contents.models.empty()) {
    return InvalidArgument(
        "the model directory " + model_dir + " holds neither a .orochi package nor a repository" +
        (contents.others.empty() ? " (it is empty)"
                                 : " (it holds " + Listed(contents.others) + ")") +
        ": " + kLayouts);
  }

  std::string scratch = (fs::path(scratch_parent) / "orochi-model-dir-XXXXXX").string();
  if (::mkdtemp(scratch.data()) == nullptr) {
    return Internal("cannot create a scratch repository in " + scratch_parent + ": " +
                    std::strerror(errno));
  }
  std::unique_ptr<ModelDirectoryView> view(new ModelDirectoryView());
  view->repository_ = scratch;
  view->owner_ = ::getpid();
  const fs::path repository(scratch);

  if (!contents.models.empty()) {
    for (const std::string& model : contents.models) {
      for (const std::string& version : VersionsWithPackage(directory / model)) {
        OROCHI_RETURN_IF_ERROR(Link(directory / model / version, repository / model / version));
      }
    }
    view->is_repository_ = true;
    view->description_ = "a repository of " + std::to_string(contents.models.size()) + " models (" +
                         Listed(contents.models) + ")";
    return view;
  }

  const fs::path& path = contents.packages[0];
  Result<std::unique_ptr<packaging::Package>> package = packaging::Package::Open(path.string());
  if (!package.ok()) return package.status();  // it names the file
  const packaging::Manifest& manifest = (*package)->manifest();
  const std::string name = model_name.empty() ? manifest.name : model_name;
  if (!packaging::IsName(name)) {
    return InvalidArgument("the model name '" + name +
                           "' is not valid (1-128 letters, digits, '_', '.', '-', starting with "
                           "a letter or digit)");
  }
  const fs::path served = repository / name / std::to_string(manifest.version) / "model.orochi";
  if (name == manifest.name) {
    OROCHI_RETURN_IF_ERROR(Link(path, served));
  } else {
    Status written = WriteRenamed(**package, name, served);
    if (!written.ok()) {
      return Status(written.code(),
                    "cannot serve " + path.string() + " as " + name + ": " + written.message());
    }
  }
  view->description_ = "the package " + path.filename().string() + " (" + manifest.name +
                       "), served as " + name + " version " + std::to_string(manifest.version);
  return view;
}

ModelDirectoryView::~ModelDirectoryView() {
  // Only the process that made it: a forked serving process that exits leaves it alone.
  if (::getpid() != owner_) return;
  std::error_code error;
  fs::remove_all(repository_, error);  // links are removed, not followed
}

Result<std::unique_ptr<ModelDirectoryView>> PrepareModelDirectory(ServerConfig& config) {
  ModelsConfig& models = config.models;
  if (models.model_dir.empty()) return std::unique_ptr<ModelDirectoryView>();
  if (!models.repository.empty()) {
    return InvalidArgument(
        "models.model_dir and models.repository are both set: serve a model directory "
        "(--model-dir) or a repository (--model-repository), not both");
  }
  std::error_code error;
  fs::path scratch_parent = fs::temp_directory_path(error);
  if (error) return FailedPrecondition("no temporary directory: " + error.message());
  OROCHI_ASSIGN_OR_RETURN(
      std::unique_ptr<ModelDirectoryView> view,
      ModelDirectoryView::Create(models.model_dir, models.model_name, scratch_parent.string()));
  ConfigureLog(config.log.level, config.log.format);
  std::vector<LogField> fields = {{"model_dir", models.model_dir},
                                  {"holds", view->description()},
                                  {"repository", view->repository()}};
  Log(LogLevel::kInfo, "serving a model directory", fields);
  if (!models.model_name.empty() && view->is_repository()) {
    // Not an error: KServe passes the InferenceService's name to every runtime.
    Log(LogLevel::kInfo,
        "the model directory is a repository: its models keep their own names; the model name "
        "names a single package only",
        {{"model_name", models.model_name}});
  }
  models.repository = view->repository();
  models.model_dir.clear();
  models.model_name.clear();
  return view;
}

}  // namespace orochi::server

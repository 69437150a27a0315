// Builds model packages in memory for the packaging tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "orochi/engine/safetensors.h"
#include "orochi/packaging/package.h"
#include "orochi/packaging/zip.h"

namespace orochi::packaging {

// A temporary directory removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "orochi-packaging-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline std::string SafetensorsBytes(const std::map<std::string, engine::Tensor>& tensors,
                                    const TempDir& scratch) {
  std::string path = scratch / "weights.tmp";
  Status saved = engine::SaveSafetensors(path, tensors);
  EXPECT_TRUE(saved.ok()) << saved.ToString();
  std::string bytes;
  if (FILE* file = std::fopen(path.c_str(), "rb")) {
    char buffer[1 << 16];
    size_t read = 0;
    while ((read = std::fread(buffer, 1, sizeof(buffer), file)) > 0) bytes.append(buffer, read);
    std::fclose(file);
  }
  std::filesystem::remove(path);
  return bytes;
}

inline std::string ManifestJson(const std::string& name, const std::string& inputs,
                                const std::string& outputs, const std::string& extra = "") {
  return R"({"format_version": 1, "name": ")" + name +
         R"(", "version": 1, "entry": "model:Model", "inputs": )" + inputs + R"(, "outputs": )" +
         outputs + extra + "}";
}

// Writes a package from (member name -> bytes); weights/ members are stored.
inline std::string WritePackage(const TempDir& directory, const std::string& file,
                                const std::map<std::string, std::string>& members) {
  std::vector<ZipEntry> entries;
  for (const auto& [name, data] : members) {
    entries.push_back({name, data, name.starts_with("weights/")});
  }
  std::string path = directory / file;
  Status written = WriteZip(path, entries);
  EXPECT_TRUE(written.ok()) << written.ToString();
  return path;
}

}  // namespace orochi::packaging

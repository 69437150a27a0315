// Fuzzes the package reader (packaging/: the zip reader, the manifest's schema, the weights'
// safetensors headers) as the repository API meets an upload: a file of a client's bytes,
// opened with Package::Open. A refusal (an error Status) is an answer; an exception, a crash or
// a sanitizer report is a finding. Every member of an archive that ZipReader accepts is also
// read (inflated, CRC checked), and every weights tensor of a package that opens is read to its
// last byte, so that a view past the file's mapping faults here.
//
// Input: byte 0 says what the rest is (its value modulo 3):
//   0: the whole .orochi file;
//   1: manifest.json, in a package whose code and labels are valid;
//   2: weights/model.safetensors, in a package whose manifest and code are valid.
// Zip members carry CRCs, which mutations of a whole file rarely keep right: modes 1 and 2 build
// a correct archive around the input so that the manifest and safetensors parsers behind the
// archive's checks are reached as often as the archive's own.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "orochi/engine/dtype.h"
#include "orochi/packaging/package.h"
#include "orochi/packaging/zip.h"

namespace {

namespace packaging = orochi::packaging;

constexpr const char* kCode =
    "class Model:\n"
    "    def __init__(self, context):\n"
    "        pass\n"
    "\n"
    "    def predict(self, inputs):\n"
    "        return {'y': inputs['x']}\n";

constexpr const char* kManifest = R"({
  "format_version": 1,
  "name": "fuzzed",
  "version": 1,
  "entry": "model:Model",
  "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
  "outputs": [{"name": "y", "datatype": "FP32", "shape": [2], "labels": "labels.txt"}],
  "max_batch_size": 8
})";

// One file per process (libFuzzer's -fork and -jobs run several), removed after each input
// rather than at exit, which libFuzzer does not always reach (a crash leaves its one file). In
// memory where there is a tmpfs: created and removed on disk for every input, it ran 14 times
// slower.
const std::string& PackagePath() {
  static const std::string path =
      ((std::filesystem::is_directory("/dev/shm") ? std::filesystem::path("/dev/shm")
                                                  : std::filesystem::temp_directory_path()) /
       ("orochi-package-fuzzer-" + std::to_string(::getpid()) + ".orochi"))
          .string();
  return path;
}

struct RemoveAfterwards {
  ~RemoveAfterwards() { std::remove(PackagePath().c_str()); }
};

void WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  OROCHI_FUZZ_CHECK(file != nullptr, "cannot write the package file");
  if (size > 0) OROCHI_FUZZ_CHECK(std::fwrite(data, 1, size, file) == size, "short write");
  OROCHI_FUZZ_CHECK(std::fclose(file) == 0, "cannot write the package file");
}

// Where the weights' bytes go, so that reading them is not optimised away.
volatile uint8_t weights_sum = 0;

void WritePackage(const std::string& path, const std::vector<packaging::ZipEntry>& entries) {
  OROCHI_FUZZ_CHECK(packaging::WriteZip(path, entries).ok(), "cannot write the package file");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string& path = PackagePath();
  const RemoveAfterwards cleanup;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      WriteFile(path, data + 1, size - 1);
      break;
    case 1:
      WritePackage(path, {{"manifest.json", rest},
                          {"code/model.py", kCode},
                          {"resources/labels.txt", "no\nyes\n"}});
      break;
    default:
      WritePackage(path, {{"manifest.json", kManifest},
                          {"code/model.py", kCode},
                          {"resources/labels.txt", "no\nyes\n"},
                          {"weights/model.safetensors", rest, /*store=*/true}});
      break;
  }

  // The archive alone, every member read, whether or not it is a package.
  if (auto archive = packaging::ZipReader::Open(path); archive.ok()) {
    for (const packaging::ZipMember& member : (*archive)->members()) {
      if (member.is_directory()) continue;
      (void)(*archive)->Read(member);
      if (member.stored) (void)(*archive)->VerifyStored(member);
    }
  }

  auto package = packaging::Package::Open(path);
  if (!package.ok()) return 0;
  for (const std::string& resource : (*package)->resources()) {
    (void)(*package)->ReadResource(resource);
  }
  uint8_t sum = 0;
  for (const auto& [name, tensor] : (*package)->weights()) {
    const auto* bytes = static_cast<const uint8_t*>(tensor.data());
    const size_t count =
        static_cast<size_t>(tensor.numel()) * orochi::engine::ItemSize(tensor.dtype());
    for (size_t i = 0; i < count; ++i) sum += bytes[i];
  }
  weights_sum = sum;
  return 0;
}

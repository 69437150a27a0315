#include "embedded_assets.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "orochi/interpreters/interpreter.h"

extern "C" {
extern const std::byte orochi_asset_copy_library_begin[];
extern const std::byte orochi_asset_copy_library_end[];
extern const std::byte orochi_asset_stdlib_zip_begin[];
extern const std::byte orochi_asset_stdlib_zip_end[];
extern const std::byte orochi_asset_package_zip_begin[];
extern const std::byte orochi_asset_package_zip_end[];
}

namespace orochi::interpreters {
namespace {

std::string ErrnoText(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

}  // namespace

std::span<const std::byte> EmbeddedCopyLibrary() {
  return {orochi_asset_copy_library_begin, orochi_asset_copy_library_end};
}

Result<int> SealedMemfd(const char* name, std::span<const std::byte> bytes, bool close_on_exec) {
  unsigned flags = MFD_ALLOW_SEALING | (close_on_exec ? MFD_CLOEXEC : 0U);
  int fd = memfd_create(name, flags);
  if (fd < 0) return Internal(ErrnoText("memfd_create"));
  size_t written = 0;
  while (written < bytes.size()) {
    ssize_t n = write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Status error = Internal(ErrnoText("writing a memfd"));
      close(fd);
      return error;
    }
    written += static_cast<size_t>(n);
  }
  // F_SEAL_WRITE fails with EBUSY while the kernel still holds a transient reference to one of
  // the pages just written (seen once under memory-management scans); it clears quickly.
  int sealed = -1;
  for (int attempt = 0; attempt < 100; ++attempt) {
    sealed = fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
    if (sealed == 0 || errno != EBUSY) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (sealed != 0) {
    Status error = Internal(ErrnoText("sealing a memfd"));
    close(fd);
    return error;
  }
  return fd;
}

namespace {

// The archives' memfds, made on first use; `paths` holds the error if they could not be.
struct PythonArchives {
  Result<std::vector<std::string>> paths = Internal("not initialized");
  std::vector<int> descriptors;
};

const PythonArchives& Archives() {
  static std::once_flag once;
  static PythonArchives archives_made;
  std::call_once(once, [] {
    Result<std::vector<std::string>>& paths = archives_made.paths;
    struct Archive {
      const char* name;
      std::span<const std::byte> bytes;
    };
    const Archive archives[] = {
        {"orochi-stdlib.zip", {orochi_asset_stdlib_zip_begin, orochi_asset_stdlib_zip_end}},
        {"orochi-python.zip", {orochi_asset_package_zip_begin, orochi_asset_package_zip_end}},
    };
    std::vector<std::string> result;
    for (const Archive& archive : archives) {
      // Kept open for the life of the process: every copy reads it through /proc/self/fd.
      Result<int> fd = SealedMemfd(archive.name, archive.bytes, /*close_on_exec=*/true);
      if (!fd.ok()) {
        paths = fd.status();
        return;
      }
      result.push_back("/proc/self/fd/" + std::to_string(*fd));
      archives_made.descriptors.push_back(*fd);
    }
    // The system Python's C extension modules (_json, _decimal, _ctypes, ...), which copies load
    // with Orochi's own loader; the stdlib's Python code always comes from the embedded archive.
    if (std::filesystem::is_directory(OROCHI_PYTHON_DYNLOAD)) {
      result.emplace_back(OROCHI_PYTHON_DYNLOAD);
    }
    paths = std::move(result);
  });
  return archives_made;
}

}  // namespace

Result<std::vector<std::string>> EmbeddedPythonPaths() { return Archives().paths; }

Result<std::vector<int>> PythonArchiveDescriptors() {
  const PythonArchives& archives = Archives();
  if (!archives.paths.ok()) return archives.paths.status();
  return archives.descriptors;
}

}  // namespace orochi::interpreters

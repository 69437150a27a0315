// The files built into the host binary, and the memfds that copies load them from.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "orochi/base/status.h"

namespace orochi::interpreters {

// The interpreter library (a shared object), as embedded.
std::span<const std::byte> EmbeddedCopyLibrary();

// sys.path for every copy: the embedded stdlib archive, then Orochi's own package archive.
// Each is a sealed, read-only memfd created once per process and named "/proc/self/fd/N"
// (zipimport needs a path; nothing touches the disk). Thread-safe.
Result<std::vector<std::string>> EmbeddedPythonPaths();

// Writes `bytes` to a new memfd called `name` and seals it against change. Returns the fd.
Result<int> SealedMemfd(const char* name, std::span<const std::byte> bytes, bool close_on_exec);

}  // namespace orochi::interpreters

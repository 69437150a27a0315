// Orochi's own loader for ELF shared objects (x86-64 Linux): how a C extension module is bound to
// one interpreter copy's private CPython instead of to whatever Python the system linker sees.
//
// Load() maps the object itself and binds each undefined symbol, in order, to:
//   1. `resolve` (for a copy: its table of C-API symbols, data included: PyExc_*, _Py_NoneStruct),
//   2. the object's own definition,
//   3. its DT_NEEDED libraries, opened once by the system loader (dlopen) and honouring symbol
//      versions (dlvsym),
//   4. the process (libc, libstdc++, BLAS, ...).
// It supports what compilers emit for x86-64 shared objects: PT_LOAD segments and their
// protections, RELRO, RELATIVE / GLOB_DAT / JUMP_SLOT / 64 / IRELATIVE relocations, general- and
// local-dynamic thread-local storage (DTPMOD64 / DTPOFF64 through its own __tls_get_addr), symbol
// versions, init and fini arrays, and C++ exceptions unwinding through the loaded code (its
// .eh_frame is registered with the unwinder). Anything else, e.g. initial-exec TLS or text
// relocations, fails the load with a message that names the object and the feature; a load that
// fails leaves nothing mapped.
//
// Thread-safety: Load() and destruction may run on any thread, concurrently for different
// objects. FindSymbol() is const and safe from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "orochi/base/status.h"

namespace orochi::interpreters {

// An address for an undefined symbol, or nullptr to look further.
using SymbolResolver = std::function<void*(const char* name)>;

namespace detail {
// A loaded object's mappings and tables, defined in elf_library.cpp, whose loading steps share it.
struct LoadedElf;
}  // namespace detail

class ElfLibrary {
 public:
  // Maps, relocates and initialises the object at `path` (its initialisers run before this
  // returns). Errors: kNotFound (no such file), kInvalidArgument (not an x86-64 ELF shared
  // object, or malformed), kUnimplemented (a feature the loader does not support),
  // kFailedPrecondition (an undefined symbol nothing provides, a needed library missing).
  static Result<std::unique_ptr<ElfLibrary>> Load(const std::string& path,
                                                  const SymbolResolver& resolve);

  // Runs the object's finalisers, unregisters its unwind information, frees its thread-local
  // storage, unmaps it and closes its needed libraries. Precondition: no thread runs its code
  // or holds pointers into it any more.
  ~ElfLibrary();

  ElfLibrary(const ElfLibrary&) = delete;
  ElfLibrary& operator=(const ElfLibrary&) = delete;

  // The address of a function or data object the library defines and exports, or nullptr.
  void* FindSymbol(std::string_view name) const;

  const std::string& path() const;
  // Bytes of address space the object's segments occupy.
  size_t mapped_bytes() const;

 private:
  explicit ElfLibrary(std::unique_ptr<detail::LoadedElf> state);
  std::unique_ptr<detail::LoadedElf> state_;
};

}  // namespace orochi::interpreters

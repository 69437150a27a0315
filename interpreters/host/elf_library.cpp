// Orochi's loader for ELF shared objects; see orochi/interpreters/elf_library.h.
//
// The system loader cannot be used for a C extension module of a private copy: it binds the
// module's Py* references process-wide, and a copy's CPython exports nothing. So the module is
// mapped and linked here, against the copy's own symbol table, once per copy.
#include "orochi/interpreters/elf_library.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <unordered_map>
#include <vector>

extern "C" {
// libgcc's registry of unwind tables for code the system loader does not know about.
void __register_frame(const void* eh_frame);    // NOLINT(bugprone-reserved-identifier)
void __deregister_frame(const void* eh_frame);  // NOLINT(bugprone-reserved-identifier)
}

extern char** environ;

// A loader turns the object's addresses (base + offsets read from the file) into pointers to
// call and patch; that is its job, not an accident.
// NOLINTBEGIN(performance-no-int-to-ptr)

namespace orochi::interpreters {
namespace {

constexpr size_t kMaxFileBytes = size_t{4} << 30;

uintptr_t PageSize() {
  static const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return page;
}
uintptr_t PageDown(uintptr_t value) { return value & ~(PageSize() - 1); }
uintptr_t PageUp(uintptr_t value) { return PageDown(value + PageSize() - 1); }

int Protection(uint32_t flags) {
  return ((flags & PF_R) != 0 ? PROT_READ : 0) | ((flags & PF_W) != 0 ? PROT_WRITE : 0) |
         ((flags & PF_X) != 0 ? PROT_EXEC : 0);
}

const char* RelocationName(uint32_t type) {
  switch (type) {
    case R_X86_64_PC32:
      return "R_X86_64_PC32";
    case R_X86_64_COPY:
      return "R_X86_64_COPY";
    case R_X86_64_32:
      return "R_X86_64_32";
    case R_X86_64_32S:
      return "R_X86_64_32S";
    case R_X86_64_TPOFF64:
      return "R_X86_64_TPOFF64 (initial-exec thread-local storage)";
    case R_X86_64_TLSDESC:
      return "R_X86_64_TLSDESC (TLS descriptors)";
    case R_X86_64_DTPOFF32:
      return "R_X86_64_DTPOFF32";
    case R_X86_64_TPOFF32:
      return "R_X86_64_TPOFF32 (local-exec thread-local storage)";
    default:
      return nullptr;
  }
}

// --- thread-local storage --------------------------------------------------------------------
//
// The object's code asks for its thread-local variables with __tls_get_addr({module, offset}).
// Its references to __tls_get_addr bind to OrochiTlsGetAddr below, and its DTPMOD64 relocations
// store a TlsModule* as the module id, so each thread gets a block of this object's own,
// initialised from its PT_TLS image on first use.

struct TlsModule;

struct TlsBlock {
  TlsModule* owner;
  void* memory;
};

struct TlsModule {
  pthread_key_t key{};
  const void* image = nullptr;
  size_t image_bytes = 0;
  size_t total_bytes = 0;
  size_t alignment = 1;
  std::mutex mutex;
  std::vector<TlsBlock*> blocks;  // every thread's block, freed at unload
};

struct TlsIndex {
  uint64_t module;
  uint64_t offset;
};

void ReleaseTlsBlock(void* value) {
  auto* block = static_cast<TlsBlock*>(value);
  {
    std::lock_guard<std::mutex> lock(block->owner->mutex);
    auto& blocks = block->owner->blocks;
    blocks.erase(std::remove(blocks.begin(), blocks.end(), block), blocks.end());
  }
  std::free(block->memory);
  delete block;
}

// The calling convention is the ABI's, but callers may not have the stack 16-byte aligned (as
// glibc allows for its own __tls_get_addr), hence force_align_arg_pointer.
extern "C" __attribute__((force_align_arg_pointer)) void* OrochiTlsGetAddr(TlsIndex* index) {
  auto* module = reinterpret_cast<TlsModule*>(index->module);
  auto* block = static_cast<TlsBlock*>(pthread_getspecific(module->key));
  if (block == nullptr) {
    size_t alignment = std::max<size_t>(module->alignment, alignof(std::max_align_t));
    size_t bytes =
        (std::max<size_t>(module->total_bytes, 1) + alignment - 1) / alignment * alignment;
    void* memory = std::aligned_alloc(alignment, bytes);
    if (memory == nullptr) std::abort();  // as glibc does when it cannot allocate TLS
    std::memcpy(memory, module->image, module->image_bytes);
    std::memset(static_cast<char*>(memory) + module->image_bytes, 0, bytes - module->image_bytes);
    block = new TlsBlock{module, memory};
    {
      std::lock_guard<std::mutex> lock(module->mutex);
      module->blocks.push_back(block);
    }
    pthread_setspecific(module->key, block);
  }
  return static_cast<char*>(block->memory) + index->offset;
}

// --- symbol versions -------------------------------------------------------------------------

struct NeededVersion {
  std::string file;
  std::string name;
};

}  // namespace

struct detail::LoadedElf {
  std::string path;
  char* reservation = nullptr;  // the whole address range, PT_LOAD segments inside it
  size_t reservation_bytes = 0;
  uintptr_t base = 0;  // load bias: runtime address = base + p_vaddr

  const Elf64_Sym* symbols = nullptr;
  size_t symbol_count = 0;
  const char* strings = nullptr;
  size_t strings_bytes = 0;
  const uint16_t* version_indexes = nullptr;
  std::unordered_map<uint16_t, NeededVersion> needed_versions;

  std::vector<std::pair<std::string, void*>> needed;  // soname, dlopen handle
  std::unique_ptr<TlsModule> tls;
  const void* eh_frame = nullptr;

  std::vector<void (*)()> finalizers;  // in the order to call them
  bool initialized = false;

  ~LoadedElf() {
    if (initialized) {
      for (void (*finalizer)() : finalizers) finalizer();
    }
    if (eh_frame != nullptr) __deregister_frame(eh_frame);
    if (tls) {
      pthread_key_delete(tls->key);
      for (TlsBlock* block : tls->blocks) {
        std::free(block->memory);
        delete block;
      }
    }
    if (reservation != nullptr) munmap(reservation, reservation_bytes);
    for (auto& [name, handle] : needed) dlclose(handle);
  }

  std::string Error(const std::string& message) const { return path + ": " + message; }

  template <typename T>
  T* At(uintptr_t vaddr) const {
    return reinterpret_cast<T*>(base + vaddr);
  }

  const char* String(size_t offset) const {
    return offset < strings_bytes ? strings + offset : "<bad string offset>";
  }

  // What a symbol the object defines resolves to at run time.
  void* DefinedAddress(const Elf64_Sym& symbol) const {
    void* address = At<void>(symbol.st_value);
    if (ELF64_ST_TYPE(symbol.st_info) == STT_GNU_IFUNC) {
      address = reinterpret_cast<void* (*)()>(address)();
    }
    return address;
  }
};

namespace {

using State = detail::LoadedElf;

Status Unsupported(const State& state, const std::string& feature) {
  return Unimplemented(state.Error(feature + " is not supported by Orochi's extension loader"));
}

Status Malformed(const State& state, const std::string& problem) {
  return InvalidArgument(state.Error("malformed ELF shared object: " + problem));
}

// A file's whole contents, mapped read-only while the object is set up.
struct FileMapping {
  int fd = -1;
  const unsigned char* data = nullptr;
  size_t size = 0;
  ~FileMapping() {
    if (data != nullptr) munmap(const_cast<unsigned char*>(data), size);
    if (fd >= 0) close(fd);
  }
};

Status OpenFile(const State& state, FileMapping& file) {
  file.fd = open(state.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file.fd < 0) {
    int error = errno;
    std::string message = state.Error(std::strerror(error));
    return error == ENOENT ? NotFound(message) : FailedPrecondition(message);
  }
  struct stat info {};
  if (fstat(file.fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    return InvalidArgument(state.Error("not a regular file"));
  }
  file.size = static_cast<size_t>(info.st_size);
  if (file.size < sizeof(Elf64_Ehdr)) return InvalidArgument(state.Error("not an ELF file"));
  if (file.size > kMaxFileBytes) return InvalidArgument(state.Error("larger than 4 GiB"));
  void* data = mmap(nullptr, file.size, PROT_READ, MAP_PRIVATE, file.fd, 0);
  if (data == MAP_FAILED) return FailedPrecondition(state.Error(std::strerror(errno)));
  file.data = static_cast<const unsigned char*>(data);
  return Status::Ok();
}

Status CheckHeader(const State& state, const Elf64_Ehdr& header, size_t file_size) {
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0) {
    return InvalidArgument(state.Error("not an ELF file"));
  }
  if (header.e_ident[EI_CLASS] != ELFCLASS64) return Unsupported(state, "a 32-bit ELF object");
  if (header.e_ident[EI_DATA] != ELFDATA2LSB) return Unsupported(state, "a big-endian ELF object");
  if (header.e_machine != EM_X86_64) {
    return Unsupported(state, "an ELF object for machine " + std::to_string(header.e_machine) +
                                  " (only x86-64, 62)");
  }
  if (header.e_type != ET_DYN) return Unsupported(state, "an ELF object that is not shared");
  if (header.e_phentsize != sizeof(Elf64_Phdr) || header.e_phnum == 0 ||
      header.e_phoff > file_size ||
      (file_size - header.e_phoff) / sizeof(Elf64_Phdr) < header.e_phnum) {
    return Malformed(state, "program headers out of the file");
  }
  return Status::Ok();
}

// Reserves the address range of all PT_LOAD segments and maps each one into it.
Status MapSegments(State& state, const FileMapping& file, const std::vector<Elf64_Phdr>& loads) {
  uintptr_t low = UINTPTR_MAX;
  uintptr_t high = 0;
  for (const Elf64_Phdr& segment : loads) {
    if (segment.p_filesz > segment.p_memsz || segment.p_offset > file.size ||
        file.size - segment.p_offset < segment.p_filesz || segment.p_vaddr > (uintptr_t{1} << 46) ||
        segment.p_memsz > (uintptr_t{1} << 40)) {
      return Malformed(state, "a PT_LOAD segment out of range");
    }
    if ((segment.p_vaddr - segment.p_offset) % PageSize() != 0) {
      return Malformed(state, "a PT_LOAD segment not congruent with its file offset");
    }
    low = std::min(low, PageDown(segment.p_vaddr));
    high = std::max(high, PageUp(segment.p_vaddr + segment.p_memsz));
  }
  state.reservation_bytes = high - low;
  void* reservation = mmap(nullptr, state.reservation_bytes, PROT_NONE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reservation == MAP_FAILED) return FailedPrecondition(state.Error(std::strerror(errno)));
  state.reservation = static_cast<char*>(reservation);
  state.base = reinterpret_cast<uintptr_t>(reservation) - low;

  // Writable until relocated; final protections come after.
  for (const Elf64_Phdr& segment : loads) {
    const uintptr_t start = PageDown(segment.p_vaddr);
    const uintptr_t file_end = segment.p_vaddr + segment.p_filesz;
    if (segment.p_filesz > 0) {
      void* mapped =
          mmap(state.At<void>(start), PageUp(file_end) - start, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_FIXED, file.fd, static_cast<off_t>(PageDown(segment.p_offset)));
      if (mapped == MAP_FAILED) return FailedPrecondition(state.Error(std::strerror(errno)));
    }
    const uintptr_t zero_start = segment.p_filesz > 0 ? file_end : start;
    const uintptr_t memory_end = segment.p_vaddr + segment.p_memsz;
    if (memory_end > zero_start) {
      // .bss: the rest of the last file page is zeroed, whole pages after it are anonymous.
      const uintptr_t anonymous_start = PageUp(zero_start);
      if (segment.p_filesz > 0 && anonymous_start > zero_start) {
        std::memset(state.At<void>(zero_start), 0,
                    std::min(anonymous_start, memory_end) - zero_start);
      }
      if (PageUp(memory_end) > anonymous_start) {
        void* mapped = mmap(state.At<void>(anonymous_start), PageUp(memory_end) - anonymous_start,
                            PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS, -1, 0);
        if (mapped == MAP_FAILED) return FailedPrecondition(state.Error(std::strerror(errno)));
      }
    }
  }
  return Status::Ok();
}

// The number of dynamic symbols, which the dynamic section states only through its hash tables.
size_t SymbolCountFromGnuHash(const uint32_t* table) {
  const uint32_t bucket_count = table[0];
  const uint32_t first_symbol = table[1];
  const uint32_t bloom_words = table[2];
  const auto* buckets =
      reinterpret_cast<const uint32_t*>(reinterpret_cast<const uint64_t*>(table + 4) + bloom_words);
  const uint32_t* chains = buckets + bucket_count;
  uint32_t last = 0;
  for (uint32_t i = 0; i < bucket_count; ++i) last = std::max(last, buckets[i]);
  if (last < first_symbol) return first_symbol;
  while ((chains[last - first_symbol] & 1U) == 0) ++last;
  return last + 1;
}

struct DynamicInfo {
  std::vector<uint64_t> needed;  // string offsets
  std::vector<uint64_t> search_paths;
  const Elf64_Rela* rela = nullptr;
  size_t rela_bytes = 0;
  const Elf64_Rela* plt_rela = nullptr;
  size_t plt_rela_bytes = 0;
  uintptr_t init = 0;
  uintptr_t fini = 0;
  uintptr_t init_array = 0;
  size_t init_array_bytes = 0;
  uintptr_t fini_array = 0;
  size_t fini_array_bytes = 0;
  uintptr_t verneed = 0;
  size_t verneed_count = 0;
};

Result<DynamicInfo> ReadDynamic(State& state, const Elf64_Phdr& dynamic_segment) {
  DynamicInfo info;
  const uint32_t* gnu_hash = nullptr;
  const uint32_t* sysv_hash = nullptr;
  const auto* entry = state.At<const Elf64_Dyn>(dynamic_segment.p_vaddr);
  const size_t count = dynamic_segment.p_memsz / sizeof(Elf64_Dyn);
  for (size_t i = 0; i < count && entry[i].d_tag != DT_NULL; ++i) {
    const uint64_t value = entry[i].d_un.d_val;
    switch (entry[i].d_tag) {
      case DT_NEEDED:
        info.needed.push_back(value);
        break;
      case DT_RUNPATH:
      case DT_RPATH:
        info.search_paths.push_back(value);
        break;
      case DT_STRTAB:
        state.strings = state.At<const char>(value);
        break;
      case DT_STRSZ:
        state.strings_bytes = value;
        break;
      case DT_SYMTAB:
        state.symbols = state.At<const Elf64_Sym>(value);
        break;
      case DT_SYMENT:
        if (value != sizeof(Elf64_Sym)) return Malformed(state, "DT_SYMENT");
        break;
      case DT_GNU_HASH:
        gnu_hash = state.At<const uint32_t>(value);
        break;
      case DT_HASH:
        sysv_hash = state.At<const uint32_t>(value);
        break;
      case DT_RELA:
        info.rela = state.At<const Elf64_Rela>(value);
        break;
      case DT_RELASZ:
        info.rela_bytes = value;
        break;
      case DT_JMPREL:
        info.plt_rela = state.At<const Elf64_Rela>(value);
        break;
      case DT_PLTRELSZ:
        info.plt_rela_bytes = value;
        break;
      case DT_PLTREL:
        if (value != DT_RELA) return Unsupported(state, "REL (not RELA) PLT relocations");
        break;
      case DT_REL:
        return Unsupported(state, "REL (not RELA) relocations");
      case DT_TEXTREL:
        return Unsupported(state, "text relocations (DT_TEXTREL)");
      case DT_FLAGS:
        if ((value & DF_TEXTREL) != 0) return Unsupported(state, "text relocations (DF_TEXTREL)");
        if ((value & DF_STATIC_TLS) != 0) {
          return Unsupported(state, "static thread-local storage (DF_STATIC_TLS)");
        }
        break;
      case DT_INIT:
        info.init = value;
        break;
      case DT_FINI:
        info.fini = value;
        break;
      case DT_INIT_ARRAY:
        info.init_array = value;
        break;
      case DT_INIT_ARRAYSZ:
        info.init_array_bytes = value;
        break;
      case DT_FINI_ARRAY:
        info.fini_array = value;
        break;
      case DT_FINI_ARRAYSZ:
        info.fini_array_bytes = value;
        break;
      case DT_PREINIT_ARRAY:
        return Unsupported(state, "DT_PREINIT_ARRAY");
      case DT_VERSYM:
        state.version_indexes = state.At<const uint16_t>(value);
        break;
      case DT_VERNEED:
        info.verneed = value;
        break;
      case DT_VERNEEDNUM:
        info.verneed_count = value;
        break;
      default:
        break;
    }
  }
  if (state.strings == nullptr || state.symbols == nullptr) {
    return Malformed(state, "no dynamic symbol or string table");
  }
  if (gnu_hash != nullptr) {
    state.symbol_count = SymbolCountFromGnuHash(gnu_hash);
  } else if (sysv_hash != nullptr) {
    state.symbol_count = sysv_hash[1];
  } else {
    return Malformed(state, "no DT_GNU_HASH or DT_HASH to count its symbols");
  }
  return info;
}

void ReadNeededVersions(State& state, const DynamicInfo& info) {
  if (info.verneed == 0) return;
  uintptr_t at = info.verneed;
  for (size_t i = 0; i < info.verneed_count; ++i) {
    const auto* need = state.At<const Elf64_Verneed>(at);
    uintptr_t aux_at = at + need->vn_aux;
    for (size_t j = 0; j < need->vn_cnt; ++j) {
      const auto* aux = state.At<const Elf64_Vernaux>(aux_at);
      state.needed_versions[static_cast<uint16_t>(aux->vna_other & 0x7fff)] = {
          state.String(need->vn_file), state.String(aux->vna_name)};
      if (aux->vna_next == 0) break;
      aux_at += aux->vna_next;
    }
    if (need->vn_next == 0) break;
    at += need->vn_next;
  }
}

Status OpenNeeded(State& state, const DynamicInfo& info) {
  const std::string origin = std::filesystem::path(state.path).parent_path().string();
  for (uint64_t offset : info.needed) {
    const std::string name = state.String(offset);
    // The copy provides CPython; an extension that names libpython gets the copy's, not another.
    if (name.starts_with("libpython")) continue;
    void* handle = nullptr;
    if (name.find('/') == std::string::npos) {
      for (uint64_t paths_offset : info.search_paths) {
        std::string paths = state.String(paths_offset);
        for (size_t start = 0; handle == nullptr && start <= paths.size();) {
          size_t end = std::min(paths.find(':', start), paths.size());
          std::string directory = paths.substr(start, end - start);
          if (directory.starts_with("$ORIGIN")) directory.replace(0, 7, origin);
          if (!directory.empty()) {
            directory.append("/").append(name);
            handle = dlopen(directory.c_str(), RTLD_NOW | RTLD_LOCAL);
          }
          start = end + 1;
        }
      }
    }
    if (handle == nullptr) handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      return FailedPrecondition(
          state.Error("its needed library " + name + " cannot be loaded: " + dlerror()));
    }
    state.needed.emplace_back(name, handle);
  }
  return Status::Ok();
}

// Binds symbol `index` of the object (an undefined reference or an interposable definition).
Result<void*> Bind(const State& state, size_t index, const SymbolResolver& resolve) {
  const Elf64_Sym& symbol = state.symbols[index];
  const char* name = state.String(symbol.st_name);
  const bool defined = symbol.st_shndx != SHN_UNDEF;
  if (ELF64_ST_TYPE(symbol.st_info) == STT_TLS) {
    return Unsupported(state,
                       "the thread-local variable '" + std::string(name) + "' of another library");
  }
  if (defined && (ELF64_ST_BIND(symbol.st_info) == STB_LOCAL ||
                  ELF64_ST_VISIBILITY(symbol.st_other) != STV_DEFAULT)) {
    return state.DefinedAddress(symbol);
  }
  if (std::strcmp(name, "__tls_get_addr") == 0 && state.tls) {
    return reinterpret_cast<void*>(&OrochiTlsGetAddr);
  }
  if (resolve) {
    if (void* address = resolve(name)) return address;
  }
  if (defined) return state.DefinedAddress(symbol);

  const NeededVersion* version = nullptr;
  if (state.version_indexes != nullptr) {
    auto found = state.needed_versions.find(state.version_indexes[index] & 0x7fff);
    if (found != state.needed_versions.end()) version = &found->second;
  }
  for (const auto& [soname, handle] : state.needed) {
    if (version != nullptr && version->file != soname) continue;
    void* address =
        version != nullptr ? dlvsym(handle, name, version->name.c_str()) : dlsym(handle, name);
    if (address != nullptr) return address;
  }
  void* address = version != nullptr ? dlvsym(RTLD_DEFAULT, name, version->name.c_str())
                                     : dlsym(RTLD_DEFAULT, name);
  if (address != nullptr) return address;
  if (ELF64_ST_BIND(symbol.st_info) == STB_WEAK) return nullptr;
  std::string versioned = name;
  if (version != nullptr) versioned += "@" + version->name + " (from " + version->file + ")";
  return FailedPrecondition(
      state.Error("undefined symbol " + versioned +
                  ": neither the interpreter copy nor a library provides it"));
}

// Symbol index -> address, shared by the object's two relocation tables so that a symbol
// referenced from both (GLOB_DAT and JUMP_SLOT) is looked up once.
using BoundSymbols = std::unordered_map<uint32_t, void*>;

Status Relocate(State& state, const Elf64_Rela* relocations, size_t bytes,
                const SymbolResolver& resolve, BoundSymbols& bound) {
  if (relocations == nullptr) return Status::Ok();
  const auto first = reinterpret_cast<uintptr_t>(state.reservation);
  const uintptr_t last = first + state.reservation_bytes;
  const size_t count = bytes / sizeof(Elf64_Rela);
  for (size_t i = 0; i < count; ++i) {
    const Elf64_Rela& relocation = relocations[i];
    const uint32_t type = ELF64_R_TYPE(relocation.r_info);
    const uint32_t symbol_index = ELF64_R_SYM(relocation.r_info);
    if (symbol_index >= state.symbol_count) return Malformed(state, "a relocation's symbol index");
    const uintptr_t slot = state.base + relocation.r_offset;
    if (slot < first || slot > last - 8) {
      return Malformed(state, "a relocation outside the object");
    }
    auto* target = state.At<uint64_t>(relocation.r_offset);
    const auto addend = static_cast<uint64_t>(relocation.r_addend);

    auto symbol_address = [&]() -> Result<uint64_t> {
      if (symbol_index == 0) return uint64_t{0};
      auto found = bound.find(symbol_index);
      if (found == bound.end()) {
        OROCHI_ASSIGN_OR_RETURN(void* address, Bind(state, symbol_index, resolve));
        found = bound.emplace(symbol_index, address).first;
      }
      return reinterpret_cast<uint64_t>(found->second);
    };

    switch (type) {
      case R_X86_64_NONE:
        break;
      case R_X86_64_RELATIVE:
        *target = state.base + addend;
        break;
      case R_X86_64_GLOB_DAT:
      case R_X86_64_JUMP_SLOT: {
        OROCHI_ASSIGN_OR_RETURN(uint64_t address, symbol_address());
        *target = address;
        break;
      }
      case R_X86_64_64: {
        OROCHI_ASSIGN_OR_RETURN(uint64_t address, symbol_address());
        *target = address + addend;
        break;
      }
      case R_X86_64_IRELATIVE:
        *target = reinterpret_cast<uint64_t>(reinterpret_cast<void* (*)()>(state.base + addend)());
        break;
      case R_X86_64_DTPMOD64:
      case R_X86_64_DTPOFF64: {
        const Elf64_Sym& symbol = state.symbols[symbol_index];
        if (!state.tls) return Malformed(state, "a TLS relocation without a PT_TLS segment");
        if (symbol_index != 0 && symbol.st_shndx == SHN_UNDEF) {
          return Unsupported(state, "the thread-local variable '" +
                                        std::string(state.String(symbol.st_name)) +
                                        "' of another library");
        }
        *target = type == R_X86_64_DTPMOD64 ? reinterpret_cast<uint64_t>(state.tls.get())
                                            : symbol.st_value + addend;
        break;
      }
      default: {
        const char* known = RelocationName(type);
        return Unsupported(
            state, "the relocation " +
                       (known != nullptr ? std::string(known) : "type " + std::to_string(type)));
      }
    }
  }
  return Status::Ok();
}

// The .eh_frame that PT_GNU_EH_FRAME's header points to.
Result<const void*> FindEhFrame(const State& state, const Elf64_Phdr& header_segment) {
  const auto* header = state.At<const unsigned char>(header_segment.p_vaddr);
  const unsigned char encoding = header[1];
  const unsigned char* field = header + 4;
  int64_t value = 0;
  switch (encoding & 0x0f) {
    case 0x03:
      value = *reinterpret_cast<const uint32_t*>(field);
      break;  // udata4
    case 0x0b:
      value = *reinterpret_cast<const int32_t*>(field);
      break;  // sdata4
    case 0x04:
    case 0x0c:
      value = *reinterpret_cast<const int64_t*>(field);
      break;  // u/sdata8
    default:
      return Unsupported(state, "the .eh_frame_hdr pointer encoding " + std::to_string(encoding));
  }
  switch (encoding & 0x70) {
    case 0x00:
      return reinterpret_cast<const void*>(value);  // absolute
    case 0x10:
      return reinterpret_cast<const void*>(reinterpret_cast<intptr_t>(field) + value);
    case 0x30:  // relative to the header
      return reinterpret_cast<const void*>(reinterpret_cast<intptr_t>(header) + value);
    default:
      return Unsupported(state, "the .eh_frame_hdr pointer encoding " + std::to_string(encoding));
  }
}

Status Protect(const State& state, const std::vector<Elf64_Phdr>& loads, const Elf64_Phdr* relro) {
  for (const Elf64_Phdr& segment : loads) {
    const uintptr_t start = PageDown(segment.p_vaddr);
    const uintptr_t end = PageUp(segment.p_vaddr + segment.p_memsz);
    if (mprotect(state.At<void>(start), end - start, Protection(segment.p_flags)) != 0) {
      return FailedPrecondition(state.Error(std::string("mprotect: ") + std::strerror(errno)));
    }
  }
  if (relro != nullptr) {
    const uintptr_t start = PageDown(relro->p_vaddr);
    const uintptr_t end = PageDown(relro->p_vaddr + relro->p_memsz);
    if (end > start && mprotect(state.At<void>(start), end - start, PROT_READ) != 0) {
      return FailedPrecondition(state.Error(std::string("mprotect: ") + std::strerror(errno)));
    }
  }
  return Status::Ok();
}

void RunInitializers(State& state, const DynamicInfo& info) {
  if (info.init != 0) state.At<void()>(info.init)();
  const size_t init_count = info.init_array_bytes / sizeof(uintptr_t);
  const auto* init_array = state.At<const uintptr_t>(info.init_array);
  for (size_t i = 0; info.init_array != 0 && i < init_count; ++i) {
    if (init_array[i] == 0 || init_array[i] == UINTPTR_MAX) continue;
    reinterpret_cast<void (*)(int, char**, char**)>(init_array[i])(0, nullptr, environ);
  }
  const size_t fini_count = info.fini_array_bytes / sizeof(uintptr_t);
  const auto* fini_array = state.At<const uintptr_t>(info.fini_array);
  for (size_t i = fini_count; info.fini_array != 0 && i > 0; --i) {
    if (fini_array[i - 1] == 0 || fini_array[i - 1] == UINTPTR_MAX) continue;
    state.finalizers.push_back(reinterpret_cast<void (*)()>(fini_array[i - 1]));
  }
  if (info.fini != 0) state.finalizers.push_back(state.At<void()>(info.fini));
  state.initialized = true;
}

}  // namespace

Result<std::unique_ptr<ElfLibrary>> ElfLibrary::Load(const std::string& path,
                                                     const SymbolResolver& resolve) {
  auto state = std::make_unique<State>();
  state->path = path;
  FileMapping file;
  OROCHI_RETURN_IF_ERROR(OpenFile(*state, file));
  const auto& header = *reinterpret_cast<const Elf64_Ehdr*>(file.data);
  OROCHI_RETURN_IF_ERROR(CheckHeader(*state, header, file.size));

  std::vector<Elf64_Phdr> loads;
  const Elf64_Phdr* dynamic = nullptr;
  const Elf64_Phdr* relro = nullptr;
  const Elf64_Phdr* eh_frame_header = nullptr;
  const Elf64_Phdr* tls = nullptr;
  const auto* segments = reinterpret_cast<const Elf64_Phdr*>(file.data + header.e_phoff);
  for (size_t i = 0; i < header.e_phnum; ++i) {
    switch (segments[i].p_type) {
      case PT_LOAD:
        loads.push_back(segments[i]);
        break;
      case PT_DYNAMIC:
        dynamic = &segments[i];
        break;
      case PT_GNU_RELRO:
        relro = &segments[i];
        break;
      case PT_GNU_EH_FRAME:
        eh_frame_header = &segments[i];
        break;
      case PT_TLS:
        tls = &segments[i];
        break;
      case PT_INTERP:
        return Unsupported(*state, "an executable (PT_INTERP)");
      default:
        break;
    }
  }
  if (loads.empty() || dynamic == nullptr) {
    return Malformed(*state, "no PT_LOAD or PT_DYNAMIC segment");
  }
  OROCHI_RETURN_IF_ERROR(MapSegments(*state, file, loads));
  OROCHI_ASSIGN_OR_RETURN(DynamicInfo info, ReadDynamic(*state, *dynamic));
  ReadNeededVersions(*state, info);
  if (tls != nullptr) {
    state->tls = std::make_unique<TlsModule>();
    state->tls->image = state->At<const void>(tls->p_vaddr);
    state->tls->image_bytes = tls->p_filesz;
    state->tls->total_bytes = tls->p_memsz;
    state->tls->alignment = std::max<size_t>(tls->p_align, 1);
    if (pthread_key_create(&state->tls->key, &ReleaseTlsBlock) != 0) {
      state->tls.reset();
      return FailedPrecondition(state->Error("no thread-local storage key left"));
    }
  }
  OROCHI_RETURN_IF_ERROR(OpenNeeded(*state, info));
  BoundSymbols bound;
  OROCHI_RETURN_IF_ERROR(Relocate(*state, info.rela, info.rela_bytes, resolve, bound));
  OROCHI_RETURN_IF_ERROR(Relocate(*state, info.plt_rela, info.plt_rela_bytes, resolve, bound));
  OROCHI_RETURN_IF_ERROR(Protect(*state, loads, relro));
  if (eh_frame_header != nullptr) {
    OROCHI_ASSIGN_OR_RETURN(state->eh_frame, FindEhFrame(*state, *eh_frame_header));
    __register_frame(state->eh_frame);
  }
  RunInitializers(*state, info);
  return std::unique_ptr<ElfLibrary>(new ElfLibrary(std::move(state)));
}

ElfLibrary::ElfLibrary(std::unique_ptr<detail::LoadedElf> state) : state_(std::move(state)) {}
ElfLibrary::~ElfLibrary() = default;

void* ElfLibrary::FindSymbol(std::string_view name) const {
  // A linear scan: a module is asked for one symbol (PyInit_<name>), once, so an index of all
  // its exports would cost more than it saves.
  const State& state = *state_;
  for (size_t i = 1; i < state.symbol_count; ++i) {
    const Elf64_Sym& symbol = state.symbols[i];
    const unsigned binding = ELF64_ST_BIND(symbol.st_info);
    const unsigned type = ELF64_ST_TYPE(symbol.st_info);
    if (symbol.st_shndx == SHN_UNDEF || binding == STB_LOCAL || type == STT_TLS ||
        type == STT_SECTION || type == STT_FILE) {
      continue;
    }
    if (state.version_indexes != nullptr && (state.version_indexes[i] & 0x8000) != 0) {
      continue;  // a hidden (non-default) version of the name
    }
    if (name == state.String(symbol.st_name)) return state.DefinedAddress(symbol);
  }
  return nullptr;
}

const std::string& ElfLibrary::path() const { return state_->path; }

size_t ElfLibrary::mapped_bytes() const { return state_->reservation_bytes; }

}  // namespace orochi::interpreters

// NOLINTEND(performance-no-int-to-ptr)

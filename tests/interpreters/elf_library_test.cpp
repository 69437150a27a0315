// Orochi's ELF loader on purpose-built objects (tests/interpreters/elf/): binding order, data
// symbols, .bss, constructors and destructors, thread-local storage, C++ exceptions through the
// loaded code, symbol versions, every refusal by its message, and no leak over 100 loads.
#include "orochi/interpreters/elf_library.h"

#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace orochi::interpreters {
namespace {

using testing::HasSubstr;

std::atomic<int> destroyed_count{0};

extern "C" int HostAdd(int a, int b) { return a + b; }
extern "C" void HostNoteDestroyed() { ++destroyed_count; }
extern "C" void HostCallback(int value) {
  throw std::runtime_error("thrown by the host for " + std::to_string(value));
}
const char kHostGreeting[] = "hello from the host table";

// What a copy's symbol table would be: names to addresses, functions and data alike.
void* TestSymbols(const char* name) {
  static const std::pair<const char*, void*> kTable[] = {
      {"host_add", reinterpret_cast<void*>(&HostAdd)},
      {"host_note_destroyed", reinterpret_cast<void*>(&HostNoteDestroyed)},
      {"host_callback", reinterpret_cast<void*>(&HostCallback)},
      {"host_greeting", const_cast<char*>(kHostGreeting)},
      // Interposes on the object's own export, as a copy's symbol would.
      {"basic_constructed_elsewhere", nullptr},
  };
  for (const auto& [symbol, address] : kTable) {
    if (std::strcmp(symbol, name) == 0) return address;
  }
  return nullptr;
}

std::string ObjectPath(const std::string& name) {
  return std::string(OROCHI_ELF_TEST_DIR) + "/" + name + ".so";
}

std::unique_ptr<ElfLibrary> LoadOrDie(const std::string& name) {
  Result<std::unique_ptr<ElfLibrary>> library = ElfLibrary::Load(ObjectPath(name), TestSymbols);
  EXPECT_TRUE(library.ok()) << library.status().ToString();
  return library.ok() ? std::move(library).value() : nullptr;
}

template <typename Function>
Function* Find(const ElfLibrary& library, const char* name) {
  void* address = library.FindSymbol(name);
  EXPECT_NE(address, nullptr) << name;
  return reinterpret_cast<Function*>(address);
}

size_t CountLines(const char* path) {
  std::ifstream file(path);
  return static_cast<size_t>(
      std::count(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>(), '\n'));
}

size_t CountDescriptors() {
  return static_cast<size_t>(std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                                           std::filesystem::directory_iterator()));
}

std::string LoadError(const std::string& path, StatusCode expected_code) {
  Result<std::unique_ptr<ElfLibrary>> library = ElfLibrary::Load(path, TestSymbols);
  EXPECT_FALSE(library.ok()) << path;
  if (library.ok()) return "";
  EXPECT_EQ(library.status().code(), expected_code) << library.status().ToString();
  return library.status().message();
}

TEST(ElfLibrary, BindsToTheResolverItselfAndLibcAndRunsConstructorsAndDestructors) {
  int destroyed_before = destroyed_count;
  {
    std::unique_ptr<ElfLibrary> library = LoadOrDie("basic");
    ASSERT_NE(library, nullptr);
    EXPECT_EQ(*Find<int>(*library, "basic_constructed"), 42);  // its constructor ran
    EXPECT_EQ(Find<int(int, int)>(*library, "basic_add")(2, 3), 6);
    EXPECT_STREQ(Find<const char*()>(*library, "basic_greeting")(), kHostGreeting);  // data
    EXPECT_EQ(Find<size_t(const char*)>(*library, "basic_strlen")("four"), 4U);      // libc
    EXPECT_EQ(Find<int()>(*library, "basic_calls_own_export")(), 3);
    int* bss = Find<int*()>(*library, "basic_bss_address")();
    EXPECT_EQ(std::count(bss, bss + 1024, 0), 1024);  // .bss is zeroed and writable
    bss[1023] = 7;
    EXPECT_EQ(library->FindSymbol("construct"), nullptr);  // static: not exported
    EXPECT_EQ(library->FindSymbol("no_such_symbol"), nullptr);
    EXPECT_GT(library->mapped_bytes(), 0U);
    EXPECT_EQ(destroyed_count, destroyed_before);
  }
  EXPECT_EQ(destroyed_count, destroyed_before + 1);  // its destructor ran at unload
}

TEST(ElfLibrary, EachLoadIsItsOwnInstance) {
  std::unique_ptr<ElfLibrary> first = LoadOrDie("basic");
  std::unique_ptr<ElfLibrary> second = LoadOrDie("basic");
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  int* first_value = Find<int>(*first, "basic_constructed");
  int* second_value = Find<int>(*second, "basic_constructed");
  EXPECT_NE(first_value, second_value);
  *first_value = 1;
  EXPECT_EQ(*second_value, 42);
}

TEST(ElfLibrary, ThreadLocalStorageIsPerThreadAndPerLoad) {
  std::unique_ptr<ElfLibrary> library = LoadOrDie("tls");
  std::unique_ptr<ElfLibrary> other = LoadOrDie("tls");
  ASSERT_NE(library, nullptr);
  ASSERT_NE(other, nullptr);
  auto* increment = Find<int()>(*library, "tls_increment");
  auto* address = Find<int*()>(*library, "tls_counter_address");
  auto* buffer = Find<char*()>(*library, "tls_buffer_address");

  EXPECT_EQ(increment(), 6);  // initialised from the TLS image (5)
  EXPECT_EQ(increment(), 7);
  EXPECT_EQ(Find<int()>(*other, "tls_increment")(), 6);     // another load has its own variable
  EXPECT_EQ(std::count(buffer(), buffer() + 256, 0), 256);  // the .tbss part is zeroed

  constexpr int kThreads = 8;
  std::vector<int*> addresses(kThreads);
  std::vector<int> finals(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) finals[t] = increment();
      addresses[t] = address();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(finals[t], 1005) << "thread " << t;  // each thread counted from 5 on its own
    EXPECT_NE(addresses[t], address());
  }
  EXPECT_EQ(increment(), 8);  // the main thread's variable was untouched
}

TEST(ElfLibrary, CxxStaticsAndExceptionsThroughTheLoadedCode) {
  std::unique_ptr<ElfLibrary> library = LoadOrDie("cxx");
  ASSERT_NE(library, nullptr);
  EXPECT_STREQ(Find<const char*()>(*library, "cxx_static_string")(), "static constructor ran");
  EXPECT_EQ(Find<int(int)>(*library, "cxx_catch_inside")(41), 42);

  auto* call_through = Find<void(int)>(*library, "cxx_call_through");
  int destroyed_before = Find<int()>(*library, "cxx_destroyed")();
  try {
    call_through(7);
    ADD_FAILURE() << "the host's exception did not come back";
  } catch (const std::runtime_error& error) {
    EXPECT_STREQ(error.what(), "thrown by the host for 7");
  }
  // The unwinder ran the loaded object's destructor on its way through.
  EXPECT_EQ(Find<int()>(*library, "cxx_destroyed")(), destroyed_before + 1);

  EXPECT_THROW(Find<void()>(*library, "cxx_throw_out")(), std::invalid_argument);
}

TEST(ElfLibrary, SymbolVersionsAreHonoured) {
  // versioned_user binds answer@V1 (1) of lib/libversioned_library.so, found through its
  // $ORIGIN runpath; answer's default version, @@V2, would give 2.
  std::unique_ptr<ElfLibrary> library = LoadOrDie("versioned_user");
  ASSERT_NE(library, nullptr);
  EXPECT_EQ(Find<int()>(*library, "versioned_answer")(), 1);
}

TEST(ElfLibrary, RefusesWhatItDoesNotSupportByName) {
  const std::filesystem::path scratch =
      std::filesystem::temp_directory_path() / ("orochi-elf-" + std::to_string(getpid()));
  std::filesystem::create_directories(scratch);
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream((scratch / name).string(), std::ios::binary) << bytes;
    return (scratch / name).string();
  };
  std::ifstream original(ObjectPath("basic"), std::ios::binary);
  const std::string basic((std::istreambuf_iterator<char>(original)), {});

  EXPECT_THAT(LoadError((scratch / "absent.so").string(), StatusCode::kNotFound),
              HasSubstr("No such file"));
  EXPECT_THAT(
      LoadError(write("text.so", "just some text, not an object\n"), StatusCode::kInvalidArgument),
      HasSubstr("not an ELF file"));
  EXPECT_THAT(LoadError(write("truncated.so", basic.substr(0, 100)), StatusCode::kInvalidArgument),
              HasSubstr("program headers out of the file"));
  std::string arm = basic;
  arm[18] = static_cast<char>(183);  // e_machine: AArch64
  arm[19] = 0;
  EXPECT_THAT(LoadError(write("arm.so", arm), StatusCode::kUnimplemented),
              HasSubstr("an ELF object for machine 183 (only x86-64, 62) is not supported"));
  std::string thirty_two = basic;
  thirty_two[4] = 1;  // EI_CLASS: ELFCLASS32
  EXPECT_THAT(LoadError(write("32.so", thirty_two), StatusCode::kUnimplemented),
              HasSubstr("a 32-bit ELF object is not supported"));
  EXPECT_THAT(LoadError(ObjectPath("tls_initial_exec"), StatusCode::kUnimplemented),
              HasSubstr("thread-local storage"));
  EXPECT_THAT(LoadError(ObjectPath("text_relocations"), StatusCode::kUnimplemented),
              HasSubstr("text relocations"));
  std::string message = LoadError(ObjectPath("undefined"), StatusCode::kFailedPrecondition);
  EXPECT_THAT(message, HasSubstr("undefined.so: undefined symbol orochi_test_missing_function"));
  std::filesystem::remove_all(scratch);
}

TEST(ElfLibrary, LoadingAndUnloadingLeavesNoMappingOrDescriptorBehind) {
  for (int warm = 0; warm < 3; ++warm) {  // the system loader's first dlopen of libstdc++ etc.
    LoadOrDie("cxx");
    LoadOrDie("tls");
  }
  const size_t mappings = CountLines("/proc/self/maps");
  const size_t descriptors = CountDescriptors();
  for (int i = 0; i < 100; ++i) {
    std::unique_ptr<ElfLibrary> library = LoadOrDie(i % 2 == 0 ? "cxx" : "tls");
    ASSERT_NE(library, nullptr);
    if (i % 2 == 1) Find<int()>(*library, "tls_increment")();
    EXPECT_FALSE(ElfLibrary::Load(ObjectPath("undefined"), TestSymbols).ok());  // fails midway
  }
  EXPECT_EQ(CountLines("/proc/self/maps"), mappings);
  EXPECT_EQ(CountDescriptors(), descriptors);
}

}  // namespace
}  // namespace orochi::interpreters

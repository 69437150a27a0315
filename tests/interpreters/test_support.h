// Helpers shared by the interpreter tests.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "orochi/base/process_memory.h"
#include "orochi/interpreters/interpreter.h"

#define EXPECT_OK(expr) EXPECT_TRUE((expr).ok()) << (expr).ToString()
#define ASSERT_OK(expr)                                          \
  do {                                                           \
    const ::orochi::Status& assert_status = (expr);              \
    ASSERT_TRUE(assert_status.ok()) << assert_status.ToString(); \
  } while (false)

namespace orochi::interpreters {

inline std::unique_ptr<Interpreter> NewCopy(InterpreterOptions options = {}) {
  static int next_id = 1000;
  options.id = next_id++;
  Result<std::unique_ptr<Interpreter>> copy = Interpreter::Create(std::move(options));
  if (!copy.ok()) ADD_FAILURE() << copy.status().ToString();
  return copy.ok() ? std::move(copy).value() : nullptr;
}

inline std::string EvalString(Interpreter& copy, std::string_view expression) {
  Result<Value> value = copy.Eval(expression);
  if (!value.ok()) {
    ADD_FAILURE() << expression << ": " << value.status().ToString();
    return {};
  }
  if (!std::holds_alternative<std::string>(*value)) {
    ADD_FAILURE() << expression << " is not a str";
    return {};
  }
  return std::get<std::string>(*value);
}

inline int64_t EvalInt(Interpreter& copy, std::string_view expression) {
  Result<Value> value = copy.Eval(expression);
  if (!value.ok()) {
    ADD_FAILURE() << expression << ": " << value.status().ToString();
    return -1;
  }
  if (!std::holds_alternative<int64_t>(*value)) {
    ADD_FAILURE() << expression << " is not an int";
    return -1;
  }
  return std::get<int64_t>(*value);
}

inline std::pair<std::string, int64_t> SplitPair(const std::string& text) {
  std::istringstream stream(text);
  std::string first;
  int64_t second = -1;
  stream >> first >> second;
  return {first, second};
}

inline std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

// Where a /proc/self/fd/N path points, e.g. "/memfd:orochi-stdlib.zip (deleted)".
inline std::string MemfdName(const std::string& proc_fd_path) {
  std::error_code error;
  return std::filesystem::read_symlink(proc_fd_path, error).string();
}

// Lines of /proc/self/maps that mention `needle`.
inline int CountMappings(const std::string& needle) {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find(needle) != std::string::npos) ++count;
  }
  return count;
}

inline int CountAllMappings() { return CountMappings(""); }

inline int CountOpenFds() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++count;
  }
  return count;
}

// Sets an environment variable for the scope's lifetime.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "orochi-test-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code error;
    std::filesystem::remove_all(path_, error);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace orochi::interpreters

// Values that cross between the host and Python code in a copy.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "orochi/base/status.h"
#include "orochi/engine/tensor.h"

namespace orochi::interpreters {

// Binary data (Python bytes), kept apart from text (Python str).
struct Bytes {
  std::string data;
  friend bool operator==(const Bytes&, const Bytes&) = default;
};

// None, bool, int (64-bit), float, str (UTF-8), bytes, a tensor or a list of values. A tensor
// crosses between the host and copies as a view of the same engine storage: nothing is copied,
// except a tensor that views memory lent by one copy's Python objects (Storage::borrowed()),
// which that copy copies into engine memory as it hands it out.
struct ValueList;
using Value = std::variant<std::monostate, bool, int64_t, double, std::string, Bytes,
                           engine::Tensor, ValueList>;

// A Python list (tuples arrive as lists too).
struct ValueList {
  std::vector<Value> items;
};

// A function the host offers Python code in every copy, called as
// `orochi.call_host(name, payload)`. It runs on the calling copy's thread with that copy's GIL
// held, possibly from several copies at once, so it must be thread-safe and should be quick.
// An error Status becomes a RuntimeError in Python.
using HostFunction = std::function<Result<Value>(std::string_view payload)>;

}  // namespace orochi::interpreters

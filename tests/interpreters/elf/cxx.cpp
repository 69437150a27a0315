// C++ in a loaded object: static constructors, exceptions caught inside it, exceptions from the
// host unwinding through its frames (running its destructors) and exceptions thrown out of it.
#include <stdexcept>
#include <string>

extern "C" void host_callback(int value);  // throws std::runtime_error

namespace {
int destroyed = 0;
const std::string kStatic("static constructor ran");

struct CountsDestruction {
  CountsDestruction() = default;
  CountsDestruction(const CountsDestruction&) = delete;
  CountsDestruction& operator=(const CountsDestruction&) = delete;
  ~CountsDestruction() { ++destroyed; }
};
}  // namespace

extern "C" const char* cxx_static_string() { return kStatic.c_str(); }

extern "C" int cxx_catch_inside(int value) {
  try {
    throw std::runtime_error("thrown and caught inside");
  } catch (const std::exception&) {
    return value + 1;
  }
}

extern "C" void cxx_call_through(int value) {
  CountsDestruction guard;
  host_callback(value);
}

extern "C" void cxx_throw_out() { throw std::invalid_argument("thrown by the loaded object"); }

extern "C" int cxx_destroyed() { return destroyed; }

// The cost of calling the engine from Python in an interpreter copy, against calling it from
// C++ in the same run:
//   a + b on 1-element tensors, F.linear and an nn.Linear module on a [1, 16] input.
// Binding overhead = Python time per call - the empty Python loop - the engine's own C++ time.
// Goal: under 1 us of binding overhead per op. When Debian's python3-torch is installed, the
// same calls in PyTorch are timed too (torch_baseline.py), as a second baseline.
//
//   bench_python_api [--iterations N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "orochi/engine/ops.h"
#include "orochi/interpreters/interpreter.h"

namespace {

using orochi::engine::Tensor;
using orochi::interpreters::Interpreter;
using Clock = std::chrono::steady_clock;
constexpr int kTrials = 7;

[[noreturn]] void Die(const orochi::Status& status) {
  std::fprintf(stderr, "bench_python_api: %s\n", status.ToString().c_str());
  std::exit(1);
}

// The median over trials of the time per call of `call`, in nanoseconds.
template <typename Fn>
double EngineNs(int iterations, Fn&& call) {
  std::vector<double> trials;
  for (int trial = 0; trial < kTrials; ++trial) {
    auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) call();
    std::chrono::duration<double, std::nano> elapsed = Clock::now() - start;
    trials.push_back(elapsed.count() / iterations);
  }
  std::sort(trials.begin(), trials.end());
  return trials[trials.size() / 2];
}

double PythonNs(Interpreter& copy, const std::string& statement, int iterations) {
  std::string expression =
      "per_call_ns(" + std::string("'") + statement + "', " + std::to_string(iterations) + ")";
  orochi::Result<orochi::interpreters::Value> value = copy.Eval(expression);
  if (!value.ok()) Die(value.status());
  return std::get<double>(*value);
}

constexpr const char* kPythonSetup = R"(
import time
import orochi
import orochi.nn as nn
import orochi.nn.functional as F

def per_call_ns(statement, iterations):
    code = compile(f"for _ in range({iterations}):\n    {statement}\n", "<bench>", "exec")
    trials = []
    for _ in range(7):
        start = time.perf_counter_ns()
        exec(code, globals())
        trials.append((time.perf_counter_ns() - start) / iterations)
    trials.sort()
    return trials[len(trials) // 2]

a = orochi.ones(1)
b = orochi.ones(1)
x = orochi.ones(1, 16)
w = orochi.ones(16, 16)
bias = orochi.ones(16)
layer = nn.Linear(16, 16)
)";

struct TorchTimes {
  std::string version;               // empty when torch could not be run
  std::map<std::string, double> ns;  // per call, by case name
};

// PyTorch's numbers from torch_baseline.py, or nothing when torch is not installed.
TorchTimes TorchBaseline(int iterations) {
  TorchTimes results;
  // OROCHI_BENCH_PYTHON picks another Python with torch (e.g. a newer PyTorch on a GPU machine).
  const char* python = std::getenv("OROCHI_BENCH_PYTHON");
  std::string command = std::string(python != nullptr ? python : "/usr/bin/python3.11") +
                        " " OROCHI_BENCH_SOURCE_DIR "/torch_baseline.py " +
                        std::to_string(iterations) + " 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return results;
  char line[256];
  while (std::fgets(line, sizeof(line), pipe) != nullptr) {
    char name[64];
    char version[64];
    double nanoseconds = 0;
    if (std::sscanf(line, "torch %63s", version) == 1) {
      results.version = version;
    } else if (std::sscanf(line, "%63s %lf", name, &nanoseconds) == 2) {
      results.ns[name] = nanoseconds;
    }
  }
  pclose(pipe);
  return results;
}

int Run(int iterations) {
  orochi::Result<std::unique_ptr<Interpreter>> created = Interpreter::Create({});
  if (!created.ok()) Die(created.status());
  Interpreter& copy = **created;
  if (orochi::Status status = copy.Exec(kPythonSetup); !status.ok()) Die(status);

  Tensor a = orochi::engine::Ones({1});
  Tensor b = orochi::engine::Ones({1});
  Tensor x = orochi::engine::Ones({1, 16});
  Tensor w = orochi::engine::Ones({16, 16});
  Tensor bias = orochi::engine::Ones({16});
  int64_t sink = 0;  // consumed below, so the engine calls are not optimised away

  struct Case {
    const char* name;
    const char* label;
    std::string statement;
    double engine_ns;
  };
  std::vector<Case> cases = {
      {"add", "a + b, 1 element", "a + b",
       EngineNs(iterations,
                [&] { sink += orochi::engine::Binary(orochi::engine::Op::add, a, b).numel(); })},
      {"linear", "F.linear, [1,16] x [16,16]", "F.linear(x, w, bias)",
       EngineNs(iterations, [&] { sink += orochi::engine::Linear(x, w, bias).numel(); })},
      {"module", "nn.Linear(16, 16) module", "layer(x)",
       EngineNs(iterations, [&] { sink += orochi::engine::Linear(x, w, bias).numel(); })},
  };
  double loop_ns = PythonNs(copy, "pass", iterations);
  TorchTimes torch_times = TorchBaseline(iterations);
  std::map<std::string, double>& torch = torch_times.ns;

  std::printf("Python API overhead, %d calls x %d trials (median), one interpreter copy\n",
              iterations, kTrials);
  std::printf("%-28s %10s %10s %12s %10s %14s\n", "call", "C++ ns", "Python ns", "overhead ns",
              "goal", "PyTorch ns");
  bool all_met = true;
  for (const Case& entry : cases) {
    double python_ns = PythonNs(copy, entry.statement, iterations);
    double overhead = python_ns - loop_ns - entry.engine_ns;
    std::string torch_text = "-";
    if (torch.count(entry.name) != 0 && torch.count("loop") != 0) {
      double torch_call = torch[entry.name] - torch["loop"];
      std::ostringstream text;
      text.precision(0);
      text << std::fixed << torch_call << " (x" << std::setprecision(2)
           << (python_ns - loop_ns) / torch_call << ")";
      torch_text = text.str();
    }
    // The module row runs Python code (Module.__call__, forward) on purpose; the goal is about
    // the binding layer, so it applies to the direct calls.
    bool direct = std::strcmp(entry.name, "module") != 0;
    const char* verdict = !direct ? "(info)" : overhead < 1000 ? "met" : "MISSED";
    all_met = all_met && (!direct || overhead < 1000);
    std::printf("%-28s %10.0f %10.0f %12.0f %10s %14s\n", entry.label, entry.engine_ns,
                python_ns - loop_ns, overhead, verdict, torch_text.c_str());
  }
  std::printf("empty Python loop: %.1f ns per iteration (subtracted)\n", loop_ns);
  if (torch.empty()) {
    std::printf(
        "PyTorch baseline: not run (no Python with torch; install python3-torch or set "
        "OROCHI_BENCH_PYTHON)\n");
  } else {
    std::printf(
        "PyTorch column: the same calls in torch %s, inference_mode, 1 thread; (xN) is "
        "Orochi's Python time over PyTorch's\n",
        torch_times.version.c_str());
  }
  std::printf("binding overhead goal (< 1000 ns per direct call): %s\n",
              all_met ? "met" : "MISSED");
  return sink == -1 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 20000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--iterations") == 0) iterations = std::atoi(argv[i + 1]);
  }
  try {
    return Run(iterations);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_python_api: %s\n", error.what());
    return 1;
  }
}

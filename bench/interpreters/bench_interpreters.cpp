// Benchmarks of private interpreter copies, each figure against a baseline from the same run:
//   1. copy creation time (load from memory + CPython start-up), goal <= 30 ms;
//   2. idle resident memory per copy, goal <= 12 MB;
//   3. a CPU-bound pure-Python workload on k = 1..N copies at once versus k threads sharing one
//      interpreter, as throughput relative to one copy; goal >= 0.9 k for copies on k free cores;
//   4. a numpy workload (small arrays, as in pre- and post-processing, so the GIL is held most of
//      the time) on k copies, k threads of one interpreter and k python3.11 processes.
//
//   bench_interpreters [--max-copies N] [--tasks T] [--work W] [--numpy-path DIR]
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "orochi/base/process_memory.h"
#include "orochi/interpreters/interpreter.h"
#include "orochi/interpreters/interpreter_manager.h"

namespace {

using orochi::interpreters::Interpreter;
using orochi::interpreters::InterpreterManager;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const orochi::Status& status) {
  std::fprintf(stderr, "bench_interpreters: %s\n", status.ToString().c_str());
  std::exit(1);
}

template <typename T>
T Check(orochi::Result<T> result) {
  if (!result.ok()) Die(result.status());
  return std::move(result).value();
}

void Check(const orochi::Status& status) {
  if (!status.ok()) Die(status);
}

double Seconds(Clock::duration duration) { return std::chrono::duration<double>(duration).count(); }

// One task: a loop of arithmetic, attribute-free and allocation-light pure Python.
std::string WorkloadSource(long work) {
  return "def task():\n"
         "    total = 0\n"
         "    for i in range(" +
         std::to_string(work) +
         "):\n"
         "        total += (i * i) % 7\n"
         "    return total\n";
}

// One numpy task: a small recurrent layer stepped in Python, numpy's per-call overhead dominant.
std::string NumpyWorkloadSource(long work) {
  return "import numpy as np\n"
         "_rng = np.random.default_rng(0)\n"
         "_weights = _rng.standard_normal((16, 16)) / 4\n"
         "def numpy_task():\n"
         "    state = np.ones(16)\n"
         "    total = 0.0\n"
         "    for _ in range(" +
         std::to_string(work) +
         "):\n"
         "        state = np.tanh(_weights @ state + 0.1)\n"
         "        total += float(state.sum())\n"
         "    return total\n";
}

void BenchCreation(int samples) {
  std::vector<double> milliseconds;
  milliseconds.reserve(static_cast<size_t>(samples));
  for (int i = 0; i < samples; ++i) {
    auto start = Clock::now();
    auto copy = Check(Interpreter::Create({}));
    milliseconds.push_back(Seconds(Clock::now() - start) * 1000);
  }
  std::sort(milliseconds.begin(), milliseconds.end());
  std::printf(
      "copy creation:   median %.1f ms, best %.1f ms, worst %.1f ms over %d copies"
      "  (goal <= 30 ms)\n",
      milliseconds[milliseconds.size() / 2], milliseconds.front(), milliseconds.back(), samples);
}

void BenchIdleMemory(int copies) {
  malloc_trim(0);
  const int64_t before = orochi::ResidentBytes();
  std::vector<std::unique_ptr<Interpreter>> alive;
  alive.reserve(static_cast<size_t>(copies));
  for (int i = 0; i < copies; ++i) alive.push_back(Check(Interpreter::Create({})));
  malloc_trim(0);
  double per_copy_mb = static_cast<double>(orochi::ResidentBytes() - before) / copies / (1 << 20);
  std::printf("idle memory:     %.1f MB resident per copy over %d copies  (goal <= 12 MB)\n",
              per_copy_mb, copies);
}

// Throughput of `copies` copies running `tasks` calls of `task` each, at the same time.
double CopiesThroughput(InterpreterManager& manager, int copies, int tasks,
                        const std::string& task = "task") {
  auto start = Clock::now();
  {
    std::vector<std::jthread> workers;
    workers.reserve(static_cast<size_t>(copies));
    for (int slot = 0; slot < copies; ++slot) {
      workers.emplace_back([&, slot] {
        auto lease = manager.AcquireSlot(static_cast<size_t>(slot));
        Check(lease->Exec("for _ in range(" + std::to_string(tasks) + "): " + task + "()"));
      });
    }
  }
  return copies * tasks / Seconds(Clock::now() - start);
}

// Throughput of `threads` Python threads of one interpreter running `tasks` tasks each.
double SharedThroughput(Interpreter& copy, int threads, int tasks,
                        const std::string& task = "task") {
  Check(
      copy.Exec("import threading, time\n"
                "def worker():\n"
                "    for _ in range(" +
                std::to_string(tasks) + "): " + task +
                "()\n"
                "pool = [threading.Thread(target=worker) for _ in range(" +
                std::to_string(threads) +
                ")]\n"
                "started = time.perf_counter()\n"
                "for t in pool: t.start()\n"
                "for t in pool: t.join()\n"
                "elapsed = time.perf_counter() - started\n"));
  auto elapsed = std::get<double>(Check(copy.Eval("elapsed")));
  return threads * tasks / elapsed;
}

// Throughput of `processes` python3.11 processes running `tasks` numpy tasks each. They start
// together at an agreed CLOCK_MONOTONIC time (after numpy's import), and the run ends when the
// last one does.
double ProcessesThroughput(const std::string& numpy_path, long work, int processes, int tasks) {
  std::string script = "import sys, time\nsys.path.insert(0, '" + numpy_path + "')\n" +
                       NumpyWorkloadSource(work) +
                       "numpy_task()\n"
                       "start_at = float(sys.argv[1])\n"
                       "time.sleep(max(0.0, start_at - time.monotonic()))\n"
                       "for _ in range(" +
                       std::to_string(tasks) +
                       "): numpy_task()\n"
                       "print(time.monotonic())\n";
  std::string script_path = "/tmp/orochi-bench-numpy-" + std::to_string(getpid()) + ".py";
  std::ofstream(script_path) << script;
  double start_at = Seconds(Clock::now().time_since_epoch()) + 2.0;
  std::vector<FILE*> children;
  for (int i = 0; i < processes; ++i) {
    std::string command = "OPENBLAS_NUM_THREADS=1 /usr/bin/python3.11 " + script_path + " " +
                          std::to_string(start_at);
    children.push_back(popen(command.c_str(), "r"));
  }
  double last_end = start_at;
  for (FILE* child : children) {
    double end = 0;
    if (child == nullptr || std::fscanf(child, "%lf", &end) != 1) {
      std::fprintf(stderr, "bench_interpreters: a python3.11 process failed\n");
      std::exit(1);
    }
    pclose(child);
    last_end = std::max(last_end, end);
  }
  std::remove(script_path.c_str());
  return processes * tasks / (last_end - start_at);
}

void BenchNumpy(const std::string& numpy_path, int max_copies, int tasks, long work,
                const std::vector<int>& worker_counts) {
  orochi::interpreters::ManagerOptions options;
  options.copies = static_cast<size_t>(max_copies);
  options.flags.extra_paths = {numpy_path};
  auto manager = Check(InterpreterManager::Create(std::move(options)));
  for (size_t slot = 0; slot < manager->size(); ++slot) {
    Check(manager->AcquireSlot(slot)->Exec(NumpyWorkloadSource(work)));
  }
  orochi::interpreters::InterpreterOptions shared_options;
  shared_options.flags.extra_paths = {numpy_path};
  auto shared = Check(Interpreter::Create(std::move(shared_options)));
  Check(shared->Exec(NumpyWorkloadSource(work)));

  CopiesThroughput(*manager, 1, 2, "numpy_task");
  double one_copy = CopiesThroughput(*manager, 1, tasks, "numpy_task");
  std::printf("\nnumpy on small arrays, throughput relative to one copy (%.1f tasks/s):\n",
              one_copy);
  std::printf("%8s %10s %16s %12s %15s %17s\n", "workers", "k copies", "k threads/1 GIL",
              "k processes", "copies/threads", "copies/processes");
  for (int k : worker_counts) {
    double copies = CopiesThroughput(*manager, k, tasks, "numpy_task");
    double threads = SharedThroughput(*shared, k, tasks, "numpy_task");
    double processes = ProcessesThroughput(numpy_path, work, k, tasks);
    std::printf("%8d %9.2fx %15.2fx %11.2fx %14.2fx %16.2fx\n", k, copies / one_copy,
                threads / one_copy, processes / one_copy, copies / threads, copies / processes);
  }
}

int Main(int argc, char** argv) {
  int max_copies = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  int tasks = 20;
  long work = 300000;
  std::string numpy_path = "/usr/lib/python3/dist-packages";  // Debian's python3-numpy
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--max-copies") == 0) max_copies = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--tasks") == 0) tasks = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--work") == 0) work = std::atol(argv[i + 1]);
    if (std::strcmp(argv[i], "--numpy-path") == 0) numpy_path = argv[i + 1];
  }
  std::printf(
      "bench_interpreters: %u hardware threads, up to %d copies, %d tasks of %ld "
      "iterations per worker\n\n",
      std::thread::hardware_concurrency(), max_copies, tasks, work);

  BenchCreation(20);
  BenchIdleMemory(8);

  orochi::interpreters::ManagerOptions options;
  options.copies = static_cast<size_t>(max_copies);
  auto manager = Check(InterpreterManager::Create(std::move(options)));
  for (size_t slot = 0; slot < manager->size(); ++slot) {
    Check(manager->AcquireSlot(slot)->Exec(WorkloadSource(work)));
  }
  auto shared = Check(Interpreter::Create({}));
  Check(shared->Exec(WorkloadSource(work)));

  CopiesThroughput(*manager, 1, 2);  // warm up caches and CPU frequency
  double one_copy = CopiesThroughput(*manager, 1, tasks);
  std::printf("\nCPU-bound pure Python, throughput relative to one copy (%.1f tasks/s):\n",
              one_copy);
  std::printf("%8s %14s %16s %16s\n", "workers", "k copies", "k threads/1 GIL", "copies/shared");
  std::vector<int> worker_counts;
  for (int k = 1; k < max_copies; k = k < 4 ? k + 1 : k * 2) worker_counts.push_back(k);
  worker_counts.push_back(max_copies);
  for (int k : worker_counts) {
    double copies = CopiesThroughput(*manager, k, tasks);
    double threads = SharedThroughput(*shared, k, tasks);
    std::printf("%8d %13.2fx %15.2fx %15.2fx%s\n", k, copies / one_copy, threads / one_copy,
                copies / threads, copies / one_copy >= 0.9 * k ? "" : "   (below 0.9 k)");
  }

  // About as long per task as the pure-Python one.
  BenchNumpy(numpy_path, max_copies, tasks, std::max(1L, work / 60), worker_counts);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_interpreters: %s\n", error.what());
    return 1;
  }
}

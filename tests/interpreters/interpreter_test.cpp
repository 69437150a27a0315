// Tests of single interpreter copies: isolation, parallelism, the embedded stdlib, imports,
// errors, values, host functions and unloading.
#include "orochi/interpreters/interpreter.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "orochi/interpreters/interpreter_manager.h"
#include "test_support.h"

namespace orochi::interpreters {
namespace {

using namespace std::chrono_literals;
using testing::HasSubstr;
using testing::StartsWith;

TEST(InterpreterIsolation, GlobalsModulesNoneAndCppStaticsAreSeparate) {
  auto a = NewCopy();
  auto b = NewCopy();
  ASSERT_OK(a->Exec("import json, sys\nname = 'copy a'\njson.marker = 'set in a'"));
  ASSERT_OK(b->Exec("import json, sys\nname = 'copy b'"));
  EXPECT_EQ(EvalString(*a, "name"), "copy a");
  EXPECT_EQ(EvalString(*b, "name"), "copy b");
  // Module state: the json module of b is its own.
  EXPECT_EQ(EvalString(*b, "str(hasattr(json, 'marker'))"), "False");
  // sys.modules and the None singleton are different objects in the same address space.
  EXPECT_NE(EvalInt(*a, "id(sys.modules)"), EvalInt(*b, "id(sys.modules)"));
  EXPECT_NE(EvalInt(*a, "id(None)"), EvalInt(*b, "id(None)"));
  EXPECT_NE(EvalInt(*a, "id(sys)"), EvalInt(*b, "id(sys)"));
  // The copy's C++ state lives behind an inline function with a static; with GNU unique
  // symbols it would be one object for the whole process.
  ASSERT_OK(a->Exec("import _orochi"));
  ASSERT_OK(b->Exec("import _orochi"));
  const char* probe = "'%d %d' % _orochi._state_probe()";
  auto [a_address, a_first] = SplitPair(EvalString(*a, probe));
  auto [a_address_again, a_second] = SplitPair(EvalString(*a, probe));
  auto [b_address, b_first] = SplitPair(EvalString(*b, probe));
  EXPECT_EQ(a_address, a_address_again);
  EXPECT_NE(a_address, b_address);
  EXPECT_EQ(a_first, 1);
  EXPECT_EQ(a_second, 2);
  EXPECT_EQ(b_first, 1);  // b's counter never saw a's increments
}

// A host function that returns once `expected` callers are inside it at the same time, or
// fails after `timeout`. It records the most callers ever inside at once.
class Barrier {
 public:
  Barrier(int expected, std::chrono::milliseconds timeout)
      : expected_(expected), timeout_(timeout) {}

  Result<Value> Arrive() {
    std::unique_lock lock(mutex_);
    ++inside_;
    most_inside_ = std::max(most_inside_, inside_);
    if (inside_ >= expected_) released_ = true;
    all_arrived_.notify_all();
    bool released = all_arrived_.wait_for(lock, timeout_, [this] { return released_; });
    --inside_;
    if (!released) return DeadlineExceeded("barrier timed out");
    return Value{int64_t{expected_}};
  }

  int most_inside() {
    std::lock_guard lock(mutex_);
    return most_inside_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  const int expected_;
  const std::chrono::milliseconds timeout_;
  int inside_ = 0;
  int most_inside_ = 0;
  bool released_ = false;
};

TEST(InterpreterParallelism, FourCopiesHoldTheirOwnGilsAtOnce) {
  constexpr int kCopies = 4;
  Barrier barrier(kCopies, 20s);
  ManagerOptions options;
  options.copies = kCopies;
  options.host_functions["barrier"] = [&](std::string_view) { return barrier.Arrive(); };
  auto manager = InterpreterManager::Create(std::move(options));
  ASSERT_OK(manager.status());

  // Each copy enters Python and, holding its GIL, waits in the host for all the others. With
  // one GIL shared between the copies, only one could be inside at a time and all would time
  // out.
  std::vector<Status> results(kCopies);
  {
    std::vector<std::jthread> threads;
    for (int slot = 0; slot < kCopies; ++slot) {
      threads.emplace_back([&, slot] {
        auto lease = (*manager)->AcquireSlot(static_cast<size_t>(slot));
        results[static_cast<size_t>(slot)] =
            lease->Exec("import orochi\nassert orochi.call_host('barrier') == 4");
      });
    }
  }
  for (const Status& result : results) EXPECT_OK(result);
  EXPECT_EQ(barrier.most_inside(), kCopies);
}

TEST(InterpreterParallelism, ThreadsOfOneCopyShareItsGil) {
  // The control for the test above: two Python threads of one copy cannot both be inside the
  // host function, because the caller keeps the copy's GIL. Both time out, one after the other.
  Barrier barrier(2, 300ms);
  InterpreterOptions options;
  options.host_functions["barrier"] = [&](std::string_view) { return barrier.Arrive(); };
  auto copy = NewCopy(std::move(options));
  ASSERT_OK(copy->Exec(R"(
import threading, orochi
failures = []
def wait():
    try:
        orochi.call_host('barrier')
    except RuntimeError as error:
        failures.append(str(error))
threads = [threading.Thread(target=wait) for _ in range(2)]
for thread in threads: thread.start()
for thread in threads: thread.join()
)"));
  EXPECT_EQ(EvalInt(*copy, "len(failures)"), 2);
  EXPECT_THAT(EvalString(*copy, "failures[0]"), HasSubstr("barrier timed out"));
  EXPECT_EQ(barrier.most_inside(), 1);
}

TEST(InterpreterStdlib, ComesFromTheEmbeddedArchiveWhateverThePythonEnvironment) {
  ScopedEnv home("PYTHONHOME", "/garbage/home");
  ScopedEnv path("PYTHONPATH", "/garbage/path:/usr/lib/python3.11");
  ScopedEnv startup("PYTHONSTARTUP", "/garbage/startup.py");
  ScopedEnv warnings("PYTHONWARNINGS", "error");
  ScopedEnv safe("PYTHONSAFEPATH", "");
  auto copy = NewCopy();
  ASSERT_OK(copy->Exec("import json, sys, os"));
  std::vector<std::string> sys_path = Lines(EvalString(*copy, "'\\n'.join(sys.path)"));
  ASSERT_EQ(sys_path.size(), 3U);
  EXPECT_EQ(MemfdName(sys_path[0]), "/memfd:orochi-stdlib.zip (deleted)");
  EXPECT_EQ(MemfdName(sys_path[1]), "/memfd:orochi-python.zip (deleted)");
  EXPECT_EQ(sys_path[2], "/usr/lib/python3.11/lib-dynload");  // C extension modules only
  EXPECT_THAT(EvalString(*copy, "json.__file__"), StartsWith(sys_path[0] + "/json/"));
  EXPECT_THAT(EvalString(*copy, "__import__('textwrap').__file__"), StartsWith(sys_path[0] + "/"));
  EXPECT_THAT(EvalString(*copy, "__import__('orochi').__file__"), StartsWith(sys_path[1] + "/"));
  EXPECT_EQ(EvalInt(*copy, "sys.flags.ignore_environment"), 1);
  EXPECT_EQ(EvalString(*copy, "repr(sys.warnoptions)"), "[]");
  // Nothing but C extension modules came from the system's Python directories.
  EXPECT_EQ(EvalString(*copy,
                       "','.join(n for n, m in sorted(sys.modules.items()) "
                       "if (getattr(m, '__file__', None) or '').startswith('/usr/lib/python') "
                       "and not m.__file__.endswith('.so'))"),
            "");
}

TEST(InterpreterImports, CExtensionModulesLoadIntoEachCopyOnItsOwn) {
  auto first = NewCopy();
  auto second = NewCopy();
  for (Interpreter* copy : {first.get(), second.get()}) {
    ASSERT_OK(copy->Exec("import _json, json, _decimal, decimal, sys"));
    EXPECT_THAT(EvalString(*copy, "_json.__file__"),
                StartsWith("/usr/lib/python3.11/lib-dynload/_json."));
    EXPECT_EQ(EvalString(*copy, "str(json.encoder.c_make_encoder is _json.make_encoder)"), "True");
    EXPECT_EQ(EvalString(*copy, "str(decimal.Decimal(1) / 8)"), "0.125");
    EXPECT_EQ(EvalString(*copy, "str('_pydecimal' in sys.modules)"), "False");
  }
  // Each copy mapped its own instance: module state and static data are not shared.
  ASSERT_OK(first->Exec("import _decimal\n_decimal.getcontext().prec = 5"));
  EXPECT_EQ(EvalString(*first, "str(decimal.Decimal(1) / 3)"), "0.33333");
  EXPECT_EQ(EvalString(*second, "str(decimal.Decimal(1) / 3)"), "0.3333333333333333333333333333");
  EXPECT_NE(EvalString(*first, "hex(id(_json.make_encoder))"),
            EvalString(*second, "hex(id(_json.make_encoder))"));
}

TEST(InterpreterImports, AnExtensionTheLoaderRefusesIsAnImportErrorThatSaysWhy) {
  auto copy = NewCopy();
  TempDir dir;
  std::ofstream(dir.path() / "fastthing.cpython-311-x86_64-linux-gnu.so") << "not an ELF file";
  ASSERT_OK(copy->Exec("import sys\nsys.path.append('" + dir.path().string() + "')"));
  Status status = copy->Exec("import fastthing");
  EXPECT_EQ(status.code(), StatusCode::kPythonError);
  EXPECT_THAT(status.message(), HasSubstr("ImportError"));
  EXPECT_THAT(status.message(),
              HasSubstr("fastthing.cpython-311-x86_64-linux-gnu.so: not an ELF file"));
  // The copy goes on working, with its other extensions.
  ASSERT_OK(copy->Exec("import _json"));
}

TEST(InterpreterImports, AsyncioAndContextVarsWork) {
  auto copy = NewCopy();
  ASSERT_OK(copy->Exec("import json, decimal, asyncio, contextvars, sys"));
  EXPECT_EQ(EvalString(*copy, "json.dumps({'a': [1, 2.5, None, 'é']})"),
            R"({"a": [1, 2.5, null, "\u00e9"]})");
  EXPECT_EQ(EvalString(*copy, "str(json.loads('[1, {\"b\": true}]'))"), "[1, {'b': True}]");
  EXPECT_EQ(EvalString(*copy, "asyncio.Future.__module__"), "_asyncio");
  ASSERT_OK(copy->Exec(R"(
async def twice(value):
    await asyncio.sleep(0)
    return value * 2
var = contextvars.ContextVar('var', default=1)
result = asyncio.run(twice(21))
)"));
  EXPECT_EQ(EvalInt(*copy, "result"), 42);
}

TEST(InterpreterErrors, PythonExceptionsCarryTypeMessageAndTraceback) {
  auto copy = NewCopy();
  Status status = copy->Exec(
      "def check(value):\n    raise ValueError(f'bad input {value}')\n"
      "check(7)\n",
      "<model code>");
  EXPECT_EQ(status.code(), StatusCode::kPythonError);
  EXPECT_EQ(status.message(), "ValueError: bad input 7");
  EXPECT_THAT(status.detail(), HasSubstr("File \"<model code>\", line 2, in check"));
  EXPECT_THAT(status.detail(), HasSubstr("File \"<model code>\", line 3, in <module>"));

  Result<Value> decoded = copy->Call("json:loads", std::vector<Value>{std::string("{broken")});
  EXPECT_EQ(decoded.status().code(), StatusCode::kPythonError);
  EXPECT_THAT(decoded.status().message(), StartsWith("json.decoder.JSONDecodeError: "));

  EXPECT_EQ(copy->Exec("def broken(:").code(), StatusCode::kPythonError);
  // The copy is still usable after errors.
  EXPECT_EQ(EvalInt(*copy, "6 * 7"), 42);
}

TEST(InterpreterCalls, ValuesCrossInBothDirections) {
  auto copy = NewCopy();
  std::vector<Value> numbers{int64_t{3}, int64_t{9}, int64_t{4}};
  EXPECT_EQ(std::get<int64_t>(*copy->Call("builtins:max", numbers)), 9);
  std::vector<Value> texts{std::string("héllo "), std::string("wörld")};
  EXPECT_EQ(std::get<std::string>(*copy->Call("operator:add", texts)), "héllo wörld");
  std::vector<Value> raw{Bytes{std::string("\0\1\2", 3)}};
  EXPECT_EQ(std::get<Bytes>(*copy->Call("builtins:bytes", raw)).data, std::string("\0\1\2", 3));
  std::vector<Value> floats{2.5, 0.25};
  EXPECT_DOUBLE_EQ(std::get<double>(*copy->Call("operator:mul", floats)), 0.625);
  EXPECT_TRUE(std::get<bool>(*copy->Call("operator:truth", std::vector<Value>{true})));
  EXPECT_TRUE(std::holds_alternative<std::monostate>(*copy->Eval("None")));
  EXPECT_EQ(std::get<int64_t>(*copy->Call("os.path:__name__.__len__")), 9);  // "posixpath"

  EXPECT_EQ(copy->Eval("2 ** 70").status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(copy->Eval("{1: 2}").status().message(), HasSubstr("not dict"));
  Result<Value> nested = copy->Eval("[1, ('two', [b'3', None])]");
  ASSERT_TRUE(nested.ok()) << nested.status().ToString();
  const auto& outer = std::get<ValueList>(*nested).items;
  ASSERT_EQ(outer.size(), 2U);
  EXPECT_EQ(std::get<int64_t>(outer[0]), 1);
  const auto& inner = std::get<ValueList>(outer[1]).items;
  EXPECT_EQ(std::get<std::string>(inner[0]), "two");
  const auto& innermost = std::get<ValueList>(inner[1]).items;
  EXPECT_EQ(std::get<Bytes>(innermost[0]).data, "3");
  EXPECT_TRUE(std::holds_alternative<std::monostate>(innermost[1]));
  std::vector<Value> list_argument{ValueList{{int64_t{1}, ValueList{{int64_t{2}, int64_t{3}}}}}};
  EXPECT_EQ(std::get<std::string>(*copy->Call("builtins:repr", list_argument)), "[1, [2, 3]]");
  EXPECT_EQ(copy->Call("no_such_module:f").status().code(), StatusCode::kPythonError);
  EXPECT_THAT(copy->Call("json").status().message(), HasSubstr("not of the form 'module:name'"));
}

TEST(InterpreterHostFunctions, ResultsAndErrorsReachPython) {
  InterpreterOptions options;
  options.host_functions["echo"] = [](std::string_view payload) -> Result<Value> {
    return Value{Bytes{std::string(payload)}};
  };
  options.host_functions["refuse"] = [](std::string_view) -> Result<Value> {
    return InvalidArgument("payload rejected by the host");
  };
  auto copy = NewCopy(std::move(options));
  ASSERT_OK(copy->Exec("import orochi"));
  EXPECT_EQ(EvalString(*copy, "orochi.call_host('echo', b'ping').decode()"), "ping");
  Status refused = copy->Exec("orochi.call_host('refuse')");
  EXPECT_THAT(refused.message(), HasSubstr("RuntimeError"));
  EXPECT_THAT(refused.message(), HasSubstr("payload rejected by the host"));
  EXPECT_THAT(copy->Exec("orochi.call_host('missing')").message(),
              HasSubstr("no host function is registered as 'missing'"));
}

TEST(InterpreterOutput, WithASinkStdoutAndStderrArriveLineByLineWithTheCaller) {
  struct Received {
    OutputLine::Stream stream;
    std::string text;
    bool cut;
    std::string caller;
  };
  std::mutex mutex;
  std::vector<Received> lines;
  InterpreterOptions options;
  options.output = [&](const OutputLine& line) {
    std::lock_guard lock(mutex);
    lines.push_back({line.stream, std::string(line.text), line.cut, std::string(line.caller)});
  };
  auto copy = NewCopy(std::move(options));
  copy->SetCaller("model:1");
  ASSERT_OK(
      copy->Exec("import sys, threading\n"
                 "print('one', 2)\n"
                 "sys.stderr.write('err\\npartial')\n"
                 "sys.stdout.buffer.write(b'caf\\xc3')\n"
                 "sys.stdout.buffer.write(b'\\xa9\\n')\n"
                 "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
                 "print('x' * 5000 + '\\nafter')\n"
                 "assert not sys.stdout.isatty()\n"));
  copy->SetCaller("other:2");
  ASSERT_OK(copy->Exec("print('é', end='', flush=True)"));
  std::lock_guard lock(mutex);
  ASSERT_EQ(lines.size(), 8U);
  const auto out = OutputLine::Stream::kStdout;
  const auto err = OutputLine::Stream::kStderr;
  EXPECT_EQ(lines[0].stream, out);
  EXPECT_EQ(lines[0].text, "one 2");
  EXPECT_EQ(lines[0].caller, "model:1");
  EXPECT_EQ(lines[1].stream, err);
  EXPECT_EQ(lines[1].text, "err");
  EXPECT_EQ(lines[2].text, "café");
  EXPECT_EQ(lines[3].text, "thread");
  EXPECT_EQ(lines[4].text, std::string(kOutputLineLimit, 'x'));
  EXPECT_TRUE(lines[4].cut);
  EXPECT_EQ(lines[5].text, "after");
  EXPECT_FALSE(lines[5].cut);
  // A partial line goes when its call ends (the streams are flushed after every call).
  EXPECT_EQ(lines[6].stream, err);
  EXPECT_EQ(lines[6].text, "partial");
  EXPECT_EQ(lines[7].text, "é");
  EXPECT_EQ(lines[7].caller, "other:2");
}

TEST(InterpreterUnload, LateCallsReturnAnErrorNotACrash) {
  auto copy = NewCopy();
  ASSERT_OK(copy->Exec("x = 1"));
  std::string mapping = "orochi-copy-" + std::to_string(copy->id());
  EXPECT_GT(CountMappings(mapping), 0);
  ASSERT_OK(copy->Unload());
  EXPECT_FALSE(copy->loaded());
  EXPECT_EQ(CountMappings(mapping), 0) << "the copy's code must be unmapped";
  // Every entry of the table now answers from the host's stubs.
  for (const Status& late :
       {copy->Exec("x = 2"), copy->Eval("x").status(), copy->Call("builtins:len").status(),
        copy->Run(Program{Program::Kind::kCode, "pass", {}}).status()}) {
    EXPECT_EQ(late.code(), StatusCode::kUnavailable);
    EXPECT_THAT(late.message(), HasSubstr("is unloaded"));
  }
  EXPECT_OK(copy->Unload());  // idempotent
}

TEST(InterpreterUnload, WaitsForThreadsAndKeepsABusyCopyMapped) {
  // A daemon thread that wakes up often leaves as soon as it reaches for the GIL after
  // finalization; the copy is then unmapped normally.
  auto copy = NewCopy();
  ASSERT_OK(copy->Exec(R"(
import threading, time
def spin():
    while True:
        time.sleep(0.005)
threading.Thread(target=spin, daemon=True).start()
)"));
  std::string mapping = "orochi-copy-" + std::to_string(copy->id());
  EXPECT_OK(copy->Unload());
  EXPECT_EQ(CountMappings(mapping), 0);

  // A daemon thread asleep for an hour cannot leave in time: the copy stays mapped, reported.
  auto sleeper = NewCopy();
  ASSERT_OK(sleeper->Exec(
      "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True)"
      ".start()"));
  Status status = sleeper->Unload(100ms);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("1 thread(s) running"));
  EXPECT_EQ(sleeper->Eval("1").status().code(), StatusCode::kUnavailable);
}

TEST(InterpreterUnload, WorksFromAnotherThreadThanTheOneThatImportedThreading) {
  // threading's "main thread" is whichever thread imported it first; the copy is driven and
  // unloaded from other threads. Finalization must neither wait for it nor hang.
  auto copy = NewCopy();
  std::jthread([&] {
    ASSERT_OK(copy->Exec(
        "import threading\nworker = threading.Thread(target=lambda: None)\nworker.start()"));
  }).join();
  auto unloaded = std::async(std::launch::async, [&] { return copy->Unload(); });
  ASSERT_EQ(unloaded.wait_for(20s), std::future_status::ready) << "Unload hangs";
  EXPECT_OK(unloaded.get());
}

TEST(InterpreterThreads, EachOsThreadKeepsItsOwnPythonThreadState) {
  auto copy = NewCopy();
  ASSERT_OK(copy->Exec("import threading\nlocal = threading.local()"));
  std::jthread([&] {
    ASSERT_OK(copy->Exec("local.value = 'first thread'"));
    EXPECT_EQ(EvalString(*copy, "local.value"), "first thread");  // kept between calls
  }).join();
  std::jthread([&] {
    EXPECT_EQ(EvalString(*copy, "str(getattr(local, 'value', None))"), "None");
  }).join();
}

}  // namespace
}  // namespace orochi::interpreters

namespace orochi::interpreters {
namespace {

TEST(InterpreterInterrupt, RaisesTimeoutErrorInTheRunningCallAndTheCopyGoesOn) {
  auto copy = NewCopy();
  ASSERT_TRUE(copy);
  ASSERT_OK(copy->Exec("def spin():\n    while True:\n        pass\n"));
  EXPECT_FALSE(*copy->Interrupt()) << "nothing runs yet";
  Result<Value> spun = Internal("not run");
  std::thread caller([&] { spun = copy->Call("__main__:spin"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Result<bool> delivered = copy->Interrupt();
  caller.join();
  ASSERT_TRUE(delivered.ok());
  EXPECT_TRUE(*delivered);
  ASSERT_FALSE(spun.ok());
  EXPECT_EQ(spun.status().code(), StatusCode::kPythonError);
  EXPECT_THAT(spun.status().message(), HasSubstr("TimeoutError"));
  EXPECT_EQ(EvalInt(*copy, "21 * 2"), 42) << "the copy serves the next call";
  // An interrupt that finds no call is not kept for the next one.
  EXPECT_FALSE(*copy->Interrupt());
  EXPECT_EQ(EvalInt(*copy, "sum(range(100000))"), 4999950000);
}

}  // namespace
}  // namespace orochi::interpreters

// `orochi python`: a private interpreter copy used like the python command.
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "orochi/interpreters/interpreter.h"
#include "orochi/interpreters/interpreter_manager.h"

namespace orochi::cli {

const char* const kPythonUsage = R"(
Usage: orochi python [--copies N] [-c CODE | -m MODULE | FILE | -] [ARGS...]

  -c CODE     run CODE (sys.argv[0] is '-c')
  -m MODULE   run MODULE as __main__, like python -m
  FILE        run a script, a directory or a zip with __main__.py
  -           run the program read from stdin
  (nothing)   an interactive prompt when stdin is a terminal, else run stdin
  --copies N  run the same program in N private copies at once, in one process; the exit
              status is the first non-zero status in copy order

The copy sees only the embedded stdlib and Orochi's package (plus the script's directory, as
python does); PYTHON* environment variables are ignored.)";

namespace {

struct Invocation {
  size_t copies = 1;
  interpreters::Program program;
};

// Parses python-style arguments: options end at the program, the rest is sys.argv[1:].
std::optional<Invocation> Parse(const std::vector<std::string>& args, std::string* error) {
  Invocation invocation;
  invocation.program.kind = interpreters::Program::Kind::kInteractive;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--copies") {
      if (i + 1 == args.size()) {
        *error = "--copies needs a number";
        return std::nullopt;
      }
      const std::string& number = args[++i];
      auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(),
                                       invocation.copies);
      if (ec != std::errc() || end != number.data() + number.size() || invocation.copies == 0 ||
          invocation.copies > 256) {
        *error = "--copies must be a number from 1 to 256, not '" + number + "'";
        return std::nullopt;
      }
    } else if (arg == "-c" || arg == "-m") {
      if (i + 1 == args.size()) {
        *error = "Argument expected for the " + arg + " option";
        return std::nullopt;
      }
      invocation.program.kind = arg == "-c" ? interpreters::Program::Kind::kCode
                                            : interpreters::Program::Kind::kModule;
      invocation.program.target = args[++i];
      ++i;
      break;
    } else if (arg == "-") {
      invocation.program.kind = interpreters::Program::Kind::kInteractive;
      ++i;
      break;
    } else if (arg.size() > 1 && arg[0] == '-') {
      *error = "unknown option " + arg;
      return std::nullopt;
    } else {
      invocation.program.kind = interpreters::Program::Kind::kFile;
      invocation.program.target = arg;
      ++i;
      break;
    }
  }
  invocation.program.argv.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (invocation.copies > 1 &&
      invocation.program.kind == interpreters::Program::Kind::kInteractive && isatty(0)) {
    *error = "--copies needs a program; an interactive prompt runs in one copy";
    return std::nullopt;
  }
  return invocation;
}

int Fail(const Status& status) {
  std::cerr << "orochi python: " << status.ToString() << '\n';
  return 1;
}

int RunInOneCopy(const interpreters::Program& program) {
  interpreters::InterpreterOptions options;
  options.install_signal_handlers = true;  // this copy owns the process: Ctrl-C works as usual
  Result<std::unique_ptr<interpreters::Interpreter>> interpreter =
      interpreters::Interpreter::Create(std::move(options));
  if (!interpreter.ok()) return Fail(interpreter.status());
  Result<int> status = (*interpreter)->Run(program);
  Status unloaded = (*interpreter)->Unload();  // runs atexit handlers and flushes, like python
  if (!status.ok()) return Fail(status.status());
  if (!unloaded.ok() && *status == 0) return Fail(unloaded);
  return *status;
}

int RunInManyCopies(const interpreters::Program& program, size_t copies) {
  interpreters::ManagerOptions options;
  options.copies = copies;
  auto manager = interpreters::InterpreterManager::Create(std::move(options));
  if (!manager.ok()) return Fail(manager.status());
  std::vector<Result<int>> statuses(copies, Internal("not run"));
  {
    std::vector<std::jthread> runners;
    for (size_t slot = 0; slot < copies; ++slot) {
      runners.emplace_back([&, slot] {
        auto lease = (*manager)->AcquireSlot(slot);
        statuses[slot] = lease->Run(program);
      });
    }
  }
  for (size_t slot = 0; slot < copies; ++slot) {
    if (!statuses[slot].ok()) return Fail(statuses[slot].status());
  }
  for (size_t slot = 0; slot < copies; ++slot) {
    if (*statuses[slot] != 0) return *statuses[slot];
  }
  return 0;
}

}  // namespace

int RunPythonCommand(const std::vector<std::string>& args) {
  std::string error;
  std::optional<Invocation> invocation = Parse(args, &error);
  if (!invocation) {
    std::cerr << "orochi python: " << error << '\n' << kPythonUsage << '\n';
    return 2;
  }
  std::cout.flush();
  if (invocation->copies == 1) return RunInOneCopy(invocation->program);
  return RunInManyCopies(invocation->program, invocation->copies);
}

}  // namespace orochi::cli

// `orochi python`: a private interpreter copy used like the python command.
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "commands.h"
#include "orochi/interpreters/interpreter.h"
#include "orochi/interpreters/interpreter_manager.h"

namespace orochi::cli {

const char* const kPythonUsage = R"(
Usage: orochi python [OPTIONS] [-c CODE | -m MODULE | FILE | -] [ARGS...]
       orochi-python  [OPTIONS] [-c CODE | -m MODULE | FILE | -] [ARGS...]

  -c CODE     run CODE (sys.argv[0] is '-c')
  -m MODULE   run MODULE as __main__, like python -m
  FILE        run a script, a directory or a zip with __main__.py
  -           run the program read from stdin
  (nothing)   an interactive prompt when stdin is a terminal, else run stdin
  --copies N  run the same program in N private copies at once, in one process; the exit
              status is the first non-zero status in copy order
  --path DIR  also import from DIR (after the embedded stdlib); repeatable. The host (not the
              copy) also reads OROCHI_PYTHON_PATH, a colon-separated list, so child processes
              started through sys.executable see the same paths

CPython's options -W ARG, -X OPT, -O, -OO, -u, -v, -b, -bb, -P, -I and -V work as in python;
-E, -s, -S, -B, -q and -d are accepted and change nothing, because a copy always ignores
PYTHON* environment variables, has no site and writes no bytecode. A copy sees only the
embedded stdlib and Orochi's package, plus the script's directory as python adds it.)";

namespace {

struct Invocation {
  size_t copies = 1;
  bool print_version = false;
  bool print_help = false;
  interpreters::PythonFlags flags;
  interpreters::Program program;
};

bool ParseCopies(const std::string& number, size_t* copies) {
  auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), *copies);
  return ec == std::errc() && end == number.data() + number.size() && *copies >= 1 &&
         *copies <= 256;
}

// Parses python-style arguments: options end at the program, the rest is sys.argv[1:].
// Short options combine (-Es) and take their value attached or next (-Wignore, -W ignore).
std::optional<Invocation> Parse(const std::vector<std::string>& args, std::string* error) {
  using Kind = interpreters::Program::Kind;
  Invocation invocation;
  invocation.program.kind = Kind::kInteractive;
  size_t i = 0;
  bool program_found = false;
  bool safe_path = false;
  if (const char* env_paths = std::getenv("OROCHI_PYTHON_PATH"); env_paths != nullptr) {
    std::string_view rest = env_paths;
    while (!rest.empty()) {
      size_t colon = rest.find(':');
      std::string_view entry = rest.substr(0, colon);
      if (!entry.empty()) invocation.flags.extra_paths.emplace_back(entry);
      rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    }
  }
  while (i < args.size() && !program_found) {
    const std::string& arg = args[i++];
    if (arg == "--copies") {
      if (i == args.size() || !ParseCopies(args[i], &invocation.copies)) {
        *error = "--copies needs a number from 1 to 256";
        return std::nullopt;
      }
      ++i;
    } else if (arg == "--path") {
      if (i == args.size()) {
        *error = "--path needs a directory";
        return std::nullopt;
      }
      invocation.flags.extra_paths.push_back(args[i++]);
    } else if (arg == "--help") {
      invocation.print_help = true;
      return invocation;
    } else if (arg == "--version") {
      invocation.print_version = true;
      return invocation;
    } else if (arg == "--") {
      if (i < args.size()) {
        invocation.program = {Kind::kFile, args[i++], {}};
      }
      program_found = true;
    } else if (arg == "-") {
      program_found = true;
    } else if (arg.size() > 1 && arg[0] == '-' && arg[1] != '-') {
      for (size_t j = 1; j < arg.size(); ++j) {
        char option = arg[j];
        if (option == 'c' || option == 'm' || option == 'W' || option == 'X') {
          std::string value;
          if (j + 1 < arg.size()) {
            value = arg.substr(j + 1);
          } else if (i < args.size()) {
            value = args[i++];
          } else {
            *error = std::string("Argument expected for the -") + option + " option";
            return std::nullopt;
          }
          if (option == 'c') invocation.program = {Kind::kCode, value, {}};
          if (option == 'm') invocation.program = {Kind::kModule, value, {}};
          if (option == 'W') invocation.flags.warn_options.push_back(value);
          if (option == 'X') invocation.flags.x_options.push_back(value);
          program_found = option == 'c' || option == 'm';
          break;
        }
        switch (option) {
          case 'O':
            ++invocation.flags.optimization_level;
            break;
          case 'u':
            invocation.flags.unbuffered_stdio = true;
            break;
          case 'v':
            ++invocation.flags.verbose;
            break;
          case 'b':
            ++invocation.flags.bytes_warning;
            break;
          case 'V':
            invocation.print_version = true;
            break;
          case 'h':
          case '?':
            invocation.print_help = true;
            return invocation;
          case 'I':
          case 'P':
            safe_path = true;
            break;
          case 'E':
          case 's':
          case 'S':
          case 'B':
          case 'q':
          case 'd':
            break;
          default:
            *error = std::string("unknown option -") + option;
            return std::nullopt;
        }
      }
    } else if (arg.size() > 1 && arg[0] == '-') {
      *error = "unknown option " + arg;
      return std::nullopt;
    } else {
      invocation.program = {Kind::kFile, arg, {}};
      program_found = true;
    }
  }
  invocation.program.argv.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  invocation.program.safe_path = safe_path;
  if (invocation.copies > 1 && invocation.program.kind == Kind::kInteractive && isatty(0)) {
    *error = "--copies needs a program; an interactive prompt runs in one copy";
    return std::nullopt;
  }
  return invocation;
}

int Fail(const Status& status) {
  std::cerr << "orochi python: " << status.ToString() << '\n';
  return 1;
}

int RunInOneCopy(const Invocation& invocation) {
  const interpreters::Program& program = invocation.program;
  interpreters::InterpreterOptions options;
  options.flags = invocation.flags;
  options.install_signal_handlers = true;  // this copy owns the process: Ctrl-C works as usual
  Result<std::unique_ptr<interpreters::Interpreter>> interpreter =
      interpreters::Interpreter::Create(std::move(options));
  if (!interpreter.ok()) return Fail(interpreter.status());
  Result<int> status = (*interpreter)->Run(program);
  // Runs atexit handlers and flushes, like python. Threads still running need no grace: the
  // process is about to end, and they end with it.
  Status unloaded = (*interpreter)->Unload(std::chrono::milliseconds(0));
  if (!status.ok()) return Fail(status.status());
  // Daemon threads still running (kFailedPrecondition) end with the process, as in python.
  if (!unloaded.ok() && unloaded.code() != StatusCode::kFailedPrecondition && *status == 0) {
    return Fail(unloaded);
  }
  return *status;
}

int RunInManyCopies(const Invocation& invocation) {
  const interpreters::Program& program = invocation.program;
  size_t copies = invocation.copies;
  interpreters::ManagerOptions options;
  options.copies = copies;
  options.flags = invocation.flags;
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
  if (invocation->print_help) {
    std::cout << kPythonUsage << '\n';
    return 0;
  }
  if (invocation->print_version) {
    invocation->program = {interpreters::Program::Kind::kCode,
                           "import sys; print('Python', sys.version.split()[0])",
                           {}};
    invocation->copies = 1;
  }
  std::cout.flush();
  if (invocation->copies == 1) return RunInOneCopy(*invocation);
  return RunInManyCopies(*invocation);
}

}  // namespace orochi::cli

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"

namespace {

int Main(int argc, char** argv) {
  // Installed as `orochi-python` (an alias of this binary), Orochi is a python command: it is
  // what copies see as sys.executable, so Python code that starts `sys.executable -c ...` works.
  std::string_view program_name = argv[0];
  program_name = program_name.substr(program_name.rfind('/') + 1);
  if (program_name == "orochi-python") {
    return orochi::cli::RunPythonCommand(std::vector<std::string>(argv + 1, argv + argc));
  }

  CLI::App app{"Orochi: one process serving Python models from many private CPython copies.",
               "orochi"};
  app.set_version_flag("--version", "orochi " OROCHI_VERSION);
  app.require_subcommand(1);

  CLI::App* python = app.add_subcommand("python", "Run Python in a fresh private interpreter copy");
  // Everything after `python` belongs to Python, as with the python command itself.
  python->prefix_command();
  python->footer(orochi::cli::kPythonUsage);

  CLI11_PARSE(app, argc, argv);

  if (python->parsed()) return orochi::cli::RunPythonCommand(python->remaining());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "orochi: %s\n", error.what());
    return 1;
  }
}

#include <CLI/CLI.hpp>

#include "commands.h"

int main(int argc, char** argv) {
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

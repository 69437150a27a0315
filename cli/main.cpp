#include <sys/prctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"

namespace {

// How long oneDNN's OpenMP threads spin for more work after each parallel region, in libgomp's
// spin steps (a `pause` each), before they sleep. libgomp's default, 300,000 steps, lasts
// milliseconds: the engine's own intra-op pool, which runs right after oneDNN's linears in
// attention, then shared the cores with spinning threads, and at 16 threads an encoder layer's
// attention ran 3x slower than at 8. 1,000 steps gave the encoder 3.5x at 16 threads and left
// resnet's back-to-back convolutions as fast; 0 (sleep at once) and 10,000 were slower
// (docs/PERFORMANCE.md).
constexpr const char* kOpenMpSpinSteps = "1000";

// libgomp reads its settings as it loads, before main: where neither GOMP_SPINCOUNT nor
// OMP_WAIT_POLICY is set, this process sets GOMP_SPINCOUNT and starts again as itself (a failed
// exec goes on with libgomp's defaults). Settings from the environment are kept.
void SettleOpenMpSpinning(char** argv) {
  if (std::getenv("GOMP_SPINCOUNT") != nullptr || std::getenv("OMP_WAIT_POLICY") != nullptr) {
    return;
  }
  if (setenv("GOMP_SPINCOUNT", kOpenMpSpinSteps, 1) != 0) return;
  execv("/proc/self/exe", argv);
}

// The kernel names a process after the file it executes, so after the start again through
// /proc/self/exe every orochi process was "exe" to ps, pidof and pkill: the name is set back
// from argv[0], as the first exec set it (at most 15 bytes, the kernel's limit).
void KeepProcessName(const char* argv0) {
  if (argv0 == nullptr) return;  // started with no arguments at all
  std::string_view name = argv0;
  name = name.substr(name.rfind('/') + 1);
  const std::string truncated(name.substr(0, 15));
  if (!truncated.empty()) prctl(PR_SET_NAME, truncated.c_str(), 0, 0, 0);
}

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

  orochi::cli::PackOptions pack_options;
  CLI::App* pack = app.add_subcommand("pack", "Build a model package (.orochi) from a directory");
  pack->add_option("directory", pack_options.directory, "the package directory")->required();
  pack->add_option("-o,--output", pack_options.output, "the .orochi file to write")->required();
  pack->add_option("--set-version", pack_options.set_version,
                   "package as this version, whatever manifest.json says")
      ->check(CLI::PositiveNumber);
  pack->add_flag("--no-compile", pack_options.no_compile,
                 "skip compiling the code in a private copy");

  orochi::cli::InspectOptions inspect_options;
  CLI::App* inspect = app.add_subcommand("inspect", "Validate a package and describe its contents");
  inspect->add_option("package", inspect_options.path, "the .orochi file")->required();
  inspect->add_flag("--json", inspect_options.json, "print the description as JSON");

  orochi::cli::RunOptions run_options;
  CLI::App* run =
      app.add_subcommand("run", "Load a package into private copies and run predict() once");
  run->add_option("package", run_options.path, "the .orochi file")->required();
  CLI::Option* run_inputs =
      run->add_option("-i,--input", run_options.inputs,
                      "NAME=JSON or NAME=@FILE.json: nested lists (strings for BYTES)");
  run->add_option("--request", run_options.request_path,
                  "a whole KServe v2 inference request body (JSON), as sent to the server")
      ->excludes(run_inputs);
  run->add_option("--config", run_options.config, "per-model config, a JSON object");
  run->add_option("--copies", run_options.copies, "interpreter copies to load the model into")
      ->check(CLI::Range(1, 256));
  run->add_option("--site-packages", run_options.site_packages,
                  "a directory of Python packages the model may import (as the server's "
                  "python.site_packages), e.g. /usr/lib/python3/dist-packages; repeatable");

  orochi::cli::ServeOptions serve_options;
  CLI::App* serve = app.add_subcommand("serve", "Serve models over KServe v2 HTTP");
  serve->add_option("--config", serve_options.config_path,
                    "a config file (see config/orochi.json)");
  CLI::Option* model_repository =
      serve->add_option("--model-repository", serve_options.model_repository,
                        "the model repository: DIR/<name>/<version>/model.orochi");
  // KServe's runtimes take --model_dir and --model_name: both spellings are accepted.
  serve
      ->add_option("--model-dir,--model_dir", serve_options.model_dir,
                   "a model directory as KServe mounts one (/mnt/models): a repository or a "
                   "single .orochi package; read, never written")
      ->excludes(model_repository);
  serve->add_option("--model-name,--model_name", serve_options.model_name,
                    "the name a --model-dir's single package is served as (default: its "
                    "manifest's)");
  serve->add_option("--load-model", serve_options.load_models,
                    "a model to load at startup (repeatable; '*' for all, the default)");
  serve->add_option("--http-port", serve_options.http_port, "inference port (default 8000)");
  serve->add_option("--metrics-port", serve_options.metrics_port, "metrics port (default 8002)");
  serve->add_option("--grpc-port", serve_options.grpc_port, "gRPC port (default 8001)");
  serve->add_option("--management-port", serve_options.management_port,
                    "model repository API port (default 8003, on 127.0.0.1)");
  serve->add_option("--bind", serve_options.bind_address, "address to listen on (default 0.0.0.0)");
  serve->add_option("--copies", serve_options.copies, "interpreter copies (default: one per core)")
      ->check(CLI::Range(1, 1024));
  serve
      ->add_option("--model-control-mode", serve_options.model_control_mode,
                   "explicit (the repository API loads and unloads; the default) or poll (serve "
                   "what the repository holds, e.g. one shared by several servers)")
      ->check(CLI::IsMember({"explicit", "poll"}));
  serve
      ->add_option("--repository-poll-secs", serve_options.repository_poll_seconds,
                   "poll mode: seconds between two looks at the repository (default 15)")
      ->check(CLI::Range(0.1, 86400.0));
  serve->add_option("--log-format", serve_options.log_format, "text or json")
      ->check(CLI::IsMember({"text", "json"}));
  serve->add_option("--log-level", serve_options.log_level, "debug, info, warning or error")
      ->check(CLI::IsMember({"debug", "info", "warning", "error"}));

  CLI11_PARSE(app, argc, argv);

  if (python->parsed()) return orochi::cli::RunPythonCommand(python->remaining());
  if (pack->parsed()) return orochi::cli::PackCommand(pack_options);
  if (inspect->parsed()) return orochi::cli::InspectCommand(inspect_options);
  if (run->parsed()) return orochi::cli::RunCommand(run_options);
  if (serve->parsed()) return orochi::cli::ServeCommand(serve_options);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  SettleOpenMpSpinning(argv);
  KeepProcessName(argv[0]);
  try {
    return Main(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "orochi: %s\n", error.what());
    return 1;
  }
}

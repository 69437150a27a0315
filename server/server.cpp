#include "orochi/server/server.h"

#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "auth.h"
#include "exit_guard.h"
#include "grpc/grpc_server.h"
#include "http/compression.h"
#include "http/http_server.h"
#include "http/router.h"
#include "kserve/handlers.h"
#include "kserve/settings.h"
#include "listening_socket.h"
#include "log.h"
#include "memory_guard.h"
#include "metrics/metrics.h"
#include "model_output_log.h"
#include "models/model_service.h"
#include "openai/openai_api.h"
#include "orochi/engine/cpu_math.h"
#include "orochi/engine/device.h"
#include "orochi/engine/ops.h"
#include "orochi/engine/threads.h"
#include "orochi/interpreters/interpreter_manager.h"
#include "peer_process.h"
#include "repository/repository_api.h"

namespace orochi::server {
namespace {

namespace asio = boost::asio;
namespace bhttp = boost::beast::http;

// The repository calls that Triton's clients send to the inference port (see
// http.repository_on_inference_port).
constexpr const char* kRepositoryOnInferencePort[] = {"/v2/repository/index",
                                                      "/v2/repository/models/{model}/load",
                                                      "/v2/repository/models/{model}/unload"};

// How long the shutdown may still take once the grace period is over, for the steps after it
// (stopping workers, finishing a repository operation) before the process exits regardless.
constexpr std::chrono::seconds kShutdownSlack{5};

// A metric label per method: anything but the standard methods is "other", since a label
// value per made-up method would grow the series without bound.
std::string MethodLabel(const http::Request& request) {
  switch (request.method()) {
    case bhttp::verb::get:
    case bhttp::verb::head:
    case bhttp::verb::post:
    case bhttp::verb::put:
    case bhttp::verb::delete_:
    case bhttp::verb::options:
    case bhttp::verb::patch:
    case bhttp::verb::connect:
    case bhttp::verb::trace:
      return std::string(request.method_string());
    default:
      return "other";
  }
}

// Runs the I/O threads' loop. An exception out of a completion handler is a bug (the transport
// answers what it can foresee, and catches what handlers throw), but letting it end the thread
// would end the process for every client: it is logged, costs the one connection whose
// handler it unwound (which closes when its last handler is gone), and the loop goes on.
void RunIo(asio::io_context& io) {
  while (true) {
    try {
      io.run();
      return;
    } catch (const std::exception& error) {
      Log(LogLevel::kError, "an I/O handler threw; its connection is closed",
          {{"error", error.what()}});
    }
  }
}

Status ListenOrAdopt(http::HttpServer& listener, const std::string& address, int port,
                     int inherited_fd) {
  return inherited_fd >= 0 ? listener.Adopt(inherited_fd) : listener.Listen(address, port);
}

}  // namespace

// Runs repository operations (loads take seconds) one at a time off the I/O threads.
class AdminQueue {
 public:
  AdminQueue() : thread_([this] { Run(); }) {}
  ~AdminQueue() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    thread_.join();
  }
  AdminQueue(const AdminQueue&) = delete;
  AdminQueue& operator=(const AdminQueue&) = delete;
  void Post(std::function<void()> work) {
    {
      std::lock_guard lock(mutex_);
      work_.push_back(std::move(work));
    }
    ready_.notify_all();
  }

 private:
  void Run() {
    std::unique_lock lock(mutex_);
    while (true) {
      ready_.wait(lock, [&] { return stopping_ || !work_.empty(); });
      if (work_.empty()) return;
      std::function<void()> next = std::move(work_.front());
      work_.pop_front();
      lock.unlock();
      next();
      lock.lock();
    }
  }
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> work_;
  bool stopping_ = false;
  std::thread thread_;
};

struct Server::Impl {
  explicit Impl(ServerConfig server_config) : config(std::move(server_config)) {}

  ServerConfig config;
  Metrics metrics;
  // Before the manager: copies still print while they are unloaded.
  std::unique_ptr<ModelOutputLog> model_output;
  std::unique_ptr<interpreters::InterpreterManager> manager;
  std::unique_ptr<ModelService> models;
  asio::io_context io;
  // Keeps the I/O threads running while no socket operation is pending, e.g. when every
  // connection waits for a model's answer after the listeners stopped accepting.
  asio::executor_work_guard<asio::io_context::executor_type> keep_running{io.get_executor()};
  http::Router inference_router;
  http::Router management_router;
  http::Router metrics_router;
  std::unique_ptr<repository::RepositoryApi> repository_api;
  std::unique_ptr<http::HttpServer> management;
  std::unique_ptr<AdminQueue> admin;
  // Before the API that uses it; regions still in use by a request outlive it (shared_ptr).
  std::unique_ptr<kserve::SharedMemoryRegistry> shared_memory;
  std::unique_ptr<kserve::KServeApi> api;
  std::unique_ptr<openai::OpenAiApi> openai;
  std::unique_ptr<http::HttpServer> inference;
  std::unique_ptr<http::HttpServer> metrics_listener;
  std::unique_ptr<grpc_api::GrpcServer> grpc;
  std::unique_ptr<asio::signal_set> signals;
  std::vector<std::thread> io_threads;
  std::atomic<bool> ready{false};
  std::mutex stop_mutex;
  std::condition_variable stop_requested;
  int stop_requests = 0;       // signals and RequestStop calls so far
  bool listener_lost = false;  // a listener stopped listening: Run's status says so
  bool skip_delay = false;     // stop without the shutdown delay (SIGINT, or a second request)

  void Stop(bool at_once) {
    {
      std::lock_guard lock(stop_mutex);
      ++stop_requests;
      // A second request means someone is waiting on the shutdown itself: don't make them
      // wait out the delay too.
      if (at_once || stop_requests > 1) skip_delay = true;
    }
    stop_requested.notify_all();
  }

  // Re-armed after each signal: a second one during the shutdown delay ends the delay.
  void AwaitSignal() {
    signals->async_wait([this](const boost::system::error_code& error, int signal) {
      if (error) return;
      Log(LogLevel::kInfo, "signal received; shutting down",
          {{"signal", std::to_string(signal), false}});
      // SIGTERM is what orchestrators send, and they go on routing to the process for a moment
      // (the delay covers that); SIGINT is a person at a terminal, who wants it gone now.
      Stop(signal == SIGINT);
      AwaitSignal();
    });
  }

  // The per-request log line and HTTP metrics, for handlers' answers and the transport's own.
  // `route` is the matched pattern (or "unmatched"), the metric's label.
  void Record(std::string_view route, const char* listener, const http::Request& request,
              const http::Response& response, int64_t micros) {
    const unsigned status = response.result_int();
    metrics.HttpRequest(std::string(route), MethodLabel(request), status);
    if (config.log.requests == "none" || (config.log.requests == "errors" && status < 400)) return;
    Log(status >= 500 ? LogLevel::kWarning : LogLevel::kInfo, "request",
        {{"listener", listener},
         {"method", std::string(request.method_string())},
         {"target", std::string(request.target())},
         {"status", std::to_string(status), false},
         {"duration_us", std::to_string(micros), false},
         {"bytes", std::to_string(response.body().size()), false}});
  }

  // Wraps a router with Record and content coding. The route is resolved once, here: its
  // pattern (which lives as long as the router) goes with the answer to label it. Once for every
  // route of the listener: a compressed request body is decoded before any handler reads it
  // (its decoded size held to http.max_body_bytes), and the answer is compressed when the
  // client accepts it (after Record, which logs the body's own size). A body the transport
  // streamed to a file (`in_file`: an upload) is stored as sent, so it may not be compressed.
  http::Handler Logged(const http::Router& router, const char* listener,
                       const std::function<bool(const http::Request&)>& in_file = nullptr) {
    return [this, &router, listener, in_file](http::Request&& request,
                                              const http::Responder& respond) {
      const auto start = std::chrono::steady_clock::now();
      http::Request header{request.method(), request.target(), request.version()};
      if (request.method() == bhttp::verb::unknown) header.method_string(request.method_string());
      http::Router::Resolved resolved = router.Resolve(request);
      const std::string encoding = http::ChooseResponseEncoding(request);
      http::Responder compressed = respond.Wrap([respond, encoding](http::Response response) {
        http::EncodeResponseBody(response, encoding);
        respond(std::move(response));
      });
      auto record = [this, start, header = std::move(header), route = resolved.pattern(),
                     listener](const http::Response& response) {
        Record(route, listener, header, response,
               std::chrono::duration_cast<std::chrono::microseconds>(
                   std::chrono::steady_clock::now() - start)
                   .count());
      };
      // A streamed answer is recorded when its header goes, and sent as it comes (uncompressed).
      http::Responder logged = compressed.Wrap(
          [record, compressed](http::Response response) {
            record(response);
            compressed(std::move(response));
          },
          record);
      if (in_file && in_file(request)) {
        if (request.count(bhttp::field::content_encoding) != 0) {
          logged(http::ErrorResponse(415,
                                     "an upload is stored as it is sent: send the package "
                                     "without Content-Encoding"));
          return;
        }
      } else if (std::optional<http::Response> refused = http::DecodeRequestBody(
                     request, static_cast<uint64_t>(config.http.max_body_bytes),
                     "http.max_body_bytes")) {
        logged(std::move(*refused));
        return;
      }
      router.Run(resolved, std::move(request), std::move(logged));
    };
  }

  // The transport's own answers (unreadable requests, limits, refused tokens) for Record: no
  // handler resolved these, so the label comes from the header as far as it was read.
  std::function<void(const http::Request&, const http::Response&)> Observer(
      const http::Router& router, const char* listener) {
    return [this, &router, listener](const http::Request& header, const http::Response& response) {
      Record(router.Resolve(header).pattern(), listener, header, response, 0);
    };
  }
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  SetListenerLostHandler(nullptr);
  RequestStop();
  impl_->io.stop();
  for (std::thread& thread : impl_->io_threads) {
    if (thread.joinable()) thread.join();
  }
}

Result<std::unique_ptr<Server>> Server::Start(ServerConfig config, const Inheritance& inherited) {
  OROCHI_RETURN_IF_ERROR(ValidateServerConfig(config));
  if (!config.models.model_dir.empty()) {
    // Its view must outlive every serving process, so it is made once, before them.
    return FailedPrecondition("models.model_dir is resolved by PrepareModelDirectory before start");
  }
  ConfigureLog(config.log.level, config.log.format);
  // The working directory is the process's, and a model's os.chdir() changes it for everyone:
  // a relative repository would then be looked for elsewhere by every later upload, load and
  // state write, and a fresh copy would import from elsewhere.
  std::error_code cwd_error;
  if (!config.models.repository.empty()) {
    config.models.repository = std::filesystem::absolute(config.models.repository, cwd_error);
  }
  for (std::string& directory : config.python.site_packages) {
    if (!cwd_error) directory = std::filesystem::absolute(directory, cwd_error);
  }
  if (cwd_error) {
    return FailedPrecondition("cannot make the configured paths absolute: " + cwd_error.message());
  }
  // A file-size limit must fail the write (507 for an upload), not kill the server.
  std::signal(SIGXFSZ, SIG_IGN);
  auto impl = std::make_unique<Impl>(std::move(config));
  Impl& s = *impl;
  const ServerConfig& cfg = s.config;

  OROCHI_ASSIGN_OR_RETURN(
      std::optional<std::string> management_token,
      LoadToken(cfg.management.token_file, cfg.management.token_env, "management"));
  if (!management_token && !IsLoopback(cfg.management.bind_address)) {
    return FailedPrecondition(
        "the management API would listen on " + cfg.management.bind_address +
        " without a token: uploading a model runs its code, so set management.token_file or "
        "management.token_env, or bind it to 127.0.0.1");
  }
  OROCHI_ASSIGN_OR_RETURN(std::optional<std::string> inference_token,
                          LoadToken(cfg.http.token_file, cfg.http.token_env, "inference"));
  engine::SetIntraOpThreads(cfg.engine.intra_op_threads);
  Log(LogLevel::kInfo, "starting",
      {{"intra_op_threads", std::to_string(engine::IntraOpThreads()), false},
       {"blas_core", std::string(engine::BlasCoreName())},
       {"blas_core_choice", std::string(engine::BlasCoreChoice())}});
  if (int gpus = engine::DeviceCount(engine::DeviceType::kCuda); gpus > 0) {
    Log(LogLevel::kInfo, "CUDA devices found", {{"gpus", std::to_string(gpus), false}});
  } else {
    // Said once, up front: models whose manifest asks for `cuda` will fail to load, CPU
    // models are served as usual.
    Log(LogLevel::kWarning, "no GPU available: CPU models only",
        {{"reason", engine::DeviceTypeStatus(engine::DeviceType::kCuda).message()}});
  }
  interpreters::ManagerOptions manager_options;
  manager_options.copies = cfg.copies > 0 ? static_cast<size_t>(cfg.copies)
                                          : std::max(1U, std::thread::hardware_concurrency());
  manager_options.flags.extra_paths = cfg.python.site_packages;
  s.model_output = std::make_unique<ModelOutputLog>(manager_options.copies);
  manager_options.output = [&s](const interpreters::OutputSource& source,
                                const interpreters::OutputLine& line) {
    s.model_output->Write(source, line);
  };
  OROCHI_ASSIGN_OR_RETURN(s.manager,
                          interpreters::InterpreterManager::Create(std::move(manager_options)));
  s.metrics.Copies("serving", static_cast<int64_t>(s.manager->size()));
  s.metrics.Copies("idle", static_cast<int64_t>(s.manager->size()));
  s.metrics.Copies("busy", 0);
  s.metrics.Copies("abandoned", 0);
  s.metrics.Copies("abandoned_loaded", 0);
  s.metrics.Copies("loading", 0);
  s.metrics.Copies("failed", 0);
  s.metrics.Copies("missing_models", 0);
  s.metrics.Inherit(inherited.restarts, inherited.model_crashes);
  s.metrics.UnknownModel(0);
  s.models = std::make_unique<ModelService>(*s.manager, cfg.models, s.metrics);
  s.models->Quarantine(inherited.quarantined);
  s.models->ReportLoadsTo(inherited.report_fd);
  s.models->NoteRestarts(inherited.restarts);
  OROCHI_RETURN_IF_ERROR(s.models->LoadFromRepository());

  s.shared_memory = std::make_unique<kserve::SharedMemoryRegistry>(cfg.http.allow_shared_memory);
  s.api = std::make_unique<kserve::KServeApi>(*s.models, s.metrics, cfg, *s.shared_memory,
                                              [&s] { return s.ready.load(); });
  s.api->Register(s.inference_router);
  kserve::RegisterSettings(s.inference_router);
  s.openai = std::make_unique<openai::OpenAiApi>(*s.models, s.metrics, cfg);
  s.openai->Register(s.inference_router);
  // Triton's clients send the repository calls to the inference port. Served there only when
  // the operator says so, and then behind the management token: loading and unloading models
  // is the management API's power, whoever may infer.
  const bool repository_here = cfg.http.repository_on_inference_port;
  if (repository_here && !management_token) {
    return FailedPrecondition(
        "http.repository_on_inference_port needs a management token (management.token_file or "
        "management.token_env): the repository calls on the inference port must carry it");
  }
  auto repository_paths = std::make_shared<http::Router>();
  for (const char* pattern : kRepositoryOnInferencePort) {
    repository_paths->Add(bhttp::verb::post, pattern,
                          [](http::Request&&, const http::PathParams&, const http::Responder&) {});
    s.inference_router.Add(
        bhttp::verb::post, pattern,
        [&s, repository_here](http::Request&& request, const http::PathParams&,
                              const http::Responder& respond) {
          if (!repository_here) {
            respond(http::ErrorResponse(
                403, "the model repository API is served on port " +
                         std::to_string(s.management->port()) +
                         " (management), not on the inference port: send " +
                         std::string(request.method_string()) + " " +
                         std::string(request.target()) +
                         " there, or set http.repository_on_inference_port (with a management "
                         "token) to serve index, load and unload here too"));
            return;
          }
          // On the admin queue, as on the management port: a load takes seconds.
          auto shared = std::make_shared<http::Request>(std::move(request));
          s.admin->Post(
              [&s, shared, respond] { s.management_router.Dispatch(std::move(*shared), respond); });
        });
  }
  s.metrics_router.Add(
      bhttp::verb::get, "/metrics",
      [&s](http::Request&&, const http::PathParams&, const http::Responder& respond) {
        http::Response response{bhttp::status::ok, 11};
        response.set(bhttp::field::content_type, "text/plain; version=0.0.4");
        response.body() = s.metrics.Render();
        respond(std::move(response));
      });

  http::Limits limits;
  limits.max_header_bytes = static_cast<size_t>(cfg.http.max_header_bytes);
  limits.max_body_bytes = static_cast<uint64_t>(cfg.http.max_body_bytes);
  limits.idle_timeout = std::chrono::seconds(cfg.http.idle_timeout_s);
  limits.request_timeout = std::chrono::seconds(cfg.http.request_timeout_s);
  limits.upload_timeout = std::chrono::seconds(cfg.management.upload_timeout_s);
  limits.max_connections = static_cast<size_t>(cfg.http.max_connections);
  limits.max_connections_per_client = static_cast<size_t>(cfg.http.max_connections_per_client);
  // One bound for every listener's bodies and every stream's unread answers: 0 is a quarter of
  // what the process may use, models.max_memory_bytes where that is less (else the memory guard
  // refused every inference while a client held the budget's worth of unfinished messages).
  int64_t usable_bytes = MemoryGuard::AvailableBytes();
  if (cfg.models.max_memory_bytes > 0) {
    usable_bytes = std::min(usable_bytes, cfg.models.max_memory_bytes);
  }
  limits.body_budget = std::make_shared<BufferBudget>(
      cfg.http.max_buffered_body_bytes > 0
          ? static_cast<uint64_t>(cfg.http.max_buffered_body_bytes)
          : static_cast<uint64_t>(std::max<int64_t>(usable_bytes / 4, cfg.http.max_body_bytes)));
  s.metrics.WatchBufferBudget(limits.body_budget);
  http::Limits inference_limits = limits;
  inference_limits.observe = s.Observer(s.inference_router, "inference");
  // Model code runs as the server's user and can read its token: who may manage models is told
  // by the process the connection comes from (peer_process.h), then by the token.
  auto model_code_peers = std::make_shared<const ProcessTreePeers>(
      inherited.supervisor != 0 ? inherited.supervisor : ::getpid());
  auto refuse_model_code = [model_code_peers](const std::string& address, uint16_t port,
                                              int server_port) {
    std::optional<std::string> refused =
        model_code_peers->Refusal(address, port, static_cast<uint16_t>(server_port));
    if (refused) {
      Log(LogLevel::kWarning, "management request refused",
          {{"port", std::to_string(server_port), false}, {"reason", *refused}});
    }
    return refused;
  };
  auto screen_management = [refuse_model_code, management_token](
                               const http::Request& header, const asio::ip::tcp::endpoint& client,
                               int server_port) -> std::optional<http::Response> {
    if (std::optional<std::string> refused =
            refuse_model_code(client.address().to_string(), client.port(), server_port)) {
      return http::ErrorResponse(403, "management request refused: " + *refused);
    }
    if (management_token) return CheckToken(*management_token, header);
    return std::nullopt;
  };
  if (inference_token || repository_here) {
    // The repository calls served here need the management token instead of the inference
    // port's (a request carries one Authorization header).
    inference_limits.screen =
        [&s, inference_token, repository_here, repository_paths, screen_management](
            const http::Request& header,
            const asio::ip::tcp::endpoint& client) -> std::optional<http::Response> {
      if (repository_here && repository_paths->Resolve(header).path_matched) {
        return screen_management(header, client, s.inference->port());
      }
      if (inference_token) return CheckToken(*inference_token, header);
      return std::nullopt;
    };
  }
  s.inference = std::make_unique<http::HttpServer>(s.io, inference_limits,
                                                   s.Logged(s.inference_router, "inference"));
  OROCHI_RETURN_IF_ERROR(ListenOrAdopt(*s.inference, cfg.http.bind_address, cfg.http.inference_port,
                                       inherited.inference_fd));
  http::Limits metrics_limits = limits;
  metrics_limits.observe = s.Observer(s.metrics_router, "metrics");
  s.metrics_listener = std::make_unique<http::HttpServer>(s.io, metrics_limits,
                                                          s.Logged(s.metrics_router, "metrics"));
  OROCHI_RETURN_IF_ERROR(ListenOrAdopt(*s.metrics_listener, cfg.http.bind_address,
                                       cfg.http.metrics_port, inherited.metrics_fd));

  // The repository API, when there is a repository: closed to the network unless a token is set.
  s.admin = std::make_unique<AdminQueue>();
  http::Limits management_limits = limits;
  management_limits.observe = s.Observer(s.management_router, "management");
  if (!cfg.models.repository.empty()) {
    s.repository_api = std::make_unique<repository::RepositoryApi>(*s.models);
    s.repository_api->Register(s.management_router);
    management_limits.stream_body_to_file = repository::IsUpload;
    management_limits.upload_directory = s.models->upload_directory();
    management_limits.max_upload_bytes = static_cast<uint64_t>(cfg.management.max_upload_bytes);
  }
  http::Handler logged_management =
      s.Logged(s.management_router, "management", management_limits.stream_body_to_file);
  http::Handler management_handler = [&s, logged_management](http::Request&& request,
                                                             const http::Responder& respond) {
    auto shared = std::make_shared<http::Request>(std::move(request));
    s.admin->Post(
        [logged_management, shared, respond] { logged_management(std::move(*shared), respond); });
  };
  // Checked on the header, before an upload's body is streamed to disk.
  management_limits.screen = [&s, screen_management](const http::Request& header,
                                                     const asio::ip::tcp::endpoint& client) {
    return screen_management(header, client, s.management->port());
  };
  s.management =
      std::make_unique<http::HttpServer>(s.io, management_limits, std::move(management_handler));
  OROCHI_RETURN_IF_ERROR(ListenOrAdopt(*s.management, cfg.management.bind_address,
                                       cfg.management.port, inherited.management_fd));

  if (cfg.grpc.enabled) {
    grpc_api::ServiceOptions grpc_options;
    grpc_options.ready = [&s] { return s.ready.load(); };
    grpc_options.inference_token = inference_token;
    grpc_options.management_token = management_token;
    grpc_options.repository = !cfg.models.repository.empty();
    grpc_options.screen_repository_caller = [&s, refuse_model_code](const std::string& address,
                                                                    uint16_t port) {
      return refuse_model_code(address, port, s.grpc->port());
    };
    grpc_options.shared_memory = s.shared_memory.get();
    grpc_options.answer_budget = limits.body_budget;
    // One at a time with the management API's operations, on the same queue.
    grpc_options.run_repository_operation = [&s](std::function<void()> work) {
      s.admin->Post(std::move(work));
    };
    OROCHI_ASSIGN_OR_RETURN(
        s.grpc, grpc_api::GrpcServer::Start(*s.models, s.metrics, cfg, std::move(grpc_options),
                                            limits.body_budget->max_bytes(), inherited.grpc_fd));
  }

  s.signals = std::make_unique<asio::signal_set>(s.io, SIGINT, SIGTERM);
  auto server = std::unique_ptr<Server>(new Server(std::move(impl)));
  Server* raw = server.get();
  server->impl_->AwaitSignal();
  SetListenerLostHandler([impl = server->impl_.get()] {
    {
      std::lock_guard lock(impl->stop_mutex);
      impl->listener_lost = true;
    }
    impl->Stop(/*at_once=*/true);  // the ports still listening serve what is in flight
  });
  for (int i = 0; i < cfg.http.io_threads; ++i) {
    server->impl_->io_threads.emplace_back([raw] { RunIo(raw->impl_->io); });
  }
  server->impl_->ready = true;
  Log(LogLevel::kInfo, "serving",
      {{"inference",
        "http://" + cfg.http.bind_address + ":" + std::to_string(server->inference_port())},
       {"metrics", "http://" + cfg.http.bind_address + ":" +
                       std::to_string(server->metrics_port()) + "/metrics"},
       {"management", "http://" + cfg.management.bind_address + ":" +
                          std::to_string(server->impl_->management->port())},
       {"grpc", server->impl_->grpc != nullptr
                    ? cfg.grpc.bind_address + ":" + std::to_string(server->impl_->grpc->port())
                    : std::string("off")},
       {"copies", std::to_string(server->impl_->manager->size()), false},
       {"models", std::to_string(server->impl_->models->List().size()), false},
       {"pid", std::to_string(::getpid()), false}});
  return server;
}

int Server::inference_port() const { return impl_->inference->port(); }
int Server::metrics_port() const { return impl_->metrics_listener->port(); }

void Server::RequestStop() { impl_->Stop(false); }

int Server::Run() {
  Impl& s = *impl_;
  {
    std::unique_lock lock(s.stop_mutex);
    s.stop_requested.wait(lock, [&] { return s.stop_requests > 0; });
  }
  s.ready = false;
  // Keep-alive clients (a node's proxy pins a connection to one pod) would otherwise go on
  // sending here on their open connections until the listeners close.
  s.inference->CloseAfterEachAnswer();
  s.management->CloseAfterEachAnswer();
  s.metrics_listener->CloseAfterEachAnswer();
  // Not ready, yet still serving everything: a load balancer (a Kubernetes Service, whose
  // endpoints change only after the pod is told to stop) keeps sending requests for a moment,
  // and would see them refused if the listeners closed now.
  if (s.config.http.shutdown_delay_s > 0) {
    std::unique_lock lock(s.stop_mutex);
    if (!s.skip_delay) {
      Log(LogLevel::kInfo, "not ready; still serving until the shutdown delay ends",
          {{"shutdown_delay_s", std::to_string(s.config.http.shutdown_delay_s), false}});
      s.stop_requested.wait_for(lock, std::chrono::seconds(s.config.http.shutdown_delay_s),
                                [&] { return s.skip_delay; });
    }
  }
  // Graceful shutdown: no new connections, then the requests in flight get their answers.
  s.inference->StopAccepting();
  s.management->StopAccepting();
  s.metrics_listener->StopAccepting();
  const auto grace_end =
      std::chrono::steady_clock::now() + std::chrono::seconds(s.config.http.shutdown_grace_s);
  // gRPC stops taking calls at once and lets those in flight finish within the same grace
  // (on its own thread: Shutdown blocks until they have), then cancels the rest.
  std::thread grpc_shutdown;
  if (s.grpc != nullptr) {
    grpc_shutdown = std::thread([&s, end = std::chrono::system_clock::now() +
                                           std::chrono::seconds(s.config.http.shutdown_grace_s)] {
      s.grpc->Shutdown(end);
    });
  }
  auto in_flight = [&s] {
    return s.inference->in_flight() + (s.grpc != nullptr ? s.grpc->in_flight() : 0);
  };
  // A connection accepted just before the listener closed may not have delivered its request
  // yet: stopping the models now would answer it 503.
  while ((in_flight() > 0 || s.inference->busy_connections() > 0) &&
         std::chrono::steady_clock::now() < grace_end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const int64_t abandoned = in_flight();
  // Whatever still blocks the shutdown past this (a repository operation stuck in a model's
  // constructor, say) must not keep the process alive: an orchestrator waiting for it to go
  // would SIGKILL it anyway, with no word of why.
  const auto hard_end = std::max(grace_end, std::chrono::steady_clock::now()) + kShutdownSlack;
  struct Finished {
    std::mutex mutex;
    std::condition_variable changed;
    bool done = false;
  };
  auto finished = std::make_shared<Finished>();
  std::thread([hard_end, finished] {
    std::unique_lock lock(finished->mutex);
    if (finished->changed.wait_until(lock, hard_end, [&] { return finished->done; })) return;
    Log(LogLevel::kError, "shutdown did not finish within the grace period; exiting now",
        {{"exit_code", "1", false}});
    ExitServingProcess(1);
  }).detach();
  auto finish = [&finished] {
    {
      std::lock_guard lock(finished->mutex);
      finished->done = true;
    }
    finished->changed.notify_all();
  };
  // The grace is spent: a copy still running now is in code that nothing interrupts (no
  // deadline), and would hold the process forever. Idle workers get a moment to leave.
  const size_t stuck = s.models->Stop(
      std::max(grace_end, std::chrono::steady_clock::now() + std::chrono::milliseconds(500)));
  s.admin.reset();  // finishes the repository operation under way
  // Cancelled calls were answered when their requests were (by Stop above, at the latest).
  if (grpc_shutdown.joinable()) grpc_shutdown.join();
  if (stuck > 0) {
    // The stuck requests were just answered: let their answers go out before the sockets do.
    const auto flushed = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (s.inference->in_flight() > 0 && std::chrono::steady_clock::now() < flushed) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  s.io.stop();
  for (std::thread& thread : s.io_threads) thread.join();
  s.io_threads.clear();
  Log(abandoned > 0 ? LogLevel::kWarning : LogLevel::kInfo, "stopped",
      {{"unanswered_requests", std::to_string(abandoned), false},
       {"stuck_copies", std::to_string(stuck), false}});
  if (stuck > 0) {
    // Unloading a copy that a thread still executes in would crash or hang: leave without
    // running any destructor. Exit 1, as Triton does when its shutdown times out.
    Log(LogLevel::kError, "exiting without unloading: interpreter copies are still running",
        {{"stuck_copies", std::to_string(stuck), false}, {"exit_code", "1", false}});
    ExitServingProcess(1);
  }
  finish();
  std::lock_guard lock(s.stop_mutex);
  return s.listener_lost ? kListenerLostExitStatus : 0;
}

}  // namespace orochi::server

#include "metrics.h"

#include <prometheus/text_serializer.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "orochi/base/process_memory.h"
#include "orochi/engine/device.h"

namespace orochi::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

double Seconds(std::chrono::nanoseconds duration) {
  return std::chrono::duration<double>(duration).count();
}

const Histogram::BucketBoundaries& LatencyBuckets() {
  static const Histogram::BucketBoundaries buckets{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                   0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                                   1,      2.5,     5,      10,    30,     60};
  return buckets;
}

const Histogram::BucketBoundaries& BatchBuckets() {
  static const Histogram::BucketBoundaries buckets{1, 2, 4, 8, 16, 32, 64, 128, 256};
  return buckets;
}

}  // namespace

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_(BuildCounter()
                    .Name("orochi_inference_requests_total")
                    .Help("Inference requests answered, by model, version and reason "
                          "(success or the kind of error)")
                    .Register(*registry_)),
      request_seconds_(BuildHistogram()
                           .Name("orochi_request_duration_seconds")
                           .Help("Time from receiving an inference request to its answer")
                           .Register(*registry_)),
      queue_seconds_(BuildHistogram()
                         .Name("orochi_queue_duration_seconds")
                         .Help("Time inference requests waited in their model's queue")
                         .Register(*registry_)),
      compute_seconds_(BuildHistogram()
                           .Name("orochi_compute_duration_seconds")
                           .Help("Time the batch holding a request ran in its interpreter copy")
                           .Register(*registry_)),
      batch_size_(BuildHistogram()
                      .Name("orochi_batch_size")
                      .Help("Rows per executed batch")
                      .Register(*registry_)),
      queue_depth_(BuildGauge()
                       .Name("orochi_queue_depth")
                       .Help("Requests waiting in each model's queue")
                       .Register(*registry_)),
      first_response_seconds_(BuildHistogram()
                                  .Name("orochi_time_to_first_response_seconds")
                                  .Help("Streams: time from receiving the request to its first "
                                        "response (time to first token)")
                                  .Register(*registry_)),
      between_responses_seconds_(BuildHistogram()
                                     .Name("orochi_time_between_responses_seconds")
                                     .Help("Streams: time between two responses of one stream "
                                           "(time per output token)")
                                     .Register(*registry_)),
      stream_responses_(BuildCounter()
                            .Name("orochi_stream_responses_total")
                            .Help("Streams: responses (tokens) generated")
                            .Register(*registry_)),
      live_streams_(BuildGauge()
                        .Name("orochi_live_streams")
                        .Help("Streams: sequences live in interpreter copies now")
                        .Register(*registry_)),
      streams_ended_(BuildCounter()
                         .Name("orochi_streams_total")
                         .Help("Streams ended, by how: finished, cancelled (the client went), "
                               "deadline, unloaded, stalled (the client read nothing), error")
                         .Register(*registry_)),
      live_sequences_(BuildGauge()
                          .Name("orochi_live_sequences")
                          .Help("Stateful models: sequences whose state an interpreter copy "
                                "holds now")
                          .Register(*registry_)),
      sequences_ended_(
          BuildCounter()
              .Name("orochi_sequences_ended_total")
              .Help("Stateful models: sequences ended, by reason: end "
                    "(sequence_end), restarted (sequence_start on a live id), "
                    "expired (idle timeout), lost (copy replaced), unloaded, never_started "
                    "(its sequence_start was cancelled or timed out before it ran)")
              .Register(*registry_)),
      copies_(BuildGauge()
                  .Name("orochi_interpreter_copies")
                  .Help("Interpreter copies by state")
                  .Register(*registry_)),
      queue_capacity_(BuildGauge()
                          .Name("orochi_queue_capacity")
                          .Help("Requests each model's queue holds at most (models.max_queue_size)")
                          .Register(*registry_)),
      copy_busy_seconds_(BuildCounter()
                             .Name("orochi_copy_busy_seconds_total")
                             .Help("Time each interpreter copy spent running batches")
                             .Register(*registry_)),
      copies_replaced_(BuildCounter()
                           .Name("orochi_copies_replaced_total")
                           .Help("Interpreter copies replaced after ignoring an interrupt")
                           .Register(*registry_)
                           .Add({})),
      model_loads_(BuildCounter()
                       .Name("orochi_model_loads_total")
                       .Help("Model loads by model, version and result")
                       .Register(*registry_)),
      model_load_seconds_(BuildHistogram()
                              .Name("orochi_model_load_duration_seconds")
                              .Help("Time to load a model into its interpreter copies")
                              .Register(*registry_)),
      model_load_failed_(BuildGauge()
                             .Name("orochi_model_load_failed")
                             .Help("1 while the last load of a model version failed (a state, "
                                   "for alerts that must not depend on seeing a counter at 0)")
                             .Register(*registry_)),
      http_requests_(BuildCounter()
                         .Name("orochi_http_requests_total")
                         .Help("HTTP requests by route, method and status code")
                         .Register(*registry_)),
      grpc_requests_(BuildCounter()
                         .Name("orochi_grpc_requests_total")
                         .Help("gRPC calls by method and status code; each request of a "
                               "ModelStreamInfer stream counts once")
                         .Register(*registry_)),
      server_restarts_(BuildCounter()
                           .Name("orochi_server_restarts_total")
                           .Help("Serving processes the supervisor restarted after one died")
                           .Register(*registry_)
                           .Add({})),
      model_crashes_(BuildCounter()
                         .Name("orochi_model_crashes_total")
                         .Help("Serving processes ended by a native crash in a model's code, by "
                               "model")
                         .Register(*registry_)),
      cpu_seconds_(BuildCounter()
                       .Name("process_cpu_seconds_total")
                       .Help("User and system CPU time of the server process")
                       .Register(*registry_)
                       .Add({})),
      resident_bytes_(BuildGauge()
                          .Name("process_resident_memory_bytes")
                          .Help("Resident memory of the server process")
                          .Register(*registry_)
                          .Add({})),
      buffered_bytes_(BuildGauge()
                          .Name("orochi_buffered_bytes")
                          .Help("Bytes of request bodies and unread stream answers held in "
                                "memory now (http.max_buffered_body_bytes bounds them)")
                          .Register(*registry_)
                          .Add({})),
      buffered_bytes_limit_(BuildGauge()
                                .Name("orochi_buffered_bytes_limit")
                                .Help("The bound on orochi_buffered_bytes: "
                                      "http.max_buffered_body_bytes, or the default it has when 0")
                                .Register(*registry_)
                                .Add({})),
      open_fds_(BuildGauge()
                    .Name("process_open_fds")
                    .Help("Open file descriptors of the server process")
                    .Register(*registry_)
                    .Add({})),
      start_time_(BuildGauge()
                      .Name("process_start_time_seconds")
                      .Help("Start time of the server process since the Unix epoch")
                      .Register(*registry_)
                      .Add({})),
      gpu_count_(
          BuildGauge()
              .Name("orochi_gpus")
              .Help("CUDA devices the engine can use (0 without a GPU, driver or CUDA build)")
              .Register(*registry_)
              .Add({})),
      gpu_memory_used_(BuildGauge()
                           .Name("orochi_gpu_memory_used_bytes")
                           .Help("GPU memory held by live tensors, per device")
                           .Register(*registry_)),
      gpu_memory_cached_(BuildGauge()
                             .Name("orochi_gpu_memory_cached_bytes")
                             .Help("Freed GPU memory kept by the engine's allocator for reuse")
                             .Register(*registry_)),
      gpu_memory_total_(BuildGauge()
                            .Name("orochi_gpu_memory_total_bytes")
                            .Help("Memory of each GPU")
                            .Register(*registry_)),
      gpu_utilization_(BuildGauge()
                           .Name("orochi_gpu_utilization_ratio")
                           .Help("Fraction of the driver's last sample period each GPU was busy")
                           .Register(*registry_)) {
  start_time_.Set(
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
}

void Metrics::RequestDone(const std::string& model, const std::string& version,
                          const std::string& reason, std::chrono::nanoseconds total,
                          std::chrono::nanoseconds queue, std::chrono::nanoseconds compute) {
  requests_.Add({{"model", model}, {"version", version}, {"reason", reason}}).Increment();
  const prometheus::Labels labels{{"model", model}, {"version", version}};
  request_seconds_.Add(labels, LatencyBuckets()).Observe(Seconds(total));
  queue_seconds_.Add(labels, LatencyBuckets()).Observe(Seconds(queue));
  if (compute.count() > 0) compute_seconds_.Add(labels, LatencyBuckets()).Observe(Seconds(compute));
}

void Metrics::BatchRan(const std::string& model, const std::string& version, int64_t rows) {
  batch_size_.Add({{"model", model}, {"version", version}}, BatchBuckets())
      .Observe(static_cast<double>(rows));
}

void Metrics::QueueDepth(const std::string& model, const std::string& version, int64_t depth) {
  queue_depth_.Add({{"model", model}, {"version", version}}).Set(static_cast<double>(depth));
}

void Metrics::CopyBusy(size_t slot, std::chrono::nanoseconds busy) {
  copy_busy_seconds_.Add({{"copy", std::to_string(slot)}}).Increment(Seconds(busy));
}

void Metrics::Copies(const std::string& state, int64_t count) {
  copies_.Add({{"state", state}}).Set(static_cast<double>(count));
}

void Metrics::ModelLoaded(const std::string& model, const std::string& version, bool ok,
                          std::chrono::nanoseconds duration) {
  model_loads_.Add({{"model", model}, {"version", version}, {"result", ok ? "success" : "failure"}})
      .Increment();
  model_load_failed_.Add({{"model", model}, {"version", version}}).Set(ok ? 0 : 1);
  model_load_seconds_.Add({{"model", model}, {"version", version}}, LatencyBuckets())
      .Observe(Seconds(duration));
}

namespace {

// Every `reason` of orochi_inference_requests_total (docs/METRICS.md).
constexpr const char* kRequestReasons[] = {
    "success", "invalid_argument", "too_large",   "queue_full",  "out_of_memory",
    "timeout", "model_error",      "client_gone", "unavailable", "internal"};

// Every `end` of orochi_streams_total (docs/METRICS.md).
constexpr const char* kStreamEnds[] = {"finished", "cancelled", "deadline",
                                       "unloaded", "stalled",   "error"};

// Every `reason` of orochi_sequences_ended_total (scheduler's SequenceEndName).
constexpr const char* kSequenceEndReasons[] = {"end",  "restarted", "expired",
                                               "lost", "unloaded",  "never_started"};

}  // namespace

// The table of a version's series, by kind: what ModelKnown, StreamsKnown and SequencesKnown
// add (at 0) is exactly what ModelGone and LoadRefused remove, so the two cannot drift apart.
// `visit(family, labels, buckets...)` is called once per series; histograms get their buckets.
template <typename Visit>
void Metrics::ForEachSeries(SeriesKind kind, const std::string& model, const std::string& version,
                            Visit visit) {
  const prometheus::Labels labels{{"model", model}, {"version", version}};
  const auto labelled = [&](const char* name, const char* value) {
    return prometheus::Labels{{"model", model}, {"version", version}, {name, value}};
  };
  switch (kind) {
    case SeriesKind::kRequests:
      for (const char* reason : kRequestReasons) visit(requests_, labelled("reason", reason));
      visit(request_seconds_, labels, LatencyBuckets());
      visit(queue_seconds_, labels, LatencyBuckets());
      visit(compute_seconds_, labels, LatencyBuckets());
      visit(batch_size_, labels, BatchBuckets());
      visit(queue_depth_, labels);
      visit(queue_capacity_, labels);
      return;
    case SeriesKind::kStreams:
      visit(first_response_seconds_, labels, LatencyBuckets());
      visit(between_responses_seconds_, labels, LatencyBuckets());
      visit(stream_responses_, labels);
      visit(live_streams_, labels);
      for (const char* end : kStreamEnds) visit(streams_ended_, labelled("end", end));
      return;
    case SeriesKind::kSequences:
      visit(live_sequences_, labels);
      for (const char* reason : kSequenceEndReasons) {
        visit(sequences_ended_, labelled("reason", reason));
      }
      return;
    case SeriesKind::kLoads:
      for (const char* result : {"success", "failure"}) {
        visit(model_loads_, labelled("result", result));
      }
      visit(model_load_seconds_, labels, LatencyBuckets());
      return;
  }
}

void Metrics::AddSeries(SeriesKind kind, const std::string& model, const std::string& version) {
  ForEachSeries(kind, model, version,
                [](auto& family, const prometheus::Labels& labels, const auto&... buckets) {
                  family.Add(labels, buckets...);
                });
}

void Metrics::RemoveSeries(SeriesKind kind, const std::string& model, const std::string& version) {
  ForEachSeries(kind, model, version,
                [](auto& family, const prometheus::Labels& labels, const auto&... buckets) {
                  family.Remove(&family.Add(labels, buckets...));
                });
}

void Metrics::ModelKnown(const std::string& model, const std::string& version,
                         int64_t max_queue_size) {
  AddSeries(SeriesKind::kRequests, model, version);
  queue_capacity_.Add({{"model", model}, {"version", version}})
      .Set(static_cast<double>(max_queue_size));
  AddSeries(SeriesKind::kLoads, model, version);
  model_crashes_.Add({{"model", model}});  // per model, kept across its versions
}

void Metrics::StreamsKnown(const std::string& model, const std::string& version) {
  AddSeries(SeriesKind::kStreams, model, version);
}

void Metrics::SequencesKnown(const std::string& model, const std::string& version) {
  AddSeries(SeriesKind::kSequences, model, version);
}

void Metrics::ModelGone(const std::string& model, const std::string& version) {
  RemoveRequestSeries(model, version);
  RemoveLoadSeries(model, version);
}

void Metrics::LoadRefused(const std::string& model, const std::string& version) {
  RemoveRequestSeries(model, version);
}

void Metrics::LoadRefusalGone(const std::string& model, const std::string& version) {
  RemoveLoadSeries(model, version);
}

void Metrics::CopyReplaced() { copies_replaced_.Increment(); }

void Metrics::RemoveRequestSeries(const std::string& model, const std::string& version) {
  for (SeriesKind kind : {SeriesKind::kRequests, SeriesKind::kStreams, SeriesKind::kSequences}) {
    RemoveSeries(kind, model, version);
  }
}

void Metrics::RemoveLoadSeries(const std::string& model, const std::string& version) {
  RemoveSeries(SeriesKind::kLoads, model, version);
  // Made by ModelLoaded once a load ends, not ahead (a 0 before then would say it had not failed).
  model_load_failed_.Remove(&model_load_failed_.Add({{"model", model}, {"version", version}}));
}

void Metrics::StreamResponse(const std::string& model, const std::string& version, bool first,
                             std::chrono::nanoseconds since) {
  const prometheus::Labels labels{{"model", model}, {"version", version}};
  (first ? first_response_seconds_ : between_responses_seconds_)
      .Add(labels, LatencyBuckets())
      .Observe(Seconds(since));
  stream_responses_.Add(labels).Increment();
}

void Metrics::LiveStreams(const std::string& model, const std::string& version, int64_t live) {
  live_streams_.Add({{"model", model}, {"version", version}}).Set(static_cast<double>(live));
}

void Metrics::StreamEnded(const std::string& model, const std::string& version,
                          const std::string& end) {
  streams_ended_.Add({{"model", model}, {"version", version}, {"end", end}}).Increment();
}

void Metrics::LiveSequences(const std::string& model, const std::string& version, int64_t live) {
  live_sequences_.Add({{"model", model}, {"version", version}}).Set(static_cast<double>(live));
}

void Metrics::SequenceEnded(const std::string& model, const std::string& version,
                            const std::string& reason) {
  sequences_ended_.Add({{"model", model}, {"version", version}, {"reason", reason}}).Increment();
}

void Metrics::UnknownModel(int count) {
  requests_.Add({{"model", ""}, {"version", ""}, {"reason", "unknown_model"}})
      .Increment(static_cast<double>(count));
}

void Metrics::Inherit(int64_t restarts, const std::map<std::string, int64_t>& model_crashes) {
  server_restarts_.Increment(static_cast<double>(restarts));
  for (const auto& [model, crashes] : model_crashes) {
    model_crashes_.Add({{"model", model}}).Increment(static_cast<double>(crashes));
  }
}

void Metrics::HttpRequest(const std::string& route, const std::string& method, unsigned status) {
  http_requests_.Add({{"route", route}, {"method", method}, {"status", std::to_string(status)}})
      .Increment();
}

void Metrics::WatchBufferBudget(std::shared_ptr<const BufferBudget> budget) {
  std::lock_guard lock(render_mutex_);
  buffer_budget_ = std::move(budget);
}

void Metrics::GrpcRequest(const std::string& method, const std::string& code) {
  grpc_requests_.Add({{"method", method}, {"code", code}}).Increment();
}

std::string Metrics::Render() {
  std::lock_guard lock(render_mutex_);
  // Process figures from /proc, read at scrape time.
  std::ifstream stat("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  size_t after_name = text.rfind(')');
  if (after_name != std::string::npos) {
    std::istringstream fields(text.substr(after_name + 2));
    std::string field;
    double user_ticks = 0;
    double system_ticks = 0;
    for (int index = 3; fields >> field; ++index) {
      if (index == 14) user_ticks = std::stod(field);
      if (index == 15) {
        system_ticks = std::stod(field);
        break;
      }
    }
    // A counter only grows: add what was used since the last scrape.
    const double used = (user_ticks + system_ticks) / static_cast<double>(sysconf(_SC_CLK_TCK));
    if (used > cpu_seconds_reported_) {
      cpu_seconds_.Increment(used - cpu_seconds_reported_);
      cpu_seconds_reported_ = used;
    }
  }
  if (const int64_t resident = ResidentBytes(); resident >= 0) {
    resident_bytes_.Set(static_cast<double>(resident));
  }
  if (buffer_budget_) {
    buffered_bytes_.Set(static_cast<double>(buffer_budget_->used()));
    buffered_bytes_limit_.Set(static_cast<double>(buffer_budget_->max_bytes()));
  }
  std::error_code error;
  double fds = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    ++fds;
  }
  open_fds_.Set(fds);
  // Reading the allocator's figures never creates a CUDA context (device.h).
  const int gpus = engine::DeviceCount(engine::DeviceType::kCuda);
  gpu_count_.Set(gpus);
  for (int index = 0; index < gpus; ++index) {
    const engine::Device device{engine::DeviceType::kCuda, index};
    const std::map<std::string, std::string> labels{{"device", engine::DeviceName(device)}};
    const engine::DeviceMemoryStats stats = engine::MemoryStats(device);
    gpu_memory_used_.Add(labels).Set(static_cast<double>(stats.allocated_bytes));
    gpu_memory_cached_.Add(labels).Set(static_cast<double>(stats.cached_bytes));
    gpu_memory_total_.Add(labels).Set(static_cast<double>(stats.total_bytes));
    if (std::optional<double> busy = engine::DeviceUtilisation(device)) {
      gpu_utilization_.Add(labels).Set(*busy / 100);
    }
  }
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace orochi::server

// Prometheus metrics of the server (docs/METRICS.md lists every name). prometheus-cpp's core
// holds the values; Render() writes the text format for GET /metrics.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "buffer_budget.h"

namespace orochi::server {

class Metrics {
 public:
  Metrics();

  // One inference request answered: reason is "success" or the error's kind.
  void RequestDone(const std::string& model, const std::string& version, const std::string& reason,
                   std::chrono::nanoseconds total, std::chrono::nanoseconds queue,
                   std::chrono::nanoseconds compute);
  void BatchRan(const std::string& model, const std::string& version, int64_t rows);
  void QueueDepth(const std::string& model, const std::string& version, int64_t depth);
  // Streams (streaming models): a response sent to a stream, `since` its request arrived (the
  // first) or its previous response; streams live in copies now; a stream that ended, and how.
  void StreamResponse(const std::string& model, const std::string& version, bool first,
                      std::chrono::nanoseconds since);
  void LiveStreams(const std::string& model, const std::string& version, int64_t live);
  void StreamEnded(const std::string& model, const std::string& version, const std::string& end);
  // Stateful models: sequences live now, and one that ended (`reason`: end, restarted,
  // expired, lost, unloaded).
  void LiveSequences(const std::string& model, const std::string& version, int64_t live);
  void SequenceEnded(const std::string& model, const std::string& version,
                     const std::string& reason);
  void CopyBusy(size_t slot, std::chrono::nanoseconds busy);
  void Copies(const std::string& state, int64_t count);
  void ModelLoaded(const std::string& model, const std::string& version, bool ok,
                   std::chrono::nanoseconds duration);
  // A version becomes known (its load starts): every series of it that a rule or panel reads
  // exists from now on, at 0, so that increase() sees its first failure.
  // `max_queue_size` is the most requests its queue holds (orochi_queue_capacity), so that an
  // alert compares the depth with the configured size, not a fixed number.
  void ModelKnown(const std::string& model, const std::string& version, int64_t max_queue_size);
  // The same for what only some models have, once the manifest says so: a streaming model's
  // stream series, every `end` at 0, and a stateful model's sequence series, every `reason`
  // at 0 (the dashboard's rates read 0 before the first stream, not nothing).
  void StreamsKnown(const std::string& model, const std::string& version);
  void SequencesKnown(const std::string& model, const std::string& version);
  // An upload that did not load and was not kept: the series of its requests go at once (it
  // never served); its load series stay, so that the failure alert fires, until the model's
  // next load that succeeds or its deletion (LoadRefusalGone).
  void LoadRefused(const std::string& model, const std::string& version);
  void LoadRefusalGone(const std::string& model, const std::string& version);
  // A stuck copy was replaced: a counter (at 0 from the start), so that increase() sees each
  // replacement across restarts of the serving process.
  void CopyReplaced();
  // A version is unloaded or deleted: its series go, so that they neither linger as stale
  // values nor grow without bound over deploys.
  void ModelGone(const std::string& model, const std::string& version);
  // An inference request for a model that is not loaded: one series, whatever the name asked
  // for (a label per made-up name would grow without bound).
  void UnknownModel(int count = 1);
  void HttpRequest(const std::string& route, const std::string& method, unsigned status);
  // One gRPC call finished: `method` is the RPC's name, `code` its gRPC status name ("OK").
  void GrpcRequest(const std::string& method, const std::string& code);
  // What the supervisor says happened before this process started.
  void Inherit(int64_t restarts, const std::map<std::string, int64_t>& model_crashes);
  // Reports `budget`'s use and bound at each scrape (orochi_buffered_bytes,
  // orochi_buffered_bytes_limit). Call before the metrics are served.
  void WatchBufferBudget(std::shared_ptr<const BufferBudget> budget);

  // The Prometheus text exposition, with process CPU, memory and FDs, and each GPU's memory and
  // utilisation, read now.
  std::string Render();

 private:
  // The kinds of a version's series: every model's requests and loads, a streaming model's
  // streams, a stateful model's sequences.
  enum class SeriesKind { kRequests, kStreams, kSequences, kLoads };
  template <typename Visit>
  void ForEachSeries(SeriesKind kind, const std::string& model, const std::string& version,
                     Visit visit);
  void AddSeries(SeriesKind kind, const std::string& model, const std::string& version);
  void RemoveSeries(SeriesKind kind, const std::string& model, const std::string& version);
  // Requests, streams and sequences: a version that never served or serves no more.
  void RemoveRequestSeries(const std::string& model, const std::string& version);
  void RemoveLoadSeries(const std::string& model, const std::string& version);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_seconds_;
  prometheus::Family<prometheus::Histogram>& queue_seconds_;
  prometheus::Family<prometheus::Histogram>& compute_seconds_;
  prometheus::Family<prometheus::Histogram>& batch_size_;
  prometheus::Family<prometheus::Gauge>& queue_depth_;
  prometheus::Family<prometheus::Histogram>& first_response_seconds_;
  prometheus::Family<prometheus::Histogram>& between_responses_seconds_;
  prometheus::Family<prometheus::Counter>& stream_responses_;
  prometheus::Family<prometheus::Gauge>& live_streams_;
  prometheus::Family<prometheus::Counter>& streams_ended_;
  prometheus::Family<prometheus::Gauge>& live_sequences_;
  prometheus::Family<prometheus::Counter>& sequences_ended_;
  prometheus::Family<prometheus::Gauge>& copies_;
  prometheus::Family<prometheus::Gauge>& queue_capacity_;
  prometheus::Family<prometheus::Counter>& copy_busy_seconds_;
  prometheus::Counter& copies_replaced_;
  prometheus::Family<prometheus::Counter>& model_loads_;
  prometheus::Family<prometheus::Histogram>& model_load_seconds_;
  prometheus::Family<prometheus::Gauge>& model_load_failed_;
  prometheus::Family<prometheus::Counter>& http_requests_;
  prometheus::Family<prometheus::Counter>& grpc_requests_;
  prometheus::Counter& server_restarts_;
  prometheus::Family<prometheus::Counter>& model_crashes_;
  prometheus::Counter& cpu_seconds_;
  double cpu_seconds_reported_ = 0;  // guarded by render_mutex_
  std::mutex render_mutex_;
  prometheus::Gauge& resident_bytes_;
  prometheus::Gauge& buffered_bytes_;
  prometheus::Gauge& buffered_bytes_limit_;
  std::shared_ptr<const BufferBudget> buffer_budget_;  // see WatchBufferBudget
  prometheus::Gauge& open_fds_;
  prometheus::Gauge& start_time_;
  prometheus::Gauge& gpu_count_;
  prometheus::Family<prometheus::Gauge>& gpu_memory_used_;
  prometheus::Family<prometheus::Gauge>& gpu_memory_cached_;
  prometheus::Family<prometheus::Gauge>& gpu_memory_total_;
  prometheus::Family<prometheus::Gauge>& gpu_utilization_;
};

}  // namespace orochi::server

// The models a server serves: loading packages from the repository into interpreter copies,
// finding them by name and version, queueing inference through the scheduler, and keeping
// Triton-style statistics. The files themselves are repository::RepositoryStore's.
//
// Thread-safety: every method may be called from any thread. In poll mode
// (models.model_control_mode "poll") a thread of its own applies what other servers sharing the
// repository changed; it serialises with the repository API like any of its calls.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "metrics/metrics.h"
#include "orochi/interpreters/interpreter_manager.h"
#include "orochi/interpreters/model.h"
#include "orochi/packaging/package.h"
#include "orochi/server/config.h"
#include "repository/repository_store.h"
#include "scheduler/scheduler.h"

namespace orochi::server {

struct DurationStat {
  int64_t count = 0;
  int64_t ns = 0;
  void Add(std::chrono::nanoseconds duration) {
    ++count;
    ns += duration.count();
  }
};

// Triton's compute statistics of batches run (see BatchTimings): one of each per batch.
struct ComputeStats {
  DurationStat compute_input;
  DurationStat compute_infer;
  DurationStat compute_output;
  void Add(const BatchTimings& timings) {
    compute_input.Add(timings.input);
    compute_infer.Add(timings.infer);
    compute_output.Add(timings.output);
  }
};

struct ModelStats {
  DurationStat success;
  DurationStat fail;
  DurationStat queue;
  ComputeStats compute;                     // every batch
  int64_t inference_count = 0;              // rows (or requests, for models that do not batch)
  int64_t execution_count = 0;              // batches run
  int64_t last_inference_ms = 0;            // since the Unix epoch
  std::map<int64_t, ComputeStats> batches;  // by batch size
};

struct ServedModel {
  std::string name;
  int64_t version = 0;
  std::string key;  // packaging::ModelKey{name, version}.ToString()
  std::shared_ptr<const packaging::Package> package;
  std::shared_ptr<interpreters::ReplicatedModel> replicas;
  BatchingOptions batching;
  // The package file it was loaded from, as it was then: poll mode reloads a version whose
  // file was replaced.
  std::optional<repository::FileIdentity> file;
  const packaging::Manifest& manifest() const { return package->manifest(); }

  mutable std::mutex stats_mutex;
  mutable ModelStats stats;  // guarded by stats_mutex
};

// Settings a `load` request's config override (Triton's model configuration subset) changes
// for the versions it loads; absent: the manifest's and the server config's. See
// repository/load_request.h for how they are read.
struct LoadOverrides {
  // Not a setting: the manifest fixes it (the inputs' shapes depend on it). The load is refused
  // when a selected version's manifest says otherwise.
  std::optional<int64_t> max_batch_size;
  std::optional<std::chrono::microseconds> max_queue_delay;
  std::optional<std::vector<int64_t>> preferred_batch_sizes;
  std::optional<int64_t> instances;  // copies to load into, in place of the manifest's
  bool empty() const {
    return !max_batch_size && !max_queue_delay && !preferred_batch_sizes && !instances;
  }
};

class ModelService : public SchedulerObserver {
 public:
  ModelService(interpreters::InterpreterManager& manager, const ModelsConfig& config,
               Metrics& metrics);
  ~ModelService() override;

  // Startup: removes what a server killed mid-way left in the repository (RepositoryStore::Open),
  // then loads the models named in config.load, or, when it is empty or "*", every model of the
  // repository that was loaded when the server last stopped (the repository's state file
  // remembers models unloaded through the API). Stops at the first failure, naming the model.
  // In poll mode: loads what the repository holds as every poll does (a version that does not
  // load is reported in the index, not fatal), then starts polling.
  Status LoadFromRepository();
  // Model versions ("name:version" -> why) that LoadFromRepository leaves unloaded, reporting
  // the reason in the index: they crashed the process too often (see supervisor.h). Call before
  // LoadFromRepository; explicit loads and deploys are not affected.
  void Quarantine(std::map<std::string, std::string> quarantined);
  // Tells the refusal of a request for an unknown sequence that this serving process replaced
  // one that died (`restarts` so far): the sequences it held went with it. Before
  // LoadFromRepository: after a restart, a model that does not load is left UNAVAILABLE with
  // its reason instead of failing the start, as at a first start (see LoadFromRepository).
  void NoteRestarts(int64_t restarts);
  // Where LoadFromRepository tells the supervisor of each load it begins ("loading": a death
  // with no crash record is put on it) and of each that ran past the load timeout
  // ("stuck_load"); see Inheritance::report_fd. -1: nowhere.
  void ReportLoadsTo(int fd) { report_fd_ = fd; }

  // Whether `name` can name a model: what a manifest allows (1-128 letters, digits, '_', '.',
  // '-', starting with a letter or digit), so it is always one path component inside the
  // repository. kInvalidArgument naming the problem otherwise.
  static Status CheckModelName(const std::string& name);

  // The repository API. Each serialises with the others, and each refuses a name that
  // CheckModelName refuses before touching the repository. Each that unloads a version waits
  // up to models.unload_grace_s for its running requests, then interrupts them and abandons
  // the copies that ignore it; on success, each returns what its answer must add (that copies
  // were abandoned), or an empty string.
  // In poll mode, LoadModel and UnloadModel are refused (kFailedPrecondition): the repository
  // decides what every server sharing it serves.
  // Loads the versions of `name` its version policy selects, then drains and unloads the
  // loaded versions it no longer selects: new requests move to the new version before the
  // old one goes, and none is lost.
  // With `overrides`, the versions it loads get those settings; a selected version already
  // loaded with other settings is refused (kAlreadyExists: unload it first), as is an override
  // that does not fit the version (kInvalidArgument).
  Result<std::string> LoadModel(const std::string& name, const LoadOverrides& overrides = {});
  // Drains and unloads every loaded version of `name`, and remembers that it is unloaded.
  // kNotFound when the model is neither loaded nor in the repository.
  Result<std::string> UnloadModel(const std::string& name);
  // Publishes an uploaded package (a file in upload_directory()) into the repository as
  // <name>/<version>/model.orochi after validating it, then serves it unless `load` is false.
  // When the version policy selects it, it is loaded into copies before it is published, and
  // published only if it loads: a package that does not load never reaches the repository,
  // where servers sharing it would load it too. The file is not Deploy's: it takes it away
  // only when it publishes it, and otherwise leaves it for its owner (the transport that
  // created it) to remove.
  // Errors: kInvalidArgument (not a valid package, or its manifest names another model or
  // version, or `load` false in poll mode), kAlreadyExists (the version is deployed, by this
  // server or, meanwhile, by another sharing the repository), the load's error.
  Result<std::string> Deploy(const std::string& name, int64_t version,
                             const std::string& uploaded_file, bool load);
  // Unloads and removes one version, or (no version) the whole model, from the repository.
  // Deleting a loaded version of a model that is served re-applies its version policy to the
  // versions left, so that `latest` falls back to the next newest one.
  Result<std::string> Delete(const std::string& name, std::optional<int64_t> version);

  struct IndexEntry {
    std::string name;
    int64_t version = 0;
    std::string state;  // READY or UNAVAILABLE
    std::string reason;
  };
  // Every version in the repository with its state, as Triton's repository index lists them.
  // A version that does not load is UNAVAILABLE with the load's error as its reason.
  Result<std::vector<IndexEntry>> Index() const;
  std::string upload_directory() const;

  // The model and version (newest when `version` is empty), or null.
  std::shared_ptr<const ServedModel> Find(const std::string& name,
                                          std::optional<int64_t> version) const;
  std::vector<std::shared_ptr<const ServedModel>> List() const;
  // Versions of `name` that are loaded, newest first.
  // Why versions of `name` are not served although in the repository (a failed load, a
  // quarantine), each reason naming its version, joined by "; "; empty when none failed.
  std::string LoadFailures(const std::string& name) const;
  std::vector<int64_t> Versions(const std::string& name) const;

  using Done =
      std::function<void(Result<std::vector<interpreters::NamedTensor>>, const InferTimings&)>;
  // Queues inference; refusals come back as the Status (and `done` is not called), with
  // `inputs` handed back untouched, so that the caller may submit them to another version
  // (the one that replaced `model` meanwhile, say). Accepted, `inputs` are taken. A stateful
  // model's request names its `sequence`.
  Status Submit(const std::shared_ptr<const ServedModel>& model,
                std::vector<interpreters::NamedTensor>& inputs,
                const interpreters::RequestParameters& parameters, int64_t rows,
                std::optional<Clock::time_point> deadline, std::function<bool()> abandoned,
                Done done, std::shared_ptr<ResponseStream> stream = nullptr,
                const std::optional<interpreters::SequenceCall>& sequence = std::nullopt);

  // Stops polling, answers queued requests, stops the workers; see Scheduler::Stop for
  // `deadline` and what it returns.
  size_t Stop(std::optional<Clock::time_point> deadline = std::nullopt);
  size_t copies() const { return manager_.size(); }

  // SchedulerObserver
  void OnBatch(const std::string& model_key, int64_t rows, int64_t requests,
               const BatchTimings& timings, bool ok) override;
  void OnQueueDepth(const std::string& model_key, int64_t depth) override;
  void OnCopyBusy(size_t slot, std::chrono::nanoseconds busy) override;
  void OnCopyReplaced(size_t slot) override;
  void OnCopiesRecovering(int64_t without_copy, int64_t missing_models) override;
  void OnCopyRunning(size_t slot, bool running) override;
  void OnAbandonedCopies(int64_t running) override;
  void OnModelUnavailable(const std::string& model_key, const std::string& reason) override;
  void OnStreamResponse(const std::string& model_key, bool first,
                        std::chrono::nanoseconds since) override;
  void OnLiveStreams(const std::string& model_key, int64_t live) override;
  void OnStreamEnded(const std::string& model_key, StreamEnd end) override;
  void OnLiveSequences(const std::string& model_key, int64_t live) override;
  void OnSequenceEnded(const std::string& model_key, SequenceEnd end) override;

  // kUnavailable saying why a loaded version takes no requests (see Scheduler), else OK.
  Status Availability(const std::string& model_key) const;

 private:
  std::shared_ptr<ServedModel> FindByKey(const std::string& key) const;
  std::vector<size_t> SlotsFor(const packaging::Manifest& manifest,
                               std::optional<int64_t> instances);
  // Loads one package file into copies as a version that does not serve yet, recording a
  // failure for the index.
  Result<std::shared_ptr<ServedModel>> LoadCopies(const std::string& path,
                                                  const std::string& expected_name,
                                                  int64_t expected_version,
                                                  const LoadOverrides& overrides = {});
  // Makes a version LoadCopies loaded serve.
  void Serve(const std::shared_ptr<ServedModel>& served);
  // Unloads a version LoadCopies loaded that never served.
  void Discard(const std::shared_ptr<ServedModel>& staged);
  // Loads one version of the repository and serves it.
  Status LoadVersion(const std::string& name, int64_t version, const LoadOverrides& overrides = {});
  // Whether `overrides` fit `manifest` (and this server); kInvalidArgument naming what not.
  Status CheckOverrides(const packaging::Manifest& manifest, const LoadOverrides& overrides) const;
  // OK when a loaded version has the settings `overrides` asks for, else kAlreadyExists naming
  // the setting it has instead.
  static Status CheckLoadedMatches(const ServedModel& model, const LoadOverrides& overrides);
  Result<std::string> UnloadVersion(const std::string& name, int64_t version);
  // Whether `name` has a selected version that is quarantined: if so it is left unloaded, its
  // reason recorded and logged, and the start goes on without it.
  bool SkipQuarantined(const std::string& name);
  // A quarantined version an operator loaded explicitly, and that loaded: no longer
  // quarantined here, nor by the supervisor's next serving processes ("lifted" on the pipe).
  void LiftQuarantine(const std::string& name, int64_t version);
  // How a version loads into `slots`: under models.load_timeout_s, a part of them at a time.
  interpreters::LoadOptions LoadOptionsFor(const std::vector<size_t>& slots);
  // The idle-copies gauge: neither running a batch nor out of service for a load.
  void ReportIdle();
  // Removes the load series of `name`'s refused uploads, but for `keeping` (being loaded again).
  void ForgetRefusedUploads(const std::string& name, std::optional<int64_t> keeping);
  // LoadModel, admin_mutex_ held.
  Result<std::string> LoadModelLocked(const std::string& name, const LoadOverrides& overrides = {});
  // The versions of `name` its policy selects among `candidates` (ascending).
  std::vector<int64_t> SelectVersions(const std::string& name,
                                      const std::vector<int64_t>& candidates) const;
  Result<std::vector<int64_t>> SelectedVersions(const std::string& name) const;
  Status SaveState();

  bool polling() const { return config_.model_control_mode == "poll"; }
  // Poll mode: makes what `name` serves what the repository holds, as every server sharing it
  // does: loads the versions its policy selects among those that load, then drains and unloads
  // the loaded versions it no longer selects (removed, or replaced by a newer one). A version
  // that fails to load is reported in the index and not tried again until its file changes,
  // and the policy chooses among the others: every server comes to the same choice. admin_mutex_
  // held.
  Result<std::string> Reconcile(const std::string& name);
  // Whether name:version failed to load from the file the repository holds now (or is
  // quarantined). admin_mutex_ held.
  bool KnownBroken(const std::string& name, int64_t version);
  // Reconcile for every model in the repository or loaded.
  void PollRepository();
  void PollLoop();

  repository::RepositoryStore store_;
  std::mutex admin_mutex_;          // serialises loads, unloads, deploys and polls
  std::set<std::string> unloaded_;  // models unloaded through the API; persisted
  // Poll mode: versions that failed to load ("name:version"), with the file they failed from.
  std::map<std::string, repository::FileIdentity> broken_files_;  // admin_mutex_
  std::thread poller_;
  std::mutex poll_mutex_;
  std::condition_variable poll_wake_;
  bool poll_stopping_ = false;  // poll_mutex_
  interpreters::InterpreterManager& manager_;
  const ModelsConfig& config_;
  Metrics& metrics_;
  Scheduler scheduler_;
  mutable std::mutex mutex_;
  // Served versions by name (what Find offers), and every loaded version by key, including
  // one that is draining before it unloads (what the scheduler reports on).
  std::map<std::string, std::map<int64_t, std::shared_ptr<ServedModel>>> models_;
  // Why the last load of "name:version" failed, for the repository index; cleared on success.
  std::map<std::string, std::string> load_failures_;
  // Tells the supervisor `what` ("loading", "stuck_load") of `name`'s selected versions, from
  // the first thread (SendReport).
  void ReportToSupervisor(const char* what, const std::string& name);
  std::map<std::string, std::string> quarantined_;  // see Quarantine
  bool restarted_ = false;                          // see NoteRestarts
  int report_fd_ = -1;                              // see ReportLoadsTo
  std::atomic<int64_t> loading_copies_{0};          // copies out of service for a load
  std::map<std::string, std::shared_ptr<ServedModel>, std::less<>> by_key_;
  size_t next_slot_ = 0;
  // Versions of an upload refused because it did not load, by name: their load series stay
  // for the alert until the name's next load or delete (ForgetRefusedUploads).
  std::map<std::string, std::set<int64_t>> refused_uploads_;
  std::atomic<int64_t> busy_copies_{0};
};

}  // namespace orochi::server

#include "model_service.h"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string_view>
#include <utility>

#include "exit_guard.h"
#include "log.h"
#include "orochi/engine/device.h"
#include "orochi/packaging/model_key.h"
#include "orochi/server/model_source.h"

namespace orochi::server {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Which(const std::string& name, int64_t version) {
  return "model '" + name + "' version " + std::to_string(version);
}

std::string Joined(const std::string& first, const std::string& second) {
  return first.empty() || second.empty() ? first + second : first + "; " + second;
}

}  // namespace

ModelService::ModelService(interpreters::InterpreterManager& manager, const ModelsConfig& config,
                           Metrics& metrics)
    : store_(config.repository),
      manager_(manager),
      config_(config),
      metrics_(metrics),
      scheduler_(manager, static_cast<size_t>(config.max_queue_size),
                 std::chrono::milliseconds(config.execution_grace_ms),
                 static_cast<size_t>(config.max_abandoned_copies), this) {
  scheduler_.SetStreamLimits({static_cast<size_t>(config.max_queued_streams),
                              std::chrono::milliseconds(config.stream_stall_timeout_ms)});
}

ModelService::~ModelService() { Stop(); }

size_t ModelService::Stop(std::optional<Clock::time_point> deadline) {
  {
    std::lock_guard lock(poll_mutex_);
    poll_stopping_ = true;
  }
  poll_wake_.notify_all();
  if (poller_.joinable()) poller_.join();
  return scheduler_.Stop(deadline);
}

std::vector<size_t> ModelService::SlotsFor(const packaging::Manifest& manifest,
                                           std::optional<int64_t> instances) {
  const size_t copies = manager_.size();
  if (!instances) instances = manifest.instances;
  size_t wanted = instances ? static_cast<size_t>(*instances) : copies;
  wanted = std::min(wanted, copies);
  // Models with fewer instances than copies start at rotating copies, to spread the load.
  std::vector<size_t> slots;
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < wanted; ++i) slots.push_back((next_slot_ + i) % copies);
  if (wanted < copies) next_slot_ = (next_slot_ + wanted) % copies;
  std::sort(slots.begin(), slots.end());
  return slots;
}

namespace {

constexpr std::string_view kDeviceMissing = "the manifest places the model on '";

// kUnavailable saying why `device` (a manifest's, already validated, in the package at `path`)
// cannot be used here, else OK. A GPU model is refused up front, before any copy runs its code:
// nothing falls back to the CPU.
Status DeviceAvailability(const std::string& path, const std::string& device) {
  engine::Device wanted;
  if (!engine::ParseDevice(device, &wanted)) return Status::Ok();
  const Status usable = engine::DeviceStatus(wanted);
  if (usable.ok()) return Status::Ok();
  return Unavailable(path + ": " + std::string(kDeviceMissing) + device + "', but " +
                     engine::DeviceName(wanted) + " is not available: " + usable.message());
}

bool IsMissingDevice(const Status& status) {
  return status.code() == StatusCode::kUnavailable &&
         status.message().find(kDeviceMissing) != std::string::npos;
}

}  // namespace

interpreters::LoadOptions ModelService::LoadOptionsFor(const std::vector<size_t>& slots) {
  interpreters::LoadOptions options;
  options.timeout = std::chrono::seconds(config_.load_timeout_s);
  options.interrupt_grace = std::chrono::milliseconds(config_.execution_grace_ms);
  // Half the model's copies at a time, each out of service while the entry class's __init__
  // runs in it: the other half goes on serving every model (a load into all copies at once
  // stalled every model for as long as __init__ took). Two waves cost twice __init__'s time.
  options.max_parallel = std::max<size_t>(1, slots.size() / 2);
  // Counted while out of service, so that the metrics do not call a loading copy idle.
  options.pause = [this](size_t slot) {
    scheduler_.PauseSlot(slot);
    metrics_.Copies("loading", ++loading_copies_);
    ReportIdle();
  };
  options.resume = [this](size_t slot) {
    metrics_.Copies("loading", --loading_copies_);
    ReportIdle();
    scheduler_.ResumeSlot(slot);
  };
  // A copy stuck in C code in __init__ past the timeout and the grace is replaced, as one stuck
  // in predict is: held by its loading thread, it would serve nothing ever again, and every
  // later load or unload that needs its slot would wait for it forever.
  options.abandon = [this](size_t slot) {
    metrics_.Copies("loading", --loading_copies_);
    ReportIdle();
    scheduler_.ReplaceStuckLoad(slot);
  };
  options.abandoned_returned = [this](size_t /*slot*/) { scheduler_.StuckLoadReturned(); };
  return options;
}

Status ModelService::CheckOverrides(const packaging::Manifest& manifest,
                                    const LoadOverrides& overrides) const {
  const std::string which =
      "model '" + manifest.name + "' version " + std::to_string(manifest.version);
  if (overrides.max_batch_size && *overrides.max_batch_size != manifest.max_batch_size) {
    return InvalidArgument("config: max_batch_size " + std::to_string(*overrides.max_batch_size) +
                           " cannot be applied: " + which + " has max_batch_size " +
                           std::to_string(manifest.max_batch_size) +
                           " in its manifest, which its inputs' shapes depend on (repack it to "
                           "change it)");
  }
  if ((overrides.max_queue_delay || overrides.preferred_batch_sizes) &&
      manifest.max_batch_size == 0) {
    return InvalidArgument("config: dynamic_batching cannot be applied: " + which +
                           " does not batch (max_batch_size 0 in its manifest)");
  }
  if (overrides.preferred_batch_sizes) {
    for (int64_t size : *overrides.preferred_batch_sizes) {
      if (size > manifest.max_batch_size) {
        return InvalidArgument("config: dynamic_batching.preferred_batch_size " +
                               std::to_string(size) + " is larger than the max_batch_size " +
                               std::to_string(manifest.max_batch_size) + " of " + which);
      }
    }
  }
  if (overrides.instances && static_cast<size_t>(*overrides.instances) > manager_.size()) {
    return InvalidArgument("config: instance_group count " + std::to_string(*overrides.instances) +
                           " is more than the server's " + std::to_string(manager_.size()) +
                           " interpreter copies (--copies)");
  }
  return Status::Ok();
}

Status ModelService::CheckLoadedMatches(const ServedModel& model, const LoadOverrides& overrides) {
  std::string mismatch;
  if (overrides.max_queue_delay && *overrides.max_queue_delay != model.batching.max_queue_delay) {
    mismatch =
        "max_queue_delay_microseconds " + std::to_string(model.batching.max_queue_delay.count());
  } else if (overrides.preferred_batch_sizes &&
             *overrides.preferred_batch_sizes != model.batching.preferred_batch_sizes) {
    mismatch = "other preferred batch sizes";
  } else if (overrides.instances &&
             static_cast<size_t>(*overrides.instances) != model.replicas->slots().size()) {
    mismatch = "instance_group count " + std::to_string(model.replicas->slots().size());
  } else {
    return Status::Ok();
  }
  return AlreadyExists("model '" + model.name + "' version " + std::to_string(model.version) +
                       " is already loaded, with " + mismatch +
                       "; unload it first to load it with this config");
}

Result<std::shared_ptr<ServedModel>> ModelService::LoadCopies(const std::string& path,
                                                              const std::string& expected_name,
                                                              int64_t expected_version,
                                                              const LoadOverrides& overrides) {
  const Clock::time_point start = Clock::now();
  const std::string version_text = std::to_string(expected_version);
  const std::string key = packaging::ModelKey{expected_name, expected_version}.ToString();
  ForgetRefusedUploads(expected_name, expected_version);
  metrics_.ModelKnown(expected_name, version_text, config_.max_queue_size);
  auto fail = [&](const Status& status) {
    metrics_.ModelLoaded(expected_name, version_text, false, Clock::now() - start);
    std::lock_guard lock(mutex_);
    load_failures_[key] = status.message();
    return status;
  };
  Result<std::unique_ptr<packaging::Package>> opened = packaging::Package::Open(path);
  if (!opened.ok()) return fail(opened.status());
  std::shared_ptr<const packaging::Package> package = std::move(opened).value();
  const packaging::Manifest& manifest = package->manifest();
  if (manifest.name != expected_name || manifest.version != expected_version) {
    return fail(InvalidArgument(path + ": the manifest says " + manifest.name + " version " +
                                std::to_string(manifest.version) +
                                ", but the repository holds it as " + expected_name + " version " +
                                version_text));
  }
  if (Status device = DeviceAvailability(path, manifest.device); !device.ok()) return fail(device);
  if (manifest.streaming) metrics_.StreamsKnown(expected_name, version_text);
  if (manifest.sequence) metrics_.SequencesKnown(expected_name, version_text);
  // A refused override is the request's mistake, not the version's: nothing recorded for the
  // index, nothing loaded.
  OROCHI_RETURN_IF_ERROR(CheckOverrides(manifest, overrides));
  const std::vector<size_t> slots = SlotsFor(manifest, overrides.instances);
  Result<std::unique_ptr<interpreters::ReplicatedModel>> replicas =
      interpreters::ReplicatedModel::Load(manager_, ModelSourceFrom(package), slots,
                                          LoadOptionsFor(slots));
  if (!replicas.ok()) return fail(replicas.status());

  {
    std::lock_guard lock(mutex_);
    load_failures_.erase(key);
  }
  auto served = std::make_shared<ServedModel>();
  served->name = manifest.name;
  served->version = manifest.version;
  served->key = key;
  served->package = package;
  served->replicas = std::move(replicas).value();
  served->batching.max_batch_size = manifest.max_batch_size;
  served->batching.streaming = manifest.streaming;
  served->batching.max_live_sequences = manifest.max_live_sequences;
  if (manifest.sequence) {
    served->batching.sequences = SequenceOptions{
        std::chrono::milliseconds(
            manifest.sequence->idle_timeout_ms.value_or(config_.sequence_idle_timeout_ms)),
        manifest.sequence->max_sequences_per_copy.value_or(config_.max_sequences_per_copy)};
  }
  served->batching.max_queue_delay =
      overrides.max_queue_delay.value_or(std::chrono::microseconds(config_.max_queue_delay_us));
  served->batching.preferred_batch_sizes =
      overrides.preferred_batch_sizes.value_or(config_.preferred_batch_sizes);
  metrics_.ModelLoaded(served->name, version_text, true, Clock::now() - start);
  return served;
}

void ModelService::Serve(const std::shared_ptr<ServedModel>& served) {
  scheduler_.AddModel(served->replicas, served->batching);
  {
    std::lock_guard lock(mutex_);
    models_[served->name][served->version] = served;
    by_key_[served->key] = served;
  }
  Log(LogLevel::kInfo, "model loaded",
      {{"model", served->name},
       {"version", std::to_string(served->version), false},
       {"copies", std::to_string(served->replicas->slots().size()), false}});
}

void ModelService::Discard(const std::shared_ptr<ServedModel>& staged) {
  Status unloaded = staged->replicas->Unload();
  metrics_.ModelGone(staged->name, std::to_string(staged->version));
  if (!unloaded.ok()) {
    Log(LogLevel::kWarning, "unloading a version that never served failed",
        {{"model", staged->key}, {"error", unloaded.message()}});
  }
}

Status ModelService::LoadVersion(const std::string& name, int64_t version,
                                 const LoadOverrides& overrides) {
  // Taken before the file is read: if it is replaced meanwhile, the next poll sees a file other
  // than the one loaded and loads it.
  std::optional<repository::FileIdentity> file = store_.Identify(name, version);
  OROCHI_ASSIGN_OR_RETURN(std::shared_ptr<ServedModel> served,
                          LoadCopies(store_.PackagePath(name, version), name, version, overrides));
  served->file = file;
  Serve(served);
  return Status::Ok();
}

std::string ModelService::upload_directory() const { return store_.upload_directory(); }

std::vector<int64_t> ModelService::SelectVersions(const std::string& name,
                                                  const std::vector<int64_t>& candidates) const {
  auto policy = config_.version_policies.find(name);
  if (policy == config_.version_policies.end() || policy->second.kind == "latest") {
    return candidates.empty() ? candidates : std::vector<int64_t>{candidates.back()};
  }
  if (policy->second.kind == "all") return candidates;
  std::vector<int64_t> selected;
  for (int64_t version : policy->second.versions) {
    if (std::binary_search(candidates.begin(), candidates.end(), version)) {
      selected.push_back(version);
    }
  }
  return selected;
}

Result<std::vector<int64_t>> ModelService::SelectedVersions(const std::string& name) const {
  OROCHI_ASSIGN_OR_RETURN(std::vector<int64_t> on_disk, store_.Versions(name));
  return SelectVersions(name, on_disk);
}

Status ModelService::SaveState() { return store_.WriteUnloaded(unloaded_); }

Status ModelService::LoadFromRepository() {
  if (config_.repository.empty()) return Status::Ok();
  // An upload cut short (client gone, server killed) left at most a file: never a package.
  OROCHI_RETURN_IF_ERROR(store_.Open());
  if (polling()) {
    // What the repository holds, as every poll applies it: the state file's unloaded models
    // are not read (an unload is refused in this mode), and a version that does not load is
    // reported, as the servers already running report it.
    PollRepository();
    poller_ = std::thread([this] { PollLoop(); });
    return Status::Ok();
  }
  unloaded_ = store_.ReadUnloaded();

  OROCHI_ASSIGN_OR_RETURN(std::vector<std::string> names, store_.Models());
  const bool all = config_.load.empty() ||
                   std::find(config_.load.begin(), config_.load.end(), "*") != config_.load.end();
  if (all) {
    std::erase_if(names, [&](const std::string& name) { return unloaded_.count(name) != 0; });
  } else {
    for (const std::string& wanted : config_.load) {
      if (std::find(names.begin(), names.end(), wanted) == names.end()) {
        return NotFound("model '" + wanted + "' is not in the repository " + config_.repository);
      }
    }
    names = config_.load;
  }
  for (const std::string& name : names) {
    Result<std::vector<int64_t>> selected = SelectedVersions(name);
    Status loaded = selected.status();
    if (loaded.ok() && selected->empty()) {
      std::string message = "model '" + name + "' has no version in the repository (expected ";
      message += store_.root() + "/" + name + "/<version>/model.orochi)";
      loaded = NotFound(message);
    }
    if (loaded.ok() && SkipQuarantined(name)) continue;
    if (loaded.ok()) {
      ReportToSupervisor("loading", name);
      loaded = LoadModel(name).status();
    }
    // Startup is strict (a first start that fails says why and ends), except: a GPU model on a
    // machine without the GPU, or a model whose load ran past models.load_timeout_s, waits
    // UNAVAILABLE with its reason while the other models are served (a start that waited
    // forever for one model would serve none); and after a restart nothing fails it: a package
    // that model code damaged (or one that fails since) must not keep every other model down
    // through restart after restart.
    if (IsMissingDevice(loaded) || loaded.code() == StatusCode::kDeadlineExceeded ||
        (restarted_ && !loaded.ok())) {
      Log(LogLevel::kWarning, "model not loaded", {{"model", name}, {"reason", loaded.message()}});
      if (loaded.code() == StatusCode::kDeadlineExceeded) ReportToSupervisor("stuck_load", name);
      continue;
    }
    OROCHI_RETURN_IF_ERROR(loaded);
  }
  return Status::Ok();
}

void ModelService::Quarantine(std::map<std::string, std::string> quarantined) {
  std::lock_guard lock(mutex_);
  quarantined_ = std::move(quarantined);
}

void ModelService::ReportToSupervisor(const char* what, const std::string& name) {
  if (report_fd_ < 0) return;
  const Result<std::vector<int64_t>> selected = SelectedVersions(name);
  if (!selected.ok()) return;
  for (int64_t version : *selected) {
    const std::string line =
        std::string(what) + " model=" + packaging::ModelKey{name, version}.ToString() + "\n";
    SendReport(report_fd_, line);
  }
}

void ModelService::LiftQuarantine(const std::string& name, int64_t version) {
  const std::string key = packaging::ModelKey{name, version}.ToString();
  {
    std::lock_guard lock(mutex_);
    if (quarantined_.erase(key) == 0) return;
  }
  Log(LogLevel::kInfo, "quarantine lifted: loaded explicitly", {{"model", key}});
  if (report_fd_ < 0) return;
  const std::string line = "lifted model=" + key + "\n";
  [[maybe_unused]] const ssize_t written = ::write(report_fd_, line.data(), line.size());
}

bool ModelService::SkipQuarantined(const std::string& name) {
  bool skipped = false;
  const Result<std::vector<int64_t>> selected = SelectedVersions(name);
  if (!selected.ok()) return false;  // the load that follows fails with the reason
  for (int64_t version : *selected) {
    const std::string key = packaging::ModelKey{name, version}.ToString();
    std::lock_guard lock(mutex_);
    auto found = quarantined_.find(key);
    if (found == quarantined_.end()) continue;
    load_failures_[key] = found->second;
    Log(LogLevel::kWarning, "model not loaded",
        {{"model", name}, {"version", std::to_string(version), false}, {"reason", found->second}});
    skipped = true;
  }
  return skipped;
}

Status ModelService::CheckModelName(const std::string& name) {
  if (packaging::IsName(name)) return Status::Ok();
  return InvalidArgument("'" + name +
                         "' is not a valid model name (1-128 letters, digits, '_', '.', '-', "
                         "starting with a letter or digit)");
}

namespace {

Status RefusedWhilePolling(const std::string& what) {
  return FailedPrecondition(
      "cannot " + what +
      " with models.model_control_mode \"poll\": the server serves what the "
      "repository holds, as every server sharing it does (an explicit load or "
      "unload would make them differ); deploy or delete a version instead");
}

}  // namespace

Result<std::string> ModelService::LoadModel(const std::string& name,
                                            const LoadOverrides& overrides) {
  OROCHI_RETURN_IF_ERROR(CheckModelName(name));
  if (polling()) return RefusedWhilePolling("load a model");
  std::lock_guard admin(admin_mutex_);
  return LoadModelLocked(name, overrides);
}

Result<std::string> ModelService::LoadModelLocked(const std::string& name,
                                                  const LoadOverrides& overrides) {
  OROCHI_ASSIGN_OR_RETURN(std::vector<int64_t> selected, SelectedVersions(name));
  if (selected.empty()) {
    return NotFound("model '" + name +
                    "' has no version in the repository that its policy selects");
  }
  std::vector<int64_t> loaded = Versions(name);
  if (!overrides.empty()) {
    // Checked before anything loads: a version that serves goes on serving as it is. Reloading
    // it in place with other settings would need its copies twice over; unloading it first is
    // the caller's explicit choice.
    for (int64_t version : selected) {
      std::shared_ptr<const ServedModel> served = Find(name, version);
      if (served == nullptr) continue;
      OROCHI_RETURN_IF_ERROR(CheckOverrides(served->manifest(), overrides));
      OROCHI_RETURN_IF_ERROR(CheckLoadedMatches(*served, overrides));
    }
  }
  for (int64_t version : selected) {
    if (std::find(loaded.begin(), loaded.end(), version) == loaded.end()) {
      OROCHI_RETURN_IF_ERROR(LoadVersion(name, version, overrides));
      LiftQuarantine(name, version);
    }
  }
  // The new versions serve now; the old ones finish what they hold and go.
  std::string notice;
  for (int64_t version : loaded) {
    if (std::find(selected.begin(), selected.end(), version) == selected.end()) {
      OROCHI_ASSIGN_OR_RETURN(std::string unloaded, UnloadVersion(name, version));
      notice = Joined(notice, unloaded);
    }
  }
  if (unloaded_.erase(name) != 0) OROCHI_RETURN_IF_ERROR(SaveState());
  return notice;
}

Result<std::string> ModelService::UnloadVersion(const std::string& name, int64_t version) {
  std::shared_ptr<ServedModel> model;
  {
    std::lock_guard lock(mutex_);
    auto versions = models_.find(name);
    if (versions == models_.end() || versions->second.count(version) == 0) return std::string();
    model = versions->second.at(version);
    // Find() no longer offers it; requests already queued for it are still answered.
    versions->second.erase(version);
    if (versions->second.empty()) models_.erase(versions);
  }
  const size_t abandoned =
      scheduler_.RemoveModel(model->key, std::chrono::seconds(config_.unload_grace_s));
  {
    std::lock_guard lock(mutex_);
    by_key_.erase(model->key);  // only now: the drained batches still count in its statistics
  }
  Status unloaded = model->replicas->Unload();
  metrics_.ModelGone(name, std::to_string(version));
  Log(abandoned > 0 ? LogLevel::kWarning : LogLevel::kInfo, "model unloaded",
      {{"model", name},
       {"version", std::to_string(version), false},
       {"abandoned_copies", std::to_string(abandoned), false}});
  OROCHI_RETURN_IF_ERROR(unloaded);
  if (abandoned == 0) return std::string();
  return "model '" + name + "' version " + std::to_string(version) + " was unloaded, but " +
         std::to_string(abandoned) +
         " interpreter copy(ies) still running its code after models.unload_grace_s (" +
         std::to_string(config_.unload_grace_s) +
         " s) ignored the interrupt and were abandoned (each replaced by a fresh copy; its "
         "thread stays behind)";
}

Result<std::string> ModelService::UnloadModel(const std::string& name) {
  OROCHI_RETURN_IF_ERROR(CheckModelName(name));
  if (polling()) return RefusedWhilePolling("unload a model");
  std::lock_guard admin(admin_mutex_);
  // Remembering an unknown name would keep a model of that name from loading at startup once
  // it is deployed, with no trace of why.
  if (Versions(name).empty() && !store_.HasModel(name)) {
    return NotFound("model '" + name + "' is not in the repository");
  }
  // Remembered on disk first: if it cannot be (a full disk), nothing changes, rather than an
  // unload that holds until the next restart brings the model back.
  const bool newly_unloaded = unloaded_.insert(name).second;
  if (Status saved = SaveState(); !saved.ok()) {
    if (newly_unloaded) unloaded_.erase(name);
    return Status(saved.code(), "the model stays loaded: " + saved.message());
  }
  std::string notice;
  for (int64_t version : Versions(name)) {
    OROCHI_ASSIGN_OR_RETURN(std::string unloaded, UnloadVersion(name, version));
    notice = Joined(notice, unloaded);
  }
  return notice;
}

Result<std::string> ModelService::Deploy(const std::string& name, int64_t version,
                                         const std::string& uploaded_file, bool load) {
  OROCHI_RETURN_IF_ERROR(CheckModelName(name));
  if (polling() && !load) {
    return InvalidArgument(
        "load=false cannot be honoured with models.model_control_mode \"poll\": every server "
        "sharing the repository serves what it holds; deploy without it");
  }
  std::lock_guard admin(admin_mutex_);
  if (store_.HasVersion(name, version)) {
    return AlreadyExists(Which(name, version) +
                         " is already deployed; delete it first or deploy a new version");
  }
  std::string notice;
  if (Find(name, version) != nullptr) {
    // Loaded, but its package left the repository (deleted through another server sharing it,
    // before this one's next poll): the new package takes its place.
    OROCHI_ASSIGN_OR_RETURN(notice, UnloadVersion(name, version));
  }
  {
    Result<std::unique_ptr<packaging::Package>> package = packaging::Package::Open(uploaded_file);
    if (!package.ok()) {
      std::string message = package.status().message();
      if (message.starts_with(uploaded_file)) {
        message = "the package" + message.substr(uploaded_file.size());
      }
      return Status(package.status().code() == StatusCode::kNotFound ? StatusCode::kInternal
                                                                     : StatusCode::kInvalidArgument,
                    message);
    }
    const packaging::Manifest& manifest = (*package)->manifest();
    if (manifest.name != name || manifest.version != version) {
      return InvalidArgument("the package's manifest says " + manifest.name + " version " +
                             std::to_string(manifest.version) + ", but it was uploaded as " + name +
                             " version " + std::to_string(version));
    }
  }
  // Loaded before it is published, when it is to serve: a package that does not load never
  // reaches the repository, where the servers sharing it would try it too (and a restart would
  // meet it). What served before goes on serving.
  std::shared_ptr<ServedModel> staged;
  OROCHI_ASSIGN_OR_RETURN(std::vector<int64_t> would_be, store_.Versions(name));
  would_be.insert(std::upper_bound(would_be.begin(), would_be.end(), version), version);
  const std::vector<int64_t> selected = SelectVersions(name, would_be);
  if (load && std::find(selected.begin(), selected.end(), version) != selected.end()) {
    Result<std::shared_ptr<ServedModel>> loaded = LoadCopies(uploaded_file, name, version);
    if (!loaded.ok()) {
      {
        std::lock_guard lock(mutex_);
        load_failures_.erase(packaging::ModelKey{name, version}.ToString());  // it is in no index
        refused_uploads_[name].insert(version);
      }
      metrics_.LoadRefused(name, std::to_string(version));
      const Status& failure = loaded.status();
      Log(LogLevel::kWarning, "deployed package refused: it does not load",
          {{"model", name},
           {"version", std::to_string(version), false},
           {"error", failure.message()}});
      std::string message = failure.message();
      if (message.starts_with(uploaded_file)) {
        message = "the package" + message.substr(uploaded_file.size());
      }
      return Status(failure.code(), message + " (the package was not kept)", failure.detail());
    }
    staged = std::move(loaded).value();
  }
  // A server sharing the repository may have published this version since the check above.
  if (Status published = store_.Publish(name, version, uploaded_file); !published.ok()) {
    if (staged != nullptr) Discard(staged);
    return published;
  }
  Log(LogLevel::kInfo, "model deployed",
      {{"model", name}, {"version", std::to_string(version), false}});
  if (staged != nullptr) {
    staged->file = store_.Identify(name, version);
    Serve(staged);
  }
  if (!load) {
    if (Versions(name).empty()) {
      unloaded_.insert(name);
      OROCHI_RETURN_IF_ERROR(SaveState());
    }
    return std::string();
  }
  // The policy's other versions: the ones it selects load, the ones it no longer selects go.
  Result<std::string> applied = polling() ? Reconcile(name) : LoadModelLocked(name);
  if (!applied.ok()) return applied;
  return Joined(notice, *applied);
}

Result<std::string> ModelService::Delete(const std::string& name, std::optional<int64_t> version) {
  // The name is joined onto the repository's path: "..", or anything that is not one path
  // component, would reach outside it.
  OROCHI_RETURN_IF_ERROR(CheckModelName(name));
  std::lock_guard admin(admin_mutex_);
  if (!store_.HasModel(name)) return NotFound("model '" + name + "' is not in the repository");
  if (version && !store_.HasVersion(name, *version)) {
    return NotFound(Which(name, *version) + " is not in the repository");
  }
  const bool served = !Versions(name).empty() && unloaded_.count(name) == 0;
  if (!version) ForgetRefusedUploads(name, std::nullopt);
  std::string notice;
  if (!version) {
    for (int64_t each : Versions(name)) {
      OROCHI_ASSIGN_OR_RETURN(std::string unloaded, UnloadVersion(name, each));
      notice = Joined(notice, unloaded);
    }
  }
  // Out of sight first (one rename), then removed: a crash in between leaves only trash.
  OROCHI_ASSIGN_OR_RETURN(std::string trash, store_.MoveToTrash(name, version));
  Status reloaded;
  // A listing that fails here is not "no version left": loading them fails with its reason.
  const Result<std::vector<int64_t>> left = SelectedVersions(name);
  if (version && served && (!left.ok() || !left->empty())) {
    // The policy chooses again among the versions left (`latest`: the next newest), which
    // load beside the deleted one before it drains and goes, as in a deploy: a served model
    // stays served. Its package is mapped, so it keeps running from the trash meanwhile.
    Result<std::string> loaded = polling() ? Reconcile(name) : LoadModelLocked(name);
    reloaded = loaded.status();
    if (loaded.ok()) notice = Joined(notice, *loaded);
  }
  if (version) {
    Result<std::string> unloaded = UnloadVersion(name, *version);
    if (reloaded.ok()) reloaded = unloaded.status();
    if (unloaded.ok()) notice = Joined(notice, *unloaded);
  }
  repository::RepositoryStore::RemoveTrash(trash);
  if (!reloaded.ok()) {
    return Status(reloaded.code(),
                  Which(name, *version) +
                      " was deleted, but loading the versions left failed: " + reloaded.message(),
                  reloaded.detail());
  }
  if (!version && unloaded_.erase(name) != 0) OROCHI_RETURN_IF_ERROR(SaveState());
  return notice;
}

bool ModelService::KnownBroken(const std::string& name, int64_t version) {
  const std::string key = packaging::ModelKey{name, version}.ToString();
  {
    std::lock_guard lock(mutex_);
    if (auto quarantined = quarantined_.find(key); quarantined != quarantined_.end()) {
      load_failures_[key] = quarantined->second;
      return true;
    }
  }
  auto broken = broken_files_.find(key);
  if (broken == broken_files_.end()) return false;
  if (store_.Identify(name, version) == broken->second) return true;
  broken_files_.erase(broken);  // another file took its place: worth a try
  return false;
}

Result<std::string> ModelService::Reconcile(const std::string& name) {
  std::string notice;
  // A loaded version whose file was replaced (deleted and deployed again through another
  // server between two polls) is another package under the same key: it goes first.
  for (int64_t version : Versions(name)) {
    std::shared_ptr<const ServedModel> served = Find(name, version);
    std::optional<repository::FileIdentity> file = store_.Identify(name, version);
    if (served != nullptr && file && served->file && *file != *served->file) {
      OROCHI_ASSIGN_OR_RETURN(std::string unloaded, UnloadVersion(name, version));
      notice = Joined(notice, unloaded);
    }
  }
  // Unreadable is not empty: a poll that took it for empty would unload what serves.
  OROCHI_ASSIGN_OR_RETURN(const std::vector<int64_t> on_disk, store_.Versions(name));
  std::vector<int64_t> selected;
  // Failed in this pass: not tried again in it even if its file changes meanwhile (one being
  // copied in place changes all the time), but at the next poll.
  std::set<int64_t> failed_now;
  for (;;) {
    std::vector<int64_t> candidates;
    for (int64_t version : on_disk) {
      if (failed_now.count(version) == 0 && !KnownBroken(name, version)) {
        candidates.push_back(version);
      }
    }
    selected = SelectVersions(name, candidates);
    const std::vector<int64_t> loaded = Versions(name);
    bool failed = false;
    for (int64_t version : selected) {
      if (std::find(loaded.begin(), loaded.end(), version) != loaded.end()) continue;
      std::optional<repository::FileIdentity> file = store_.Identify(name, version);
      Status status = LoadVersion(name, version);
      if (status.ok()) continue;
      // Not tried again until its file changes; the policy chooses again without it. Each
      // round marks one more version, so this ends.
      failed = true;
      failed_now.insert(version);
      broken_files_[packaging::ModelKey{name, version}.ToString()] =
          file.value_or(repository::FileIdentity{});
      Log(LogLevel::kWarning, "model not loaded",
          {{"model", name},
           {"version", std::to_string(version), false},
           {"reason", status.message()}});
    }
    if (!failed) break;
  }
  // What serves now, the new versions included; the ones no longer selected drain and go.
  for (int64_t version : Versions(name)) {
    if (std::find(selected.begin(), selected.end(), version) == selected.end()) {
      OROCHI_ASSIGN_OR_RETURN(std::string unloaded, UnloadVersion(name, version));
      notice = Joined(notice, unloaded);
    }
  }
  return notice;
}

void ModelService::PollRepository() {
  std::lock_guard admin(admin_mutex_);
  Result<std::vector<std::string>> listed = store_.Models();
  if (!listed.ok()) {
    // Nothing changes until the repository can be read again: a listing that failed (out of
    // descriptors, an NFS hiccup) is not a repository emptied.
    Log(LogLevel::kError, "repository poll failed", {{"error", listed.status().message()}});
    return;
  }
  std::set<std::string> names(listed->begin(), listed->end());
  {
    std::lock_guard lock(mutex_);
    for (const auto& [name, versions] : models_) names.insert(name);
  }
  for (const std::string& name : names) {
    // Names a manifest could not have (a directory someone made by hand) are not models.
    if (!packaging::IsName(name)) continue;
    Result<std::string> reconciled = Reconcile(name);
    if (!reconciled.ok()) {
      Log(LogLevel::kError, "repository poll failed",
          {{"model", name}, {"error", reconciled.status().message()}});
    } else if (!reconciled->empty()) {
      Log(LogLevel::kWarning, "repository poll", {{"model", name}, {"notice", *reconciled}});
    }
  }
}

void ModelService::PollLoop() {
  const std::chrono::milliseconds interval(config_.repository_poll_ms);
  std::unique_lock lock(poll_mutex_);
  while (!poll_wake_.wait_for(lock, interval, [this] { return poll_stopping_; })) {
    lock.unlock();
    PollRepository();
    lock.lock();
  }
}

Result<std::vector<ModelService::IndexEntry>> ModelService::Index() const {
  std::vector<IndexEntry> entries;
  OROCHI_ASSIGN_OR_RETURN(const std::vector<std::string> names, store_.Models());
  for (const std::string& name : names) {
    std::vector<int64_t> loaded = Versions(name);
    OROCHI_ASSIGN_OR_RETURN(const std::vector<int64_t> on_disk, store_.Versions(name));
    for (int64_t version : on_disk) {
      bool ready = std::find(loaded.begin(), loaded.end(), version) != loaded.end();
      const std::string key = packaging::ModelKey{name, version}.ToString();
      std::string reason;
      if (!ready) {
        std::lock_guard lock(mutex_);
        auto failure = load_failures_.find(key);
        reason = failure != load_failures_.end() ? failure->second : "unloaded";
      } else {
        const Status available = Availability(key);
        reason = available.message();
        ready = available.ok();
      }
      entries.push_back({name, version, ready ? "READY" : "UNAVAILABLE", reason});
    }
  }
  return entries;
}

std::shared_ptr<const ServedModel> ModelService::Find(const std::string& name,
                                                      std::optional<int64_t> version) const {
  std::lock_guard lock(mutex_);
  auto model = models_.find(name);
  if (model == models_.end() || model->second.empty()) return nullptr;
  if (!version) return model->second.rbegin()->second;
  auto found = model->second.find(*version);
  return found == model->second.end() ? nullptr : found->second;
}

std::vector<std::shared_ptr<const ServedModel>> ModelService::List() const {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<const ServedModel>> all;
  for (const auto& [name, versions] : models_) {
    for (const auto& [version, model] : versions) all.push_back(model);
  }
  return all;
}

std::string ModelService::LoadFailures(const std::string& name) const {
  std::lock_guard lock(mutex_);
  std::string reasons;
  const std::string prefix = name + ":";
  for (auto it = load_failures_.lower_bound(prefix);
       it != load_failures_.end() && it->first.starts_with(prefix); ++it) {
    reasons += (reasons.empty() ? "" : "; ") + it->second;
  }
  return reasons;
}

std::vector<int64_t> ModelService::Versions(const std::string& name) const {
  std::lock_guard lock(mutex_);
  std::vector<int64_t> versions;
  auto model = models_.find(name);
  if (model == models_.end()) return versions;
  for (auto it = model->second.rbegin(); it != model->second.rend(); ++it) {
    versions.push_back(it->first);
  }
  return versions;
}

std::shared_ptr<ServedModel> ModelService::FindByKey(const std::string& key) const {
  std::lock_guard lock(mutex_);
  auto found = by_key_.find(key);
  return found == by_key_.end() ? nullptr : found->second;
}

Status ModelService::Submit(const std::shared_ptr<const ServedModel>& model,
                            std::vector<interpreters::NamedTensor>& inputs,
                            const interpreters::RequestParameters& parameters, int64_t rows,
                            std::optional<Clock::time_point> deadline,
                            std::function<bool()> abandoned, Done done,
                            std::shared_ptr<ResponseStream> stream,
                            const std::optional<interpreters::SequenceCall>& sequence) {
  InferJob job;
  if (sequence) job.sequence = SequenceStep{*sequence};
  job.stream = std::move(stream);
  job.abandoned = std::move(abandoned);
  job.inputs = std::move(inputs);
  job.parameters = parameters;
  job.rows = rows;
  job.deadline = deadline;
  job.done = [holder = model, rows, done = std::move(done)](
                 Result<std::vector<interpreters::NamedTensor>> outputs,
                 const InferTimings& timings) {
    {
      std::lock_guard lock(holder->stats_mutex);
      ModelStats& stats = holder->stats;
      (outputs.ok() ? stats.success : stats.fail).Add(timings.queue + timings.compute);
      stats.queue.Add(timings.queue);
      if (outputs.ok()) stats.inference_count += std::max<int64_t>(rows, 1);
      stats.last_inference_ms = NowMs();
    }
    done(std::move(outputs), timings);
  };
  Status submitted = scheduler_.Submit(model->key, job);
  if (!submitted.ok()) inputs = std::move(job.inputs);
  return submitted;
}

void ModelService::OnBatch(const std::string& model_key, int64_t rows, int64_t requests,
                           const BatchTimings& timings, bool ok) {
  std::shared_ptr<ServedModel> model = FindByKey(model_key);
  if (model == nullptr) return;
  {
    std::lock_guard lock(model->stats_mutex);
    model->stats.execution_count += 1;
    model->stats.compute.Add(timings);
    model->stats.batches[std::max<int64_t>(rows, requests)].Add(timings);
  }
  (void)ok;
  metrics_.BatchRan(model->name, std::to_string(model->version), std::max<int64_t>(rows, requests));
}

namespace {
// A model's key as the two labels of a metric (name, version).
std::pair<std::string, std::string> KeyLabels(const std::string& model_key) {
  Result<packaging::ModelKey> key = packaging::ModelKey::Parse(model_key);
  if (!key.ok()) return {model_key, ""};
  return {key->name, std::to_string(key->version)};
}
}  // namespace

void ModelService::OnStreamResponse(const std::string& model_key, bool first,
                                    std::chrono::nanoseconds since) {
  const auto [name, version] = KeyLabels(model_key);
  metrics_.StreamResponse(name, version, first, since);
}

void ModelService::OnLiveStreams(const std::string& model_key, int64_t live) {
  const auto [name, version] = KeyLabels(model_key);
  metrics_.LiveStreams(name, version, live);
}

void ModelService::OnStreamEnded(const std::string& model_key, StreamEnd end) {
  const auto [name, version] = KeyLabels(model_key);
  metrics_.StreamEnded(name, version, StreamEndName(end));
}

void ModelService::NoteRestarts(int64_t restarts) {
  if (restarts == 0) return;
  restarted_ = true;
  scheduler_.SetUnknownSequenceNote(
      "the serving process was restarted after model code crashed it (restarts so far: " +
      std::to_string(restarts) +
      ", orochi_server_restarts_total), and every sequence live before a restart was lost "
      "with it");
}

void ModelService::OnLiveSequences(const std::string& model_key, int64_t live) {
  const auto [name, version] = KeyLabels(model_key);
  metrics_.LiveSequences(name, version, live);
}

void ModelService::OnSequenceEnded(const std::string& model_key, SequenceEnd end) {
  const auto [name, version] = KeyLabels(model_key);
  metrics_.SequenceEnded(name, version, SequenceEndName(end));
}

void ModelService::OnQueueDepth(const std::string& model_key, int64_t depth) {
  const auto [name, version] = KeyLabels(model_key);
  metrics_.QueueDepth(name, version, depth);
}

void ModelService::ForgetRefusedUploads(const std::string& name, std::optional<int64_t> keeping) {
  std::set<int64_t> refused;
  {
    std::lock_guard lock(mutex_);
    auto found = refused_uploads_.find(name);
    if (found == refused_uploads_.end()) return;
    refused = std::move(found->second);
    refused_uploads_.erase(found);
  }
  for (int64_t version : refused) {
    if (version != keeping) metrics_.LoadRefusalGone(name, std::to_string(version));
  }
}

void ModelService::OnCopyReplaced(size_t slot) {
  metrics_.CopyReplaced();
  metrics_.Copies("abandoned_loaded", static_cast<int64_t>(manager_.abandoned_loaded()));
  Log(LogLevel::kWarning, "interpreter copy replaced: it did not stop after an interrupt",
      {{"copy", std::to_string(slot), false}});
}

void ModelService::OnCopiesRecovering(int64_t without_copy, int64_t missing_models) {
  metrics_.Copies("failed", without_copy);
  metrics_.Copies("missing_models", missing_models);
}

void ModelService::OnAbandonedCopies(int64_t running) {
  metrics_.Copies("abandoned", running);
  // An abandoned copy whose call returned has been unloaded by then (InterpreterManager::Abandon).
  metrics_.Copies("abandoned_loaded", static_cast<int64_t>(manager_.abandoned_loaded()));
}

void ModelService::OnModelUnavailable(const std::string& model_key, const std::string& reason) {
  Log(LogLevel::kError, "model made unavailable: its code got too many copies stuck",
      {{"model", model_key}, {"reason", reason}});
}

Status ModelService::Availability(const std::string& model_key) const {
  return scheduler_.Availability(model_key);
}

void ModelService::OnCopyRunning(size_t /*slot*/, bool running) {
  const int64_t busy = running ? ++busy_copies_ : --busy_copies_;
  metrics_.Copies("busy", busy);
  ReportIdle();
}

void ModelService::ReportIdle() {
  metrics_.Copies(
      "idle", static_cast<int64_t>(manager_.size()) - busy_copies_.load() - loading_copies_.load());
}

void ModelService::OnCopyBusy(size_t slot, std::chrono::nanoseconds busy) {
  metrics_.CopyBusy(slot, busy);
}

}  // namespace orochi::server

#include "model_service.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "log.h"

namespace orochi::server {
namespace {

namespace fs = std::filesystem;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool IsVersionDirectory(const fs::path& path, int64_t* version) {
  std::string name = path.filename().string();
  if (name.empty() || name.size() > 18 ||
      name.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  *version = std::stoll(name);
  return *version >= 1;
}

}  // namespace

ModelService::ModelService(interpreters::InterpreterManager& manager, const ModelsConfig& config,
                           Metrics& metrics)
    : manager_(manager),
      config_(config),
      metrics_(metrics),
      scheduler_(manager, static_cast<size_t>(config.max_queue_size),
                 std::chrono::milliseconds(config.execution_grace_ms), this) {}

ModelService::~ModelService() { Stop(); }

void ModelService::Stop() { scheduler_.Stop(); }

std::vector<size_t> ModelService::SlotsFor(const packaging::Manifest& manifest) {
  const size_t copies = manager_.size();
  size_t wanted = manifest.instances ? static_cast<size_t>(*manifest.instances) : copies;
  wanted = std::min(wanted, copies);
  // Models with fewer instances than copies start at rotating copies, to spread the load.
  std::vector<size_t> slots;
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < wanted; ++i) slots.push_back((next_slot_ + i) % copies);
  if (wanted < copies) next_slot_ = (next_slot_ + wanted) % copies;
  std::sort(slots.begin(), slots.end());
  return slots;
}

Status ModelService::Load(const std::string& path, const std::string& expected_name,
                          int64_t expected_version) {
  const Clock::time_point start = Clock::now();
  const std::string version_text = std::to_string(expected_version);
  auto fail = [&](const Status& status) {
    metrics_.ModelLoaded(expected_name, version_text, false, Clock::now() - start);
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
  if (manifest.device != "cpu") {
    return fail(Unavailable(path + ": the model wants device '" + manifest.device +
                            "', but this server's engine runs on the CPU only"));
  }
  interpreters::ModelSource source;
  source.key = manifest.name + ":" + version_text;
  source.manifest_json = manifest.json;
  source.code = package->code();
  source.weights = package->weights();
  source.read_resource = [package](std::string_view resource) {
    return package->ReadResource(resource);
  };
  Result<std::unique_ptr<interpreters::ReplicatedModel>> replicas =
      interpreters::ReplicatedModel::Load(manager_, std::move(source), SlotsFor(manifest));
  if (!replicas.ok()) return fail(replicas.status());

  auto served = std::make_shared<ServedModel>();
  served->name = manifest.name;
  served->version = manifest.version;
  served->key = manifest.name + ":" + version_text;
  served->package = package;
  served->replicas = std::move(replicas).value();
  served->batching.max_batch_size = manifest.max_batch_size;
  served->batching.max_queue_delay = std::chrono::microseconds(config_.max_queue_delay_us);
  served->batching.preferred_batch_sizes = config_.preferred_batch_sizes;
  scheduler_.AddModel(served->replicas, served->batching);
  {
    std::lock_guard lock(mutex_);
    models_[served->name][served->version] = served;
  }
  metrics_.ModelLoaded(served->name, version_text, true, Clock::now() - start);
  return Status::Ok();
}

Status ModelService::LoadFromRepository() {
  if (config_.repository.empty()) return Status::Ok();
  const fs::path repository(config_.repository);
  std::error_code error;
  if (!fs::is_directory(repository, error)) {
    return NotFound("the model repository " + config_.repository + " is not a directory");
  }
  const bool all = config_.load.empty() ||
                   std::find(config_.load.begin(), config_.load.end(), "*") != config_.load.end();
  std::vector<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(repository)) {
    if (entry.is_directory() && entry.path().filename().string().front() != '.') {
      names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  if (!all) {
    for (const std::string& wanted : config_.load) {
      if (std::find(names.begin(), names.end(), wanted) == names.end()) {
        return NotFound("model '" + wanted + "' is not in the repository " + config_.repository);
      }
    }
    names = config_.load;
  }
  for (const std::string& name : names) {
    int64_t latest = 0;
    for (const fs::directory_entry& entry : fs::directory_iterator(repository / name)) {
      int64_t version = 0;
      if (entry.is_directory() && IsVersionDirectory(entry.path(), &version) &&
          fs::exists(entry.path() / "model.orochi")) {
        latest = std::max(latest, version);
      }
    }
    if (latest == 0) {
      return NotFound("model '" + name + "' has no version in the repository (expected " +
                      (repository / name / "<version>" / "model.orochi").string() + ")");
    }
    const fs::path path = repository / name / std::to_string(latest) / "model.orochi";
    OROCHI_RETURN_IF_ERROR(Load(path.string(), name, latest));
  }
  return Status::Ok();
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
  for (const auto& [name, versions] : models_) {
    for (const auto& [version, model] : versions) {
      if (model->key == key) return model;
    }
  }
  return nullptr;
}

Status ModelService::Submit(const std::shared_ptr<const ServedModel>& model,
                            std::vector<interpreters::NamedTensor> inputs, int64_t rows,
                            std::optional<Clock::time_point> deadline,
                            std::function<bool()> abandoned, Done done) {
  InferJob job;
  job.abandoned = std::move(abandoned);
  job.inputs = std::move(inputs);
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
  return scheduler_.Submit(model->key, std::move(job));
}

void ModelService::OnBatch(const std::string& model_key, int64_t rows, int64_t requests,
                           std::chrono::nanoseconds compute, bool ok) {
  std::shared_ptr<ServedModel> model = FindByKey(model_key);
  if (model == nullptr) return;
  {
    std::lock_guard lock(model->stats_mutex);
    model->stats.execution_count += 1;
    model->stats.compute_infer.Add(compute);
    model->stats.batches[std::max<int64_t>(rows, requests)].Add(compute);
  }
  (void)ok;
  metrics_.BatchRan(model->name, std::to_string(model->version), std::max<int64_t>(rows, requests));
}

void ModelService::OnQueueDepth(const std::string& model_key, int64_t depth) {
  size_t colon = model_key.rfind(':');
  metrics_.QueueDepth(model_key.substr(0, colon), model_key.substr(colon + 1), depth);
}

void ModelService::OnCopyReplaced(size_t slot, const Status& result) {
  replaced_copies_++;
  metrics_.Copies("replaced", replaced_copies_.load());
  if (result.ok()) {
    Log(LogLevel::kWarning, "interpreter copy replaced: it did not stop after an interrupt",
        {{"copy", std::to_string(slot), false}});
  } else {
    metrics_.Copies("failed", 1);
    Log(LogLevel::kError, "replacing a stuck interpreter copy failed",
        {{"copy", std::to_string(slot), false}, {"error", result.message()}});
  }
}

void ModelService::OnCopyBusy(size_t slot, std::chrono::nanoseconds busy) {
  metrics_.CopyBusy(slot, busy);
}

}  // namespace orochi::server

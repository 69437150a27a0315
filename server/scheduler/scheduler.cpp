#include "scheduler.h"

#include <algorithm>
#include <bit>
#include <system_error>
#include <thread>
#include <utility>

#include "log.h"
#include "orochi/base/crash_record.h"
#include "orochi/engine/ops.h"

namespace orochi::server {
namespace {

using interpreters::BytesTensor;
using interpreters::NamedTensor;

// Whether two requests' parameters are the same values to the model, which sees one set per
// batch. Numbers compare by their bits: 0.0 == -0.0 would hand one request the other's zero
// (math.copysign tells them apart), and NaN != NaN would keep every NaN request out of batches.
bool SameParameters(const interpreters::RequestParameters& a,
                    const interpreters::RequestParameters& b) {
  return std::equal(
      a.begin(), a.end(), b.begin(), b.end(), [](const auto& left, const auto& right) {
        if (left.first != right.first) return false;
        const auto* left_number = std::get_if<double>(&left.second);
        const auto* right_number = std::get_if<double>(&right.second);
        if (left_number != nullptr && right_number != nullptr) {
          return std::bit_cast<uint64_t>(*left_number) == std::bit_cast<uint64_t>(*right_number);
        }
        return left.second == right.second;
      });
}

// The inputs of several requests as one batch, concatenated along dim 0.
Result<std::vector<NamedTensor>> Concatenate(const std::vector<InferJob>& batch) {
  if (batch.size() == 1) return batch.front().inputs;
  std::vector<NamedTensor> merged;
  for (size_t i = 0; i < batch.front().inputs.size(); ++i) {
    const NamedTensor& first = batch.front().inputs[i];
    if (std::holds_alternative<engine::Tensor>(first.value)) {
      std::vector<engine::Tensor> parts;
      for (const InferJob& job : batch) {
        const NamedTensor* input = nullptr;
        for (const NamedTensor& candidate : job.inputs) {
          if (candidate.name == first.name) input = &candidate;
        }
        if (input == nullptr) return InvalidArgument("input '" + first.name + "' missing");
        parts.push_back(std::get<engine::Tensor>(input->value));
      }
      merged.push_back({first.name, engine::Cat(parts, 0)});
    } else {
      BytesTensor joined{std::get<BytesTensor>(first.value).shape, {}};
      joined.shape[0] = 0;
      for (const InferJob& job : batch) {
        for (const NamedTensor& candidate : job.inputs) {
          if (candidate.name != first.name) continue;
          const auto& bytes = std::get<BytesTensor>(candidate.value);
          joined.shape[0] += bytes.shape.empty() ? 0 : bytes.shape[0];
          joined.items.insert(joined.items.end(), bytes.items.begin(), bytes.items.end());
        }
      }
      merged.push_back({first.name, std::move(joined)});
    }
  }
  return merged;
}

// A model with a batch dimension answers one row per input row, in every output: checked for a
// request that ran alone as much as for a batch, or a wrong model would hand a client rows
// that are not its own.
Status CheckRows(const std::vector<NamedTensor>& outputs, int64_t total) {
  for (const NamedTensor& output : outputs) {
    int64_t rows = 0;
    if (const auto* tensor = std::get_if<engine::Tensor>(&output.value)) {
      rows = tensor->dim() == 0 ? -1 : tensor->shape()[0];
    } else {
      const auto& bytes = std::get<BytesTensor>(output.value);
      rows = bytes.shape.empty() ? -1 : bytes.shape[0];
    }
    if (rows != total) {
      return Internal("output '" + output.name + "' has " +
                      std::to_string(std::max<int64_t>(rows, 0)) + " rows for a batch of " +
                      std::to_string(total));
    }
  }
  return Status::Ok();
}

// Rows [start, start + rows) of every output.
Result<std::vector<NamedTensor>> Slice(const std::vector<NamedTensor>& outputs, int64_t start,
                                       int64_t rows, int64_t total) {
  OROCHI_RETURN_IF_ERROR(CheckRows(outputs, total));
  std::vector<NamedTensor> part;
  for (const NamedTensor& output : outputs) {
    if (const auto* tensor = std::get_if<engine::Tensor>(&output.value)) {
      part.push_back({output.name, tensor->Narrow(0, start, rows).Contiguous()});
    } else {
      const auto& bytes = std::get<BytesTensor>(output.value);
      const int64_t per_row = total == 0 ? 0 : static_cast<int64_t>(bytes.items.size()) / total;
      BytesTensor slice{bytes.shape, {}};
      slice.shape[0] = rows;
      slice.items.assign(bytes.items.begin() + start * per_row,
                         bytes.items.begin() + (start + rows) * per_row);
      part.push_back({output.name, std::move(slice)});
    }
  }
  return part;
}

}  // namespace

Scheduler::Scheduler(interpreters::InterpreterManager& manager, size_t max_queue_size,
                     std::chrono::milliseconds execution_grace, size_t max_abandoned_copies,
                     SchedulerObserver* observer, RetryBackoff replacement_retry)
    : manager_(manager),
      max_queue_size_(max_queue_size),
      execution_grace_(execution_grace),
      max_abandoned_copies_(max_abandoned_copies),
      replacement_retry_(replacement_retry),
      observer_(observer),
      workers_(manager.size()) {
  for (size_t slot = 0; slot < manager.size(); ++slot) {
    workers_[slot].thread = std::thread([this, slot] { WorkThenExit(slot, 0); });
  }
  watchdog_ = std::thread([this] { Watch(); });
}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::AddModel(std::shared_ptr<interpreters::ReplicatedModel> model,
                         BatchingOptions batching) {
  auto queue = std::make_unique<ModelQueue>();
  queue->held_by.assign(manager_.size(), false);
  queue->missing_in.assign(manager_.size(), false);
  queue->sequences_in.assign(manager_.size(), 0);
  queue->drops.resize(manager_.size());
  for (size_t slot : model->slots()) queue->held_by[slot] = true;
  queue->model = std::move(model);
  queue->batching = std::move(batching);
  std::lock_guard lock(mutex_);
  queues_[queue->model->key()] = std::move(queue);
}

size_t Scheduler::RemoveModel(const std::string& key, std::optional<Clock::duration> grace) {
  std::unique_ptr<ModelQueue> removed;
  std::vector<InferJob> refused;
  size_t abandoned = 0;
  {
    std::unique_lock lock(mutex_);
    auto found = queues_.find(key);
    if (found == queues_.end()) return 0;
    ModelQueue* queue = found->second.get();
    // Drain: no new requests, but the queued and running ones are still answered normally.
    queue->closing = true;
    // Except where no copy holds the model (its replacements are still loading it, or failed
    // to): a closing model is not loaded again, so nothing would ever run them.
    if (std::find(queue->held_by.begin(), queue->held_by.end(), true) == queue->held_by.end()) {
      refused.assign(std::make_move_iterator(queue->jobs.begin()),
                     std::make_move_iterator(queue->jobs.end()));
      if (!queue->jobs.empty() && observer_ != nullptr) observer_->OnQueueDepth(key, 0);
      queue->jobs.clear();
    }
    // While stopping, the queued requests are answered below rather than waited for, but a
    // batch still running holds the queue: it goes only once that batch is back (or left
    // behind by Stop).
    auto drained = [&] { return queue->running == 0 && (stopping_ || queue->jobs.empty()); };
    if (!grace) {
      idle_.wait(lock, drained);
    } else {
      // Past the grace, whatever runs is stuck in code that nothing else will stop (a request
      // deadline would have): interrupt it, then abandon the copies that ignore the interrupt.
      // Each round takes what started meanwhile, so the wait ends even with every copy stuck.
      Clock::time_point until = Clock::now() + *grace;
      while (!idle_.wait_until(lock, until, drained)) {
        refused.insert(refused.end(), std::make_move_iterator(queue->jobs.begin()),
                       std::make_move_iterator(queue->jobs.end()));
        if (!queue->jobs.empty() && observer_ != nullptr) observer_->OnQueueDepth(key, 0);
        queue->jobs.clear();
        bool interrupting = false;
        for (size_t slot = 0; slot < workers_.size(); ++slot) {
          Worker& worker = workers_[slot];
          if (worker.queue != queue || !worker.batch) continue;
          if (worker.between_calls) {
            // Streams between two calls: their worker ends them at its next look.
            worker.unloading = true;
            interrupting = true;
            continue;
          }
          if (!worker.unloading) {
            worker.unloading = true;
            if (!worker.interrupted) Interrupt(worker);
            worker.interrupted = true;
            interrupting = true;
            continue;
          }
          ReplaceStuckCopy(
              lock, slot,
              Unavailable("model " + key +
                          " was unloaded while the request ran: it did not finish within the "
                          "unload grace period nor stop when interrupted, and its interpreter "
                          "copy was replaced"),
              queue);
          abandoned++;
        }
        // Without a batch to wait on, only a worker between taking its batch and running it
        // holds the queue: a moment.
        until = Clock::now() + (interrupting
                                    ? std::chrono::duration_cast<Clock::duration>(execution_grace_)
                                    : std::chrono::milliseconds(10));
      }
    }
    if (observer_ != nullptr && !queue->sequences.empty()) {
      for (size_t i = 0; i < queue->sequences.size(); ++i) {
        observer_->OnSequenceEnded(key, SequenceEnd::kUnloaded);
      }
      observer_->OnLiveSequences(key, 0);
    }
    removed = std::move(found->second);
    queues_.erase(found);
    ReportRecovering();  // a slot may have been missing only this model
  }
  for (InferJob& job : removed->jobs) refused.push_back(std::move(job));  // only when stopping
  for (InferJob& job : refused) {
    job.done(Unavailable("model " + key + " was unloaded before the request ran"),
             InferTimings{Clock::now() - job.enqueued, {}, 0});
  }
  return abandoned;
}

Status Scheduler::Availability(std::string_view model_key) const {
  std::lock_guard lock(mutex_);
  auto found = queues_.find(model_key);
  if (found == queues_.end()) return Status::Ok();
  const ModelQueue& queue = *found->second;
  return !queue.unavailable.empty() ? Unavailable(queue.unavailable) : CopyAvailability(queue);
}

Status Scheduler::CopyAvailability(const ModelQueue& queue) {
  // While a replacement is merely under way the requests wait for it; only once loading the
  // model into it failed is there no telling when a copy will hold it again.
  if (queue.load_error.empty() ||
      std::find(queue.held_by.begin(), queue.held_by.end(), true) != queue.held_by.end()) {
    return Status::Ok();
  }
  const bool retried =
      std::find(queue.missing_in.begin(), queue.missing_in.end(), true) != queue.missing_in.end();
  return Unavailable("model " + queue.model->key() +
                     " has no interpreter copy to run in: loading it into the replacement of a "
                     "stuck copy failed (" +
                     queue.load_error + ")" + (retried ? "; the load is retried" : ""));
}

Status Scheduler::Submit(const std::string& model_key, InferJob& job) {
  std::lock_guard lock(mutex_);
  if (stopping_) return Unavailable("the server is shutting down");
  auto found = queues_.find(model_key);
  if (found == queues_.end()) return NotFound("model " + model_key + " is not loaded");
  ModelQueue& queue = *found->second;
  if (queue.closing) return Unavailable("model " + model_key + " is being unloaded");
  if (!queue.unavailable.empty()) return Unavailable(queue.unavailable);
  OROCHI_RETURN_IF_ERROR(CopyAvailability(queue));
  if (queue.batching.streaming != (job.stream != nullptr)) {
    return InvalidArgument(queue.batching.streaming
                               ? "model " + model_key +
                                     " is a streaming model: it answers through generate, "
                                     "generate_stream or gRPC ModelStreamInfer"
                               : "model " + model_key + " is not a streaming model");
  }
  if (queue.batching.streaming && queue.jobs.size() >= stream_limits_.max_queued_streams) {
    return ResourceExhausted(
        "model " + model_key + " has " + std::to_string(stream_limits_.max_queued_streams) +
        " streams waiting for a copy (models.max_queued_streams); retry later");
  }
  if (queue.jobs.size() >= max_queue_size_) {
    return ResourceExhausted("the queue of model " + model_key + " is full (" +
                             std::to_string(max_queue_size_) + " waiting requests); retry later");
  }
  if (queue.batching.sequences) {
    OROCHI_RETURN_IF_ERROR(AdmitSequenceStep(queue, job));
  } else if (job.sequence) {
    return InvalidArgument("model " + model_key + " is not stateful");
  }
  queue.jobs.push_back(std::move(job));
  if (observer_ != nullptr) {
    observer_->OnQueueDepth(model_key, static_cast<int64_t>(queue.jobs.size()));
  }
  work_ready_.notify_all();
  return Status::Ok();
}

size_t Scheduler::Stop(std::optional<Clock::time_point> deadline) {
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<Batch>> stuck;
  std::vector<InferJob> leftover;
  size_t left_behind = 0;
  {
    std::unique_lock lock(mutex_);
    if (stopping_ && !watchdog_.joinable()) return 0;
    stopping_ = true;
    work_ready_.notify_all();
    watch_.notify_all();
    idle_.notify_all();
    // std::thread has no timed join: wait for the workers to say they are done instead.
    auto all_exited = [&] {
      return std::all_of(workers_.begin(), workers_.end(), [](const Worker& worker) {
        return worker.exited || !worker.thread.joinable();
      });
    };
    if (deadline) {
      idle_.wait_until(lock, *deadline, all_exited);
    } else {
      idle_.wait(lock, all_exited);
    }
    for (size_t slot = 0; slot < workers_.size(); ++slot) {
      Worker& worker = workers_[slot];
      if (!worker.thread.joinable()) continue;
      if (worker.exited) {
        threads.push_back(std::move(worker.thread));
        continue;
      }
      // Joining would wait forever. A new generation makes the thread leave quietly should
      // it ever come back.
      Log(LogLevel::kError, "interpreter copy stuck at shutdown; leaving it behind",
          {{"model", worker.queue != nullptr ? worker.queue->model->key() : std::string("-")},
           {"copy", std::to_string(slot), false},
           {"running_ms",
            worker.batch ? std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                              Clock::now() - worker.batch->started)
                                              .count())
                         : std::string("0"),
            false}});
      worker.generation++;
      left_behind++;
      if (worker.batch) stuck.push_back(std::move(worker.batch));
      worker.copy.reset();
      if (worker.queue != nullptr) worker.queue->running--;  // its thread will not touch it
      worker.queue = nullptr;
      if (worker.reloading != nullptr) {
        // Nor the queue of the model it reloads; it counts itself out of abandoned_running_
        // should it return (LoadMissingModel).
        worker.reloading->running--;
        worker.reloading = nullptr;
        abandoned_running_++;
      }
      worker.thread.detach();
    }
    idle_.notify_all();  // a RemoveModel may be waiting on a batch that was left behind
    if (watchdog_.joinable()) threads.push_back(std::move(watchdog_));
    // The workers that exited ran every request of the models they hold; what is left waits
    // for a copy left behind, or for a model no copy holds now (its replacement is still
    // loading it, or failed to): nothing will run it, and its client must not wait forever.
    for (auto& [key, queue] : queues_) {
      for (InferJob& job : queue->jobs) leftover.push_back(std::move(job));
      queue->jobs.clear();
    }
  }
  for (InferJob& job : leftover) {
    job.done(Unavailable("the server shut down before the request could run"),
             InferTimings{Clock::now() - job.enqueued, {}, 0});
  }
  for (const std::shared_ptr<Batch>& batch : stuck) {
    Answer(*batch,
           Unavailable("the server shut down while the request was still running; its "
                       "interpreter copy did not return within the shutdown grace period"),
           InferTimings{{}, Clock::now() - batch->started, 0});
  }
  for (std::thread& thread : threads) thread.join();
  return left_behind;
}

void Scheduler::WorkThenExit(size_t slot, uint64_t generation) {
  Work(slot, generation);
  std::lock_guard lock(mutex_);
  if (workers_[slot].generation != generation) return;  // superseded: not this thread's slot
  workers_[slot].exited = true;
  idle_.notify_all();
}

Scheduler::ModelQueue* Scheduler::Pick(size_t slot) {
  ModelQueue* oldest = nullptr;
  Clock::time_point oldest_enqueued;
  for (auto& [key, queue] : queues_) {
    if (queue->jobs.empty() || !queue->held_by[slot]) continue;
    auto next = queue->jobs.begin();
    // A stateful model's requests each belong to the slot that holds their sequence.
    if (queue->batching.sequences) next = NextSequenceJob(*queue, slot);
    if (next == queue->jobs.end()) continue;
    if (oldest == nullptr || next->enqueued < oldest_enqueued) {
      oldest = queue.get();
      oldest_enqueued = next->enqueued;
    }
  }
  return oldest;
}

std::vector<InferJob> Scheduler::TakeBatch(std::unique_lock<std::mutex>& lock, ModelQueue& queue) {
  std::vector<InferJob> batch;
  const BatchingOptions& batching = queue.batching;
  batch.push_back(std::move(queue.jobs.front()));
  queue.jobs.pop_front();
  int64_t rows = batch.front().rows;
  if (batching.max_batch_size <= 0) return batch;
  // Takes the requests that join the batch, in arrival order: the first that cannot (too many
  // rows, or other parameters) ends it rather than being overtaken by later ones. Returns
  // whether later requests could still join.
  auto take_joining = [&] {
    while (!queue.jobs.empty()) {
      const InferJob& next = queue.jobs.front();
      if (rows + next.rows > batching.max_batch_size ||
          !SameParameters(next.parameters, batch.front().parameters)) {
        return false;
      }
      rows += next.rows;
      batch.push_back(std::move(queue.jobs.front()));
      queue.jobs.pop_front();
    }
    return true;
  };
  auto preferred = [&] {
    return std::find(batching.preferred_batch_sizes.begin(), batching.preferred_batch_sizes.end(),
                     rows) != batching.preferred_batch_sizes.end();
  };
  // Wait for more requests while the batch can grow and its oldest request may still wait.
  const Clock::time_point until = batch.front().enqueued + batching.max_queue_delay;
  while (take_joining() && rows < batching.max_batch_size && !preferred() && !stopping_ &&
         Clock::now() < until) {
    queue.running++;  // the model must not be removed under the waiting batch
    work_ready_.wait_until(lock, until);
    queue.running--;
  }
  return batch;
}

void Scheduler::Work(size_t slot, uint64_t generation) {
  std::unique_lock lock(mutex_);
  Worker& worker = workers_[slot];
  while (worker.generation == generation) {
    // No new copy or load once stopping: Stop would have to wait for it.
    const bool repairing = !stopping_ && NeedsRepair(slot);
    if (repairing && Clock::now() >= worker.retry_at) {
      RepairSlot(lock, slot, generation);
      continue;
    }
    if (worker.paused == 0 && DropSequenceStates(lock, slot)) continue;
    ModelQueue* queue = worker.paused > 0 ? nullptr : Pick(slot);
    if (queue == nullptr) {
      if (stopping_) return;
      if (repairing) {
        work_ready_.wait_until(lock, worker.retry_at);
      } else {
        work_ready_.wait(lock);
      }
      continue;
    }
    std::vector<InferJob> batch;
    if (queue->batching.streaming) {
      batch.push_back(std::move(queue->jobs.front()));
      queue->jobs.pop_front();
    } else if (queue->batching.sequences) {
      auto next = NextSequenceJob(*queue, slot);
      batch.push_back(std::move(*next));
      queue->jobs.erase(next);
    } else {
      batch = TakeBatch(lock, *queue);
    }
    if (observer_ != nullptr) {
      observer_->OnQueueDepth(queue->model->key(), static_cast<int64_t>(queue->jobs.size()));
    }
    queue->running++;
    worker.busy = true;
    lock.unlock();
    const bool current = queue->batching.streaming
                             ? RunStreams(slot, generation, *queue, std::move(batch.front()))
                             : Run(slot, generation, *queue, std::move(batch));
    lock.lock();
    if (!current) {
      // The copy was abandoned under this thread and a new worker took over; the code it was
      // stuck in has returned at last, so it no longer burns a core.
      if (abandoned_running_ > 0) abandoned_running_--;
      if (observer_ != nullptr) {
        observer_->OnAbandonedCopies(static_cast<int64_t>(abandoned_running_));
      }
      return;
    }
    queue->running--;
    worker.busy = false;
    idle_.notify_all();
  }
}

void Scheduler::PauseSlot(size_t slot) {
  std::unique_lock lock(mutex_);
  Worker& worker = workers_.at(slot);
  worker.paused++;
  idle_.wait(lock, [&] { return !worker.busy || stopping_; });
}

void Scheduler::ResumeSlot(size_t slot) {
  {
    std::lock_guard lock(mutex_);
    Worker& worker = workers_.at(slot);
    if (worker.paused > 0) worker.paused--;
  }
  work_ready_.notify_all();
}

void Scheduler::ReplaceStuckLoad(size_t slot) {
  // At once, from the loading thread: the stuck call holds the slot's Lease until the fresh
  // copy is in, so nothing else can take the old copy meanwhile.
  const Status started = manager_.Abandon(slot);
  {
    std::lock_guard lock(mutex_);
    Worker& worker = workers_.at(slot);
    // The old copy held the slot's models: the fresh one holds none until the worker loads
    // them (RepairSlot). The worker is still paused, so it runs none of them meanwhile.
    for (auto& [key, queue] : queues_) {
      if (!queue->held_by[slot]) continue;
      queue->held_by[slot] = false;
      queue->missing_in[slot] = true;
    }
    // Should the fresh copy not have started, the worker retries, with the usual backoff.
    worker.needs_fresh_copy = !started.ok();
    worker.failed_attempts = started.ok() ? 0 : 1;
    worker.retry_at = Clock::now();
    if (worker.paused > 0) worker.paused--;
    abandoned_running_++;
    if (observer_ != nullptr) {
      observer_->OnAbandonedCopies(static_cast<int64_t>(abandoned_running_));
      ReportRecovering();
    }
  }
  if (started.ok()) {
    if (observer_ != nullptr) observer_->OnCopyReplaced(slot);
  } else {
    Log(LogLevel::kError,
        "replacing an interpreter copy stuck in a load failed; the slot serves nothing until a "
        "retry works",
        {{"copy", std::to_string(slot), false}, {"error", started.message()}});
  }
  work_ready_.notify_all();
}

void Scheduler::StuckLoadReturned() {
  std::lock_guard lock(mutex_);
  if (abandoned_running_ > 0) abandoned_running_--;
  if (observer_ != nullptr) observer_->OnAbandonedCopies(static_cast<int64_t>(abandoned_running_));
}

void Scheduler::Answer(Batch& batch, const Status& error, const InferTimings& timings) {
  if (batch.answered.exchange(true)) return;
  for (InferJob& job : batch.jobs) job.done(error, timings);
}

bool Scheduler::Run(size_t slot, uint64_t generation, ModelQueue& queue,
                    std::vector<InferJob> jobs) {
  const Clock::time_point start = Clock::now();
  // Requests whose deadline passed in the queue are answered without running.
  auto batch = std::make_shared<Batch>();
  batch->started = start;
  std::optional<Clock::time_point> deadline;
  for (InferJob& job : jobs) {
    const bool skipped =
        (job.abandoned && job.abandoned()) || (job.deadline && *job.deadline <= start);
    if (skipped && job.sequence && job.sequence->call.end) {
      // Its copy frees the state before its next request (the end itself does not run).
      std::lock_guard lock(mutex_);
      queue.drops[slot].push_back(job.sequence->call.id);
    }
    if (skipped && job.sequence) {
      // A sequence this start would have opened has no state in its copy: it is not live.
      std::lock_guard lock(mutex_);
      CloseUnstartedSequence(queue, *job.sequence,
                             job.abandoned && job.abandoned()
                                 ? "the client disconnected before it ran"
                                 : "its deadline expired in the queue");
    }
    if (job.abandoned && job.abandoned()) {
      job.done(FailedPrecondition("the client disconnected before the request ran"),
               InferTimings{start - job.enqueued, {}, 0});
      continue;
    }
    if (job.deadline && *job.deadline <= start) {
      InferTimings timings{start - job.enqueued, {}, 0};
      job.done(
          DeadlineExceeded("the request's deadline expired after " +
                           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                              start - job.enqueued)
                                              .count()) +
                           " ms in the queue"),
          timings);
      continue;
    }
    if (job.deadline && (!deadline || *job.deadline < *deadline)) deadline = job.deadline;
    batch->jobs.push_back(std::move(job));
  }
  if (batch->jobs.empty()) return true;
  int64_t total_rows = 0;
  for (const InferJob& job : batch->jobs) total_rows += job.rows;

  Result<std::vector<NamedTensor>> inputs = Concatenate(batch->jobs);
  interpreters::InterpreterManager::Lease lease = manager_.AcquireSlot(slot);
  {
    std::lock_guard lock(mutex_);
    Worker& worker = workers_[slot];
    worker.queue = &queue;
    worker.batch = batch;
    worker.copy = lease.shared();
    worker.deadline = deadline;
    worker.interrupted = false;
    worker.unloading = false;
    worker.clients_gone = false;
    // Under the lock, as ReplaceStuckCopy's matching call is: an abandon cannot come between.
    if (observer_ != nullptr) observer_->OnCopyRunning(slot, true);
  }
  watch_.notify_all();
  // Held here: a model removed while this copy is stuck in it is destroyed only once the thread
  // comes back, if ever.
  const std::shared_ptr<interpreters::ReplicatedModel> model = queue.model;
  Result<std::vector<NamedTensor>> outputs = inputs.status();
  interpreters::PredictTimings predict;
  const Clock::time_point predicting = Clock::now();
  if (inputs.ok()) {
    // Named in the crash record if the model's code takes the process down.
    const ScopedCrashContext crash_context(model->key(), static_cast<int>(slot), "predict",
                                           lease->python_stack_writer());
    const std::optional<SequenceStep>& sequence = batch->jobs.front().sequence;
    outputs = model->PredictIn(*lease, *inputs, batch->jobs.front().parameters, &predict,
                               sequence ? &sequence->call : nullptr);
  }
  const Clock::time_point predicted = Clock::now();
  bool interrupted = false;
  bool unloading = false;
  bool clients_gone = false;
  {
    std::lock_guard lock(mutex_);
    Worker& worker = workers_[slot];
    if (worker.generation != generation) return false;  // abandoned: the watchdog answered
    interrupted = worker.interrupted;
    unloading = worker.unloading;
    clients_gone = worker.clients_gone;
    worker.unloading = false;
    worker.batch.reset();
    worker.copy.reset();
    worker.deadline.reset();
    worker.queue = nullptr;
  }
  // Each request's outputs, split from the batch's (and their rows checked) before any answer
  // goes out, so that the batch's compute_output covers them.
  const bool ok = outputs.ok();
  // The batch's error, for every request when there are no outputs (read before they move).
  const Status failed = ok ? Status::Ok() : outputs.status();
  std::vector<Result<std::vector<NamedTensor>>> answers;
  if (ok) {
    answers.reserve(batch->jobs.size());
    if (batch->jobs.size() == 1) {
      Status rows = queue.batching.max_batch_size > 0
                        ? CheckRows(*outputs, batch->jobs.front().rows)
                        : Status::Ok();
      answers.push_back(rows.ok() ? std::move(outputs) : Result<std::vector<NamedTensor>>(rows));
    } else {
      int64_t start_row = 0;
      for (const InferJob& job : batch->jobs) {
        answers.push_back(Slice(*outputs, start_row, job.rows, total_rows));
        start_row += job.rows;
      }
    }
  }
  const Clock::time_point end = Clock::now();
  // Before predict() (concatenating, taking the copy) counts as input; from its return to the
  // answers (the worker's bookkeeping, splitting) as output: the three add up to end - start.
  BatchTimings ran;
  ran.input = (predicting - start) + predict.input;
  ran.infer = (predicted - predicting) - predict.input - predict.output;
  ran.output = predict.output + (end - predicted);
  if (observer_ != nullptr) {
    observer_->OnCopyRunning(slot, false);
    observer_->OnBatch(queue.model->key(), total_rows, static_cast<int64_t>(batch->jobs.size()),
                       ran, ok);
    observer_->OnCopyBusy(slot, end - start);
  }
  if (unloading && !ok) {
    Answer(*batch,
           Unavailable("model " + queue.model->key() +
                       " was unloaded while the request ran: it did not finish within the unload "
                       "grace period and was interrupted"),
           InferTimings{{}, end - start, total_rows});
    return true;
  }
  if (clients_gone && !ok) {
    Answer(*batch, ClientsGone(predicted - start), InferTimings{{}, end - start, total_rows});
    return true;
  }
  if (interrupted && !ok) {
    InferTimings timings{{}, end - start, total_rows};
    Answer(
        *batch,
        DeadlineExceeded(
            "the request ran past its deadline and was interrupted after " +
            std::to_string(
                std::chrono::duration_cast<std::chrono::milliseconds>(predicted - start).count()) +
            " ms of execution"),
        timings);
    return true;
  }
  if (batch->answered.exchange(true)) return true;
  for (size_t i = 0; i < batch->jobs.size(); ++i) {
    InferJob& job = batch->jobs[i];
    InferTimings timings{start - job.enqueued, end - start, total_rows};
    if (!ok) {
      job.done(failed, timings);
    } else {
      job.done(std::move(answers[i]), timings);
    }
  }
  return true;
}

bool Scheduler::AllClientsGone(const Batch& batch) {
  for (const InferJob& job : batch.jobs) {
    if (!job.abandoned || !job.abandoned()) return false;
  }
  return !batch.jobs.empty();
}

Status Scheduler::ClientsGone(Clock::duration ran) {
  return FailedPrecondition(
      "the client disconnected while the request ran; it was interrupted after " +
      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(ran).count()) +
      " ms of execution");
}

void Scheduler::Watch() {
  // How often running batches are checked for clients that hung up: a hang-up is noticed by the
  // transport at once, and a copy should not run much longer for nobody.
  constexpr auto kHangUpCheck = std::chrono::milliseconds(100);
  // A call of a stream whose client left that runs this long is interrupted.
  constexpr auto kStuckStreamCall = std::chrono::seconds(1);
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    const Clock::time_point now = Clock::now();
    Clock::time_point next = now + std::chrono::seconds(1);
    for (size_t slot = 0; slot < workers_.size(); ++slot) {
      Worker& worker = workers_[slot];
      if (worker.between_calls) continue;  // streams: their worker watches them itself
      if (worker.reloading != nullptr && worker.deadline) {
        // LoadInto interrupts the load at the deadline itself; past the grace, it is stuck.
        if (now >= *worker.deadline + execution_grace_) {
          ReplaceStuckReload(lock, slot);
        } else {
          next = std::min(next, *worker.deadline + execution_grace_);
        }
        continue;
      }
      if (worker.batch && !worker.interrupted) {
        // A stream's call is left to return (its generator is then closed at its yield)
        // unless it is stuck in the call.
        const bool streams = worker.queue != nullptr && worker.queue->batching.streaming;
        if (AllClientsGone(*worker.batch) &&
            (!streams || now - worker.call_started >= kStuckStreamCall)) {
          // As at a deadline, from now: interrupted, and replaced if it does not stop.
          worker.interrupted = true;
          worker.clients_gone = true;
          worker.deadline = now;
          Interrupt(worker);
        } else {
          next = std::min(next, now + kHangUpCheck);
        }
      }
      if (!worker.batch || !worker.deadline) continue;
      if (!worker.interrupted) {
        if (now >= *worker.deadline) {
          worker.interrupted = true;
          Interrupt(worker);
          next = std::min(next, *worker.deadline + execution_grace_);
        } else {
          next = std::min(next, *worker.deadline);
        }
      } else if (now >= *worker.deadline + execution_grace_) {
        if (worker.clients_gone) {
          ReplaceStuckCopy(lock, slot,
                           FailedPrecondition("the client disconnected while the request ran, "
                                              "and it did not stop within the grace period of " +
                                              std::to_string(execution_grace_.count()) +
                                              " ms; its interpreter copy was replaced"));
          continue;
        }
        ReplaceStuckCopy(
            lock, slot,
            DeadlineExceeded(
                "the request ran past its deadline and did not stop within the grace period "
                "of " +
                std::to_string(execution_grace_.count()) +
                " ms; its interpreter copy was replaced"));
      } else {
        next = std::min(next, *worker.deadline + execution_grace_);
      }
    }
    next = std::min(next, ExpireSequences(now));
    watch_.wait_until(lock, next);
  }
}

void Scheduler::Interrupt(Worker& worker) {
  // On a thread of its own, so that neither the watchdog nor an unload waits on a copy.
  try {
    std::thread([copy = worker.copy] { (void)copy->Interrupt(); }).detach();
  } catch (const std::system_error&) {
    // No thread to be had (model code's threads fill the process's limit): the copy is
    // replaced after the grace, as one that ignores an interrupt is.
  }
}

void Scheduler::ReplaceStuckCopy(std::unique_lock<std::mutex>& lock, size_t slot,
                                 const Status& answer, const ModelQueue* leaving) {
  Worker& worker = workers_[slot];
  std::shared_ptr<Batch> batch = std::move(worker.batch);
  ModelQueue* queue = worker.queue;
  const bool streams = queue != nullptr && queue->batching.streaming && batch;
  if (streams) {
    queue->live_streams -= static_cast<int64_t>(batch->jobs.size());
    if (observer_ != nullptr) observer_->OnLiveStreams(queue->model->key(), queue->live_streams);
  }
  LeaveStuckWorker(slot);
  std::vector<std::pair<InferJob, Status>> lost;
  LoseSequences(slot, answer.message(), lost);
  // Its thread returns early, if ever, without ending the batch for the observer.
  if (observer_ != nullptr) observer_->OnCopyRunning(slot, false);
  if (queue != nullptr) queue->running--;
  idle_.notify_all();
  // The stuck thread cannot be stopped, only left: past the cap, the model whose code it is
  // stuck in gets no more copies to get stuck in. The copy is still replaced, so that the other
  // models keep their capacity (and a load into the slot does not wait on the stuck thread).
  std::vector<InferJob> refused;
  const bool unavailable_now = queue != nullptr && queue != leaving &&
                               abandoned_running_ >= max_abandoned_copies_ &&
                               queue->unavailable.empty();
  if (unavailable_now) {
    queue->unavailable = "model " + queue->model->key() +
                         " is unavailable: " + std::to_string(abandoned_running_) +
                         " interpreter copies are abandoned while stuck (the limit is "
                         "models.max_abandoned_copies = " +
                         std::to_string(max_abandoned_copies_) +
                         "), the last in this model's code; unload and load it, or deploy "
                         "another version";
    refused.assign(std::make_move_iterator(queue->jobs.begin()),
                   std::make_move_iterator(queue->jobs.end()));
    queue->jobs.clear();
    if (observer_ != nullptr) observer_->OnQueueDepth(queue->model->key(), 0);
  }
  const std::string unavailable = queue != nullptr ? queue->unavailable : std::string();
  const std::string model_key = queue != nullptr ? queue->model->key() : std::string();
  StartReplacementWorker(slot, leaving);
  lock.unlock();
  const Clock::time_point now = Clock::now();
  InferTimings timings{{}, now - batch->started, 0};
  int64_t rows = 0;
  for (const InferJob& job : batch->jobs) rows += job.rows;
  // The batch ran until now, as far as the copy's busy time and the batch sizes go: counted as
  // a failed batch, as its stuck thread will never report it.
  if (observer_ != nullptr) {
    BatchTimings ran;
    ran.infer = now - batch->started;
    observer_->OnBatch(model_key, rows, static_cast<int64_t>(batch->jobs.size()), ran, false);
    observer_->OnCopyBusy(slot, now - batch->started);
    // The live streams end here too: their stuck thread will never retire them.
    for (const InferJob& job : batch->jobs) {
      if (!streams) break;
      StreamEnd end = StreamEnd::kDeadline;
      if (job.abandoned && job.abandoned()) {
        end = StreamEnd::kCancelled;
      } else if (leaving != nullptr) {
        end = StreamEnd::kUnloaded;
      }
      observer_->OnStreamEnded(model_key, end);
    }
  }
  Answer(*batch, answer, timings);
  if (unavailable_now && observer_ != nullptr) {
    observer_->OnModelUnavailable(model_key, unavailable);
  }
  for (InferJob& job : refused) {
    job.done(Unavailable(unavailable), InferTimings{now - job.enqueued, {}, 0});
  }
  for (auto& [job, refusal] : lost) job.done(refusal, InferTimings{now - job.enqueued, {}, 0});
  lock.lock();
}

void Scheduler::LeaveStuckWorker(size_t slot) {
  Worker& worker = workers_[slot];
  worker.generation++;
  worker.busy = false;  // the stuck thread is no longer the slot's worker
  worker.between_calls = false;
  worker.copy.reset();
  worker.deadline.reset();
  worker.queue = nullptr;
  worker.reloading = nullptr;
  worker.thread.detach();  // it may never come back from the copy
  abandoned_running_++;
  if (observer_ != nullptr) observer_->OnAbandonedCopies(static_cast<int64_t>(abandoned_running_));
}

void Scheduler::ReplaceStuckReload(std::unique_lock<std::mutex>& lock, size_t slot) {
  Worker& worker = workers_[slot];
  ModelQueue& queue = *worker.reloading;
  const std::chrono::milliseconds timeout = queue.model->load_timeout();
  LeaveStuckWorker(slot);
  queue.running--;  // as LoadMissingModel would have, so that an unload waits for nothing
  idle_.notify_all();
  queue.missing_in[slot] = false;  // not loaded here again: see the header
  queue.load_error =
      "its __init__ did not return within the load timeout of " + std::to_string(timeout.count()) +
      " ms and the grace of " + std::to_string(execution_grace_.count()) +
      " ms when reloaded into the replacement of interpreter copy " + std::to_string(slot) +
      " (stuck where the interrupt does not reach, in C code); that copy was "
      "replaced in turn, and the model is not loaded into it again: load it "
      "explicitly or deploy another version";
  Log(LogLevel::kError,
      "reloading a model got stuck past the load timeout; its copy was replaced without it",
      {{"copy", std::to_string(slot), false},
       {"model", queue.model->key()},
       {"load_timeout_ms", std::to_string(timeout.count()), false}});
  StartReplacementWorker(slot, &queue);
  if (observer_ != nullptr) ReportRecovering();
  if (CopyAvailability(queue).ok()) return;
  // No copy holds it any more: its queued requests would wait for nothing.
  std::vector<InferJob> refused(std::make_move_iterator(queue.jobs.begin()),
                                std::make_move_iterator(queue.jobs.end()));
  queue.jobs.clear();
  if (observer_ != nullptr) observer_->OnQueueDepth(queue.model->key(), 0);
  const Status refusal = CopyAvailability(queue);
  lock.unlock();
  const Clock::time_point now = Clock::now();
  for (InferJob& job : refused) job.done(refusal, InferTimings{now - job.enqueued, {}, 0});
  lock.lock();
}

void Scheduler::StartReplacementWorker(size_t slot, const ModelQueue* leaving) {
  // The fresh copy holds nothing until the slot's models are loaded into it again (all but
  // `leaving`); the new worker does that first, see RepairSlot.
  for (auto& [key, candidate] : queues_) {
    if (!candidate->held_by[slot]) continue;
    candidate->held_by[slot] = false;
    candidate->missing_in[slot] = candidate.get() != leaving;
  }
  Worker& worker = workers_[slot];
  worker.needs_fresh_copy = true;
  worker.failed_attempts = 0;
  worker.retry_at = Clock::now();
  worker.exited = false;
  const uint64_t generation = worker.generation;
  worker.thread = std::thread([this, slot, generation] { WorkThenExit(slot, generation); });
}

bool Scheduler::NeedsRepair(size_t slot) const {
  if (workers_[slot].needs_fresh_copy) return true;
  return std::any_of(queues_.begin(), queues_.end(), [slot](const auto& entry) {
    return entry.second->missing_in[slot] && !entry.second->closing;
  });
}

std::chrono::milliseconds Scheduler::BackOff(Worker& worker) {
  std::chrono::milliseconds wait = replacement_retry_.first;
  for (int doubled = 0; doubled < worker.failed_attempts && wait < replacement_retry_.longest;
       ++doubled) {
    wait *= 2;
  }
  wait = std::min(wait, replacement_retry_.longest);
  worker.failed_attempts++;
  worker.retry_at = Clock::now() + wait;
  return wait;
}

void Scheduler::ReportRecovering() {
  if (observer_ == nullptr) return;
  int64_t without_copy = 0;
  int64_t missing_models = 0;
  for (size_t slot = 0; slot < workers_.size(); ++slot) {
    const Worker& worker = workers_[slot];
    // A replacement under way for the first time is not a failure yet.
    if (worker.failed_attempts == 0) continue;
    if (worker.needs_fresh_copy) {
      without_copy++;
    } else if (NeedsRepair(slot)) {
      missing_models++;
    }
  }
  observer_->OnCopiesRecovering(without_copy, missing_models);
}

void Scheduler::RepairSlot(std::unique_lock<std::mutex>& lock, size_t slot, uint64_t generation) {
  Worker& worker = workers_[slot];
  if (worker.needs_fresh_copy) {
    lock.unlock();
    const Status started = manager_.Abandon(slot);
    lock.lock();
    if (worker.generation != generation) return;  // left behind by Stop meanwhile
    if (!started.ok()) {
      const std::chrono::milliseconds wait = BackOff(worker);
      ReportRecovering();
      Log(LogLevel::kError,
          "replacing a stuck interpreter copy failed; the slot serves nothing until a retry "
          "works",
          {{"copy", std::to_string(slot), false},
           {"attempt", std::to_string(worker.failed_attempts), false},
           {"retry_in_ms", std::to_string(wait.count()), false},
           {"error", started.message()}});
      return;
    }
    worker.needs_fresh_copy = false;
    if (observer_ != nullptr) observer_->OnCopyReplaced(slot);
  }
  // Keys, not pointers: the lock is let go during each load, and models come and go meanwhile.
  std::vector<std::string> missing;
  for (const auto& [key, queue] : queues_) {
    if (queue->missing_in[slot] && !queue->closing) missing.push_back(key);
  }
  std::vector<std::string> failed;
  std::vector<InferJob> refused;
  std::string refused_reason;
  for (const std::string& key : missing) {
    auto found = queues_.find(key);
    if (found == queues_.end() || !found->second->missing_in[slot] || found->second->closing) {
      continue;
    }
    ModelQueue& queue = *found->second;
    const size_t refused_before = refused.size();
    const bool loaded = LoadMissingModel(lock, slot, generation, queue, refused);
    if (worker.generation != generation) return;  // left to a stuck load, or behind by Stop
    if (!loaded) failed.push_back(key);
    if (refused.size() > refused_before) refused_reason = CopyAvailability(queue).message();
  }
  if (!failed.empty()) {
    const std::chrono::milliseconds wait = BackOff(worker);
    for (const std::string& key : failed) {
      auto found = queues_.find(key);
      Log(LogLevel::kError,
          "loading a model into the replacement of a stuck interpreter copy failed; the copy "
          "serves its other models until a retry works",
          {{"copy", std::to_string(slot), false},
           {"model", key},
           {"attempt", std::to_string(worker.failed_attempts), false},
           {"retry_in_ms", std::to_string(wait.count()), false},
           {"error", found != queues_.end() ? found->second->load_error : std::string()}});
    }
  } else if (worker.failed_attempts > 0) {
    Log(LogLevel::kInfo, "the replacement of a stuck interpreter copy recovered",
        {{"copy", std::to_string(slot), false},
         {"failed_attempts", std::to_string(worker.failed_attempts), false}});
    worker.failed_attempts = 0;
  }
  ReportRecovering();
  work_ready_.notify_all();
  if (refused.empty()) return;
  lock.unlock();
  const Clock::time_point now = Clock::now();
  for (InferJob& job : refused) {
    job.done(Unavailable(refused_reason), InferTimings{now - job.enqueued, {}, 0});
  }
  lock.lock();
}

bool Scheduler::LoadMissingModel(std::unique_lock<std::mutex>& lock, size_t slot,
                                 uint64_t generation, ModelQueue& queue,
                                 std::vector<InferJob>& refused) {
  // RemoveModel waits while running > 0, so the queue outlives the load, and the model is
  // never unloaded while it is being loaded again here.
  queue.running++;
  const std::shared_ptr<interpreters::ReplicatedModel> model = queue.model;
  Worker& worker = workers_[slot];
  if (model->load_timeout().count() > 0) {
    worker.reloading = &queue;
    worker.deadline = Clock::now() + model->load_timeout();
    watch_.notify_all();
  }
  lock.unlock();
  const Status loaded = model->LoadInto(slot);
  lock.lock();
  if (worker.generation != generation) {
    // Left to its stuck load by ReplaceStuckReload, which did this thread's accounts for the
    // queue (which may be gone by now); it has returned at last and no longer burns a core.
    if (abandoned_running_ > 0) abandoned_running_--;
    if (observer_ != nullptr) {
      observer_->OnAbandonedCopies(static_cast<int64_t>(abandoned_running_));
    }
    return false;
  }
  worker.reloading = nullptr;
  worker.deadline.reset();
  queue.running--;
  idle_.notify_all();
  if (loaded.ok()) {
    queue.missing_in[slot] = false;
    queue.held_by[slot] = true;
    queue.load_error.clear();
    return true;
  }
  queue.load_error = loaded.message();
  // With no copy left to run them, the queued requests would wait for a retry that may never
  // work; new ones are refused from now on (Submit, CopyAvailability).
  if (!CopyAvailability(queue).ok()) {
    refused.insert(refused.end(), std::make_move_iterator(queue.jobs.begin()),
                   std::make_move_iterator(queue.jobs.end()));
    if (!queue.jobs.empty() && observer_ != nullptr) observer_->OnQueueDepth(queue.model->key(), 0);
    queue.jobs.clear();
  }
  return false;
}

}  // namespace orochi::server

#include "scheduler.h"

#include <algorithm>
#include <utility>

#include "log.h"
#include "orochi/engine/ops.h"

namespace orochi::server {
namespace {

using interpreters::BytesTensor;
using interpreters::NamedTensor;

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
                     SchedulerObserver* observer)
    : manager_(manager),
      max_queue_size_(max_queue_size),
      execution_grace_(execution_grace),
      max_abandoned_copies_(max_abandoned_copies),
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
    auto drained = [&] { return stopping_ || (queue->running == 0 && queue->jobs.empty()); };
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
    removed = std::move(found->second);
    queues_.erase(found);
  }
  for (InferJob& job : removed->jobs) refused.push_back(std::move(job));  // only when stopping
  for (InferJob& job : refused) {
    job.done(Unavailable("model " + key + " was unloaded before the request ran"),
             InferTimings{Clock::now() - job.enqueued, {}, 0});
  }
  return abandoned;
}

std::string Scheduler::UnavailableReason(std::string_view model_key) const {
  std::lock_guard lock(mutex_);
  auto found = queues_.find(model_key);
  return found != queues_.end() ? found->second->unavailable : std::string();
}

Status Scheduler::Submit(const std::string& model_key, InferJob job) {
  std::lock_guard lock(mutex_);
  if (stopping_) return Unavailable("the server is shutting down");
  auto found = queues_.find(model_key);
  if (found == queues_.end()) return NotFound("model " + model_key + " is not loaded");
  ModelQueue& queue = *found->second;
  if (queue.closing) return Unavailable("model " + model_key + " is being unloaded");
  if (!queue.unavailable.empty()) return Unavailable(queue.unavailable);
  if (queue.jobs.size() >= max_queue_size_) {
    return Status(StatusCode::kResourceExhausted, "the queue of model " + model_key + " is full (" +
                                                      std::to_string(max_queue_size_) +
                                                      " waiting requests); retry later");
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
      worker.queue = nullptr;
      worker.thread.detach();
    }
    if (watchdog_.joinable()) threads.push_back(std::move(watchdog_));
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
  for (auto& [key, queue] : queues_) {
    if (queue->jobs.empty() || !queue->held_by[slot]) continue;
    if (oldest == nullptr || queue->jobs.front().enqueued < oldest->jobs.front().enqueued) {
      oldest = queue.get();
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
          next.parameters != batch.front().parameters) {
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
  while (workers_[slot].generation == generation) {
    ModelQueue* queue = Pick(slot);
    if (queue == nullptr) {
      if (stopping_) return;
      work_ready_.wait(lock);
      continue;
    }
    std::vector<InferJob> batch = TakeBatch(lock, *queue);
    if (observer_ != nullptr) {
      observer_->OnQueueDepth(queue->model->key(), static_cast<int64_t>(queue->jobs.size()));
    }
    queue->running++;
    lock.unlock();
    const bool current = Run(slot, generation, *queue, std::move(batch));
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
    idle_.notify_all();
  }
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
    if (job.abandoned && job.abandoned()) {
      job.done(
          Status(StatusCode::kFailedPrecondition, "the client disconnected before the request ran"),
          InferTimings{start - job.enqueued, {}, 0});
      continue;
    }
    if (job.deadline && *job.deadline <= start) {
      InferTimings timings{start - job.enqueued, {}, 0};
      job.done(Status(StatusCode::kDeadlineExceeded,
                      "the request's deadline expired after " +
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
  }
  watch_.notify_all();
  if (observer_ != nullptr) observer_->OnCopyRunning(slot, true);
  // Held here: a model removed while this copy is stuck in it is destroyed only once the thread
  // comes back, if ever.
  const std::shared_ptr<interpreters::ReplicatedModel> model = queue.model;
  Result<std::vector<NamedTensor>> outputs =
      inputs.ok() ? model->PredictIn(*lease, *inputs, batch->jobs.front().parameters)
                  : inputs.status();
  const Clock::time_point end = Clock::now();
  bool interrupted = false;
  bool unloading = false;
  {
    std::lock_guard lock(mutex_);
    Worker& worker = workers_[slot];
    if (worker.generation != generation) return false;  // abandoned: the watchdog answered
    interrupted = worker.interrupted;
    unloading = worker.unloading;
    worker.unloading = false;
    worker.batch.reset();
    worker.copy.reset();
    worker.deadline.reset();
    worker.queue = nullptr;
  }
  if (observer_ != nullptr) {
    observer_->OnCopyRunning(slot, false);
    observer_->OnBatch(queue.model->key(), total_rows, static_cast<int64_t>(batch->jobs.size()),
                       end - start, outputs.ok());
    observer_->OnCopyBusy(slot, end - start);
  }
  if (unloading && !outputs.ok()) {
    Answer(*batch,
           Unavailable("model " + queue.model->key() +
                       " was unloaded while the request ran: it did not finish within the unload "
                       "grace period and was interrupted"),
           InferTimings{{}, end - start, total_rows});
    return true;
  }
  if (interrupted && !outputs.ok()) {
    InferTimings timings{{}, end - start, total_rows};
    Answer(
        *batch,
        Status(StatusCode::kDeadlineExceeded,
               "the request ran past its deadline and was interrupted after " +
                   std::to_string(
                       std::chrono::duration_cast<std::chrono::milliseconds>(end - start).count()) +
                   " ms of execution"),
        timings);
    return true;
  }
  if (batch->answered.exchange(true)) return true;
  int64_t start_row = 0;
  for (InferJob& job : batch->jobs) {
    InferTimings timings{start - job.enqueued, end - start, total_rows};
    if (!outputs.ok()) {
      job.done(outputs.status(), timings);
    } else if (batch->jobs.size() == 1) {
      Status rows =
          queue.batching.max_batch_size > 0 ? CheckRows(*outputs, job.rows) : Status::Ok();
      if (rows.ok()) {
        job.done(*outputs, timings);
      } else {
        job.done(rows, timings);
      }
    } else {
      job.done(Slice(*outputs, start_row, job.rows, total_rows), timings);
    }
    start_row += job.rows;
  }
  return true;
}

void Scheduler::Watch() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    const Clock::time_point now = Clock::now();
    Clock::time_point next = now + std::chrono::seconds(1);
    for (size_t slot = 0; slot < workers_.size(); ++slot) {
      Worker& worker = workers_[slot];
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
        ReplaceStuckCopy(
            lock, slot,
            Status(StatusCode::kDeadlineExceeded,
                   "the request ran past its deadline and did not stop within the grace period "
                   "of " +
                       std::to_string(execution_grace_.count()) +
                       " ms; its interpreter copy was replaced"));
      } else {
        next = std::min(next, *worker.deadline + execution_grace_);
      }
    }
    watch_.wait_until(lock, next);
  }
}

void Scheduler::Interrupt(Worker& worker) {
  // On a thread of its own, so that neither the watchdog nor an unload waits on a copy.
  std::thread([copy = worker.copy] { (void)copy->Interrupt(); }).detach();
}

void Scheduler::ReplaceStuckCopy(std::unique_lock<std::mutex>& lock, size_t slot,
                                 const Status& answer, const ModelQueue* leaving) {
  Worker& worker = workers_[slot];
  std::shared_ptr<Batch> batch = std::move(worker.batch);
  ModelQueue* queue = worker.queue;
  worker.generation++;
  worker.copy.reset();
  worker.deadline.reset();
  worker.queue = nullptr;
  worker.thread.detach();  // it may never come back from the copy
  if (queue != nullptr) queue->running--;
  idle_.notify_all();
  abandoned_running_++;
  if (observer_ != nullptr) observer_->OnAbandonedCopies(static_cast<int64_t>(abandoned_running_));
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
  const uint64_t generation = worker.generation;
  std::vector<std::shared_ptr<interpreters::ReplicatedModel>> held;
  for (auto& [key, candidate] : queues_) {
    if (candidate->held_by[slot] && candidate.get() != leaving) held.push_back(candidate->model);
  }
  // A fresh copy, with the same models, takes the slot; its worker starts when it is ready.
  worker.thread = std::thread([this, slot, generation, held = std::move(held)] {
    Status replaced = manager_.Abandon(slot);
    for (const auto& model : held) {
      if (replaced.ok()) replaced = model->LoadInto(slot);
    }
    if (observer_ != nullptr) observer_->OnCopyReplaced(slot, replaced);
    if (replaced.ok()) {
      WorkThenExit(slot, generation);
    } else {
      std::lock_guard lock(mutex_);
      if (workers_[slot].generation == generation) workers_[slot].exited = true;
      idle_.notify_all();
    }
  });
  lock.unlock();
  const Clock::time_point now = Clock::now();
  InferTimings timings{{}, now - batch->started, 0};
  Answer(*batch, answer, timings);
  if (unavailable_now && observer_ != nullptr) {
    observer_->OnModelUnavailable(model_key, unavailable);
  }
  for (InferJob& job : refused) {
    job.done(Unavailable(unavailable), InferTimings{now - job.enqueued, {}, 0});
  }
  lock.lock();
}

}  // namespace orochi::server

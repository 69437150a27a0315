// The scheduler's streams (streaming models): iteration-level scheduling of a copy's live
// sequences. See Scheduler::RunStreams.
#include <algorithm>
#include <utility>

#include "log.h"
#include "orochi/base/crash_record.h"
#include "scheduler.h"

namespace orochi::server {
namespace {

using interpreters::NamedTensor;
using interpreters::ReplicatedModel;

// How long a worker whose every live stream has a full buffer waits before it looks again at
// their deadlines and clients (a departed client does not signal the buffer).
constexpr auto kFullBufferRecheck = std::chrono::milliseconds(20);

int64_t Milliseconds(Clock::duration duration) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(duration).count();
}

// One live stream of a RunStreams, beside its job in the batch.
struct LiveStream {
  uint64_t id = 0;
  Clock::time_point admitted;
  Clock::time_point last_response;
  bool responded = false;
  std::optional<Clock::time_point> full_since;  // its buffer has been full since
};

}  // namespace

const char* StreamEndName(StreamEnd end) {
  switch (end) {
    case StreamEnd::kFinished:
      return "finished";
    case StreamEnd::kCancelled:
      return "cancelled";
    case StreamEnd::kDeadline:
      return "deadline";
    case StreamEnd::kUnloaded:
      return "unloaded";
    case StreamEnd::kStalled:
      return "stalled";
    case StreamEnd::kError:
      return "error";
  }
  return "error";
}

void Scheduler::SetStreamLimits(StreamLimits limits) {
  std::lock_guard lock(mutex_);
  stream_limits_ = limits;
}

bool Scheduler::RunStreams(size_t slot, uint64_t generation, ModelQueue& queue, InferJob first) {
  const std::shared_ptr<ReplicatedModel> model = queue.model;
  const std::string& key = model->key();
  interpreters::InterpreterManager::Lease lease = manager_.AcquireSlot(slot);
  auto batch = std::make_shared<Batch>();
  batch->started = Clock::now();
  std::vector<LiveStream> live;  // beside batch->jobs, in the same order
  StreamLimits limits;
  {
    std::lock_guard lock(mutex_);
    limits = stream_limits_;
    Worker& worker = workers_[slot];
    worker.queue = &queue;
    worker.batch = batch;
    worker.copy = lease.shared();
    worker.deadline.reset();
    worker.interrupted = false;
    worker.unloading = false;
    worker.clients_gone = false;
    worker.between_calls = true;
    if (observer_ != nullptr) observer_->OnCopyRunning(slot, true);
  }

  // Outcome of one call into the copy: whether this worker is still the slot's, and why the
  // call was interrupted if it was.
  struct Called {
    bool current = true;
    bool interrupted = false;
    bool clients_gone = false;
    bool unloading = false;
  };
  // Runs `call` in the copy with the watchdog armed at `deadline` (and watching the clients of
  // the live streams).
  auto call_in_copy = [&](std::optional<Clock::time_point> deadline, const auto& call) {
    {
      std::lock_guard lock(mutex_);
      Worker& worker = workers_[slot];
      worker.deadline = deadline;
      worker.interrupted = false;
      worker.clients_gone = false;
      worker.between_calls = false;
      worker.call_started = Clock::now();
    }
    watch_.notify_all();
    const ScopedCrashContext crash_context(key, static_cast<int>(slot), "stream");
    auto result = call();
    Called called;
    std::lock_guard lock(mutex_);
    Worker& worker = workers_[slot];
    if (worker.generation != generation) {
      called.current = false;  // abandoned: the watchdog answered the live streams
      return std::make_pair(std::move(result), called);
    }
    called.interrupted = worker.interrupted;
    called.clients_gone = worker.clients_gone;
    called.unloading = worker.unloading;
    worker.interrupted = false;
    worker.clients_gone = false;
    worker.deadline.reset();
    worker.between_calls = true;
    return std::make_pair(std::move(result), called);
  };
  // Why an interrupted call failed, for the streams it ran.
  auto interrupted_status = [&](const Called& called, const Status& error,
                                StreamEnd* end) -> Status {
    if (called.unloading) {
      *end = StreamEnd::kUnloaded;
      return Unavailable("model " + key + " was unloaded while the stream ran");
    }
    if (called.clients_gone) {
      *end = StreamEnd::kCancelled;
      return FailedPrecondition("the client disconnected while the stream ran");
    }
    if (called.interrupted) {
      *end = StreamEnd::kDeadline;
      return DeadlineExceeded("the stream ran past its deadline and was interrupted in its copy");
    }
    *end = StreamEnd::kError;
    return error;
  };
  // Ends live stream `index` (removed from the batch; the copy already knows when
  // `in_copy_done`), answering its job with `status`. False when the worker was superseded.
  auto end_stream = [&](size_t index, const Status& status, StreamEnd end, bool in_copy_done) {
    bool current = true;
    if (!in_copy_done) {
      const uint64_t id = live[index].id;
      // finish() or the generator's clean-up gets the execution grace, as an interrupt does.
      auto [closed, called] = call_in_copy(Clock::now() + execution_grace_,
                                           [&] { return model->StreamClose(*lease, id); });
      current = called.current;
      if (current && !closed.ok()) {
        Log(LogLevel::kWarning, "closing a stream in its copy failed",
            {{"model", key}, {"error", closed.message()}});
      }
    }
    if (!current) return false;
    InferJob job;
    const LiveStream stream = live[index];
    {
      std::lock_guard lock(mutex_);
      job = std::move(batch->jobs[index]);
      batch->jobs.erase(batch->jobs.begin() + static_cast<std::ptrdiff_t>(index));
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));
      queue.live_streams--;
      if (observer_ != nullptr) observer_->OnLiveStreams(key, queue.live_streams);
    }
    const Clock::time_point now = Clock::now();
    if (observer_ != nullptr) observer_->OnStreamEnded(key, end);
    job.done(status.ok() ? Result<std::vector<NamedTensor>>(std::vector<NamedTensor>())
                         : Result<std::vector<NamedTensor>>(status),
             InferTimings{stream.admitted - job.enqueued, now - stream.admitted, 1});
    return true;
  };
  auto deliver = [&](size_t index, std::vector<NamedTensor> outputs) {
    LiveStream& stream = live[index];
    const Clock::time_point now = Clock::now();
    const InferJob& job = batch->jobs[index];
    if (observer_ != nullptr) {
      observer_->OnStreamResponse(
          key, !stream.responded,
          stream.responded ? now - stream.last_response : now - job.enqueued);
    }
    stream.responded = true;
    stream.last_response = now;
    (void)job.stream->Push(std::move(outputs));  // a cancelled stream ends at the next look
  };

  std::vector<InferJob> pending;
  pending.push_back(std::move(first));
  while (true) {
    // Admit: open each pending stream in the copy (start(), or predict() made a generator).
    while (!pending.empty()) {
      InferJob job = std::move(pending.front());
      pending.erase(pending.begin());
      const Clock::time_point now = Clock::now();
      Status refused;
      StreamEnd end = StreamEnd::kError;
      if ((job.abandoned && job.abandoned()) || (job.stream && job.stream->cancelled())) {
        refused = FailedPrecondition("the client disconnected before the stream started");
        end = StreamEnd::kCancelled;
      } else if (job.deadline && *job.deadline <= now) {
        refused =
            DeadlineExceeded("the stream's deadline expired after " +
                             std::to_string(Milliseconds(now - job.enqueued)) + " ms in the queue");
        end = StreamEnd::kDeadline;
      }
      if (!refused.ok()) {
        if (observer_ != nullptr) observer_->OnStreamEnded(key, end);
        job.done(refused, InferTimings{now - job.enqueued, {}, 0});
        continue;
      }
      LiveStream stream;
      stream.id = next_stream_id_.fetch_add(1);
      stream.admitted = now;
      const std::optional<Clock::time_point> deadline = job.deadline;
      {
        std::lock_guard lock(mutex_);
        batch->jobs.push_back(std::move(job));
        live.push_back(stream);
        queue.live_streams++;
        if (observer_ != nullptr) observer_->OnLiveStreams(key, queue.live_streams);
      }
      const size_t index = live.size() - 1;
      auto [opened, called] = call_in_copy(deadline, [&] {
        return model->StreamOpen(*lease, stream.id, batch->jobs[index].inputs,
                                 batch->jobs[index].parameters);
      });
      if (!called.current) return false;
      if (!opened.ok()) {
        // A start() or predict() that raised opened nothing to close.
        StreamEnd failed = StreamEnd::kError;
        const Status status = interrupted_status(called, opened.status(), &failed);
        if (!end_stream(index, status, failed, /*in_copy_done=*/true)) return false;
        continue;
      }
      std::lock_guard lock(mutex_);
      queue.step_interface = *opened == ReplicatedModel::StreamKind::kStep;
    }
    // Admit more between steps, up to the model's live sequences per copy.
    {
      std::lock_guard lock(mutex_);
      const bool step = queue.step_interface.value_or(false);
      const size_t room =
          step ? static_cast<size_t>(std::max<int64_t>(queue.batching.max_live_sequences, 1)) : 1;
      while (live.size() + pending.size() < room && !queue.jobs.empty() && !stopping_) {
        pending.push_back(std::move(queue.jobs.front()));
        queue.jobs.pop_front();
      }
      if (!pending.empty() && observer_ != nullptr) {
        observer_->OnQueueDepth(key, static_cast<int64_t>(queue.jobs.size()));
      }
    }
    if (!pending.empty()) continue;
    if (live.empty()) break;

    // Retire the streams that end without a step: cancelled, past their deadline, stalled by
    // a full buffer, or whose model goes.
    bool unloading = false;
    bool stopping = false;
    {
      std::lock_guard lock(mutex_);
      unloading = workers_[slot].unloading;
      stopping = stopping_;
    }
    const Clock::time_point now = Clock::now();
    for (size_t index = live.size(); index-- > 0;) {
      const InferJob& job = batch->jobs[index];
      LiveStream& stream = live[index];
      const bool full = !job.stream->HasRoom();
      if (!full) {
        stream.full_since.reset();
      } else if (!stream.full_since) {
        stream.full_since = now;
      }
      Status status;
      StreamEnd end = StreamEnd::kError;
      if (unloading) {
        status = Unavailable("model " + key + " was unloaded while the stream ran");
        end = StreamEnd::kUnloaded;
      } else if (stopping) {
        status = Unavailable("the server is shutting down");
        end = StreamEnd::kUnloaded;
      } else if (job.stream->cancelled() || (job.abandoned && job.abandoned())) {
        status = FailedPrecondition("the client disconnected while the stream ran");
        end = StreamEnd::kCancelled;
      } else if (job.deadline && *job.deadline <= now) {
        status = DeadlineExceeded("the stream ran past its deadline after " +
                                  std::to_string(Milliseconds(now - stream.admitted)) + " ms");
        end = StreamEnd::kDeadline;
      } else if (stream.full_since && now - *stream.full_since >= limits.stall_timeout) {
        status = ResourceExhausted("the client read none of the stream's buffered responses for " +
                                   std::to_string(limits.stall_timeout.count()) +
                                   " ms (models.stream_stall_timeout_ms); the stream was ended");
        end = StreamEnd::kStalled;
      }
      if (status.ok()) continue;
      if (!end_stream(index, status, end, /*in_copy_done=*/false)) return false;
    }
    if (live.empty()) continue;

    // The streams whose buffers have room take the next step; the others wait for their
    // readers.
    std::vector<size_t> ready;
    std::optional<Clock::time_point> deadline;
    for (size_t index = 0; index < live.size(); ++index) {
      const InferJob& job = batch->jobs[index];
      if (!job.stream->HasRoom()) continue;
      ready.push_back(index);
      if (job.deadline && (!deadline || *job.deadline < *deadline)) deadline = job.deadline;
    }
    if (ready.empty()) {
      Clock::time_point until = Clock::now() + kFullBufferRecheck;
      (void)batch->jobs.front().stream->WaitForRoom(until);
      continue;
    }
    const bool step = queue.step_interface.value_or(false);
    if (!step) {
      const uint64_t id = live[ready.front()].id;
      auto [next, called] = call_in_copy(deadline, [&] { return model->StreamNext(*lease, id); });
      if (!called.current) return false;
      if (observer_ != nullptr) {
        observer_->OnBatch(key, 1, 1, BatchTimings{}, next.ok());
      }
      if (!next.ok()) {
        StreamEnd end = StreamEnd::kError;
        const Status status = interrupted_status(called, next.status(), &end);
        if (!end_stream(ready.front(), status, end, /*in_copy_done=*/true)) return false;
      } else if (!next->has_value()) {
        if (!end_stream(ready.front(), Status::Ok(), StreamEnd::kFinished, true)) return false;
      } else {
        deliver(ready.front(), std::move(**next));
      }
      continue;
    }
    std::vector<uint64_t> ids;
    ids.reserve(ready.size());
    for (size_t index : ready) ids.push_back(live[index].id);
    auto [stepped, called] = call_in_copy(deadline, [&] { return model->StreamStep(*lease, ids); });
    if (!called.current) return false;
    if (observer_ != nullptr) {
      observer_->OnBatch(key, static_cast<int64_t>(ids.size()), static_cast<int64_t>(ids.size()),
                         BatchTimings{}, stepped.ok());
    }
    // From the last: ending a stream moves the ones after it.
    for (size_t position = ready.size(); position-- > 0;) {
      const size_t index = ready[position];
      if (!stepped.ok()) {
        StreamEnd end = StreamEnd::kError;
        const Status status = interrupted_status(called, stepped.status(), &end);
        if (!end_stream(index, status, end, /*in_copy_done=*/true)) return false;
        continue;
      }
      ReplicatedModel::StepResult& result = (*stepped)[position];
      if (result.outputs) deliver(index, std::move(*result.outputs));
      if (!result.error.ok()) {
        if (!end_stream(index, result.error, StreamEnd::kError, true)) return false;
      } else if (result.finished) {
        if (!end_stream(index, Status::Ok(), StreamEnd::kFinished, true)) return false;
      }
    }
  }

  std::lock_guard lock(mutex_);
  Worker& worker = workers_[slot];
  if (worker.generation != generation) return false;
  worker.between_calls = false;
  worker.unloading = false;
  worker.batch.reset();
  worker.copy.reset();
  worker.deadline.reset();
  worker.queue = nullptr;
  if (observer_ != nullptr) observer_->OnCopyRunning(slot, false);
  return true;
}

}  // namespace orochi::server

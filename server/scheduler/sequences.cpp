// The scheduler's stateful models (Triton's sequence batcher): each request belongs to a
// sequence whose state lives in one copy. Submit admits a request to its sequence and pins it to
// that copy's slot; the slot's worker takes the slot's requests of the model in arrival order,
// one at a time, so a sequence's requests run in order and never overlap. A sequence is freed
// by its sequence_end, by the idle timeout (the watchdog), when its copy is replaced (its state
// went with the copy: its next request is refused, never run elsewhere), or with its model.
#include <algorithm>
#include <utility>

#include "scheduler.h"

namespace orochi::server {
namespace {

// At most this many gone sequences per model are remembered for their clear refusal (past it,
// the oldest are forgotten and their next request gets the plain "not live" refusal).
constexpr size_t kMaxGoneSequences = 4096;

std::string Milliseconds(std::chrono::milliseconds duration) {
  return std::to_string(duration.count()) + " ms";
}

}  // namespace

const char* SequenceEndName(SequenceEnd end) {
  switch (end) {
    case SequenceEnd::kEnded:
      return "end";
    case SequenceEnd::kRestarted:
      return "restarted";
    case SequenceEnd::kExpired:
      return "expired";
    case SequenceEnd::kLost:
      return "lost";
    case SequenceEnd::kUnloaded:
      return "unloaded";
    case SequenceEnd::kNeverStarted:
      return "never_started";
  }
  return "end";
}

void Scheduler::SetUnknownSequenceNote(std::string note) {
  std::lock_guard lock(mutex_);
  unknown_sequence_note_ = std::move(note);
}

Status Scheduler::AdmitSequenceStep(ModelQueue& queue, InferJob& job) {
  const std::string& key = queue.model->key();
  if (!job.sequence) {
    return InvalidArgument("model " + key +
                           " is stateful: each request names its sequence with sequence_id");
  }
  SequenceStep& step = *job.sequence;
  const std::string& id = step.call.id;
  const SequenceOptions& options = *queue.batching.sequences;
  auto live = queue.sequences.find(id);
  if (live == queue.sequences.end() && !step.call.start) {
    auto gone = queue.gone.find(id);
    if (gone != queue.gone.end()) {
      return InvalidArgument("sequence " + id + " of model " + key + " " + gone->second.why +
                             "; start it again with sequence_start");
    }
    std::string message = "sequence " + id + " of model " + key +
                          " is not live: a sequence begins with a request that sets "
                          "sequence_start, and ends with sequence_end or after " +
                          Milliseconds(options.idle_timeout) + " without a request";
    if (!unknown_sequence_note_.empty()) message += "; " + unknown_sequence_note_;
    return InvalidArgument(message);
  }
  if (live == queue.sequences.end()) {
    // A new sequence goes to the copy that holds the fewest.
    std::optional<size_t> chosen;
    for (size_t slot = 0; slot < queue.held_by.size(); ++slot) {
      if (!queue.held_by[slot] || queue.sequences_in[slot] >= options.max_per_copy) continue;
      if (!chosen || queue.sequences_in[slot] < queue.sequences_in[*chosen]) chosen = slot;
    }
    if (!chosen) {
      return ResourceExhausted("model " + key + " holds " + std::to_string(queue.sequences.size()) +
                               " live sequences, its limit of " +
                               std::to_string(options.max_per_copy) +
                               " on each of its copies (sequence.max_sequences_per_copy): end some "
                               "with sequence_end, or retry once idle ones expire");
    }
    LiveSequence added;
    added.slot = *chosen;
    added.incarnation = next_sequence_incarnation_++;
    live = queue.sequences.emplace(id, added).first;
    step.opened = true;
    queue.sequences_in[*chosen]++;
    queue.gone.erase(id);
    if (observer_ != nullptr) {
      observer_->OnLiveSequences(key, static_cast<int64_t>(queue.sequences.size()));
    }
  } else if (step.call.start && observer_ != nullptr) {
    // A start for a live id begins it again in its copy, as Triton's sequence batcher does.
    observer_->OnSequenceEnded(key, SequenceEnd::kRestarted);
  }
  step.slot = live->second.slot;
  step.incarnation = live->second.incarnation;
  live->second.pending++;
  // The request's answer makes the sequence idle again (whatever path answers it).
  job.done = [this, key, step, done = std::move(job.done)](
                 Result<std::vector<interpreters::NamedTensor>> outputs,
                 const InferTimings& timings) {
    SettleSequenceStep(key, step);
    done(std::move(outputs), timings);
  };
  // An end is taken at once: a later request of the id is refused or starts it anew, while
  // this one still runs in order in its copy, which frees the state after it.
  if (step.call.end) EndSequence(queue, live, SequenceEnd::kEnded, {});
  return Status::Ok();
}

void Scheduler::CloseUnstartedSequence(ModelQueue& queue, const SequenceStep& step,
                                       const std::string& why) {
  if (!step.call.start || !step.opened) return;  // a restart that did not run keeps the old state
  auto live = queue.sequences.find(step.call.id);
  if (live == queue.sequences.end() || live->second.incarnation != step.incarnation) return;
  EndSequence(queue, live, SequenceEnd::kNeverStarted,
              "never started: its sequence_start request did not run (" + why + ")");
}

void Scheduler::SettleSequenceStep(const std::string& model_key, const SequenceStep& step) {
  std::lock_guard lock(mutex_);
  auto queue = queues_.find(model_key);
  if (queue == queues_.end()) return;
  auto live = queue->second->sequences.find(step.call.id);
  if (live == queue->second->sequences.end() || live->second.incarnation != step.incarnation) {
    return;  // ended meanwhile
  }
  live->second.pending--;
  live->second.idle_since = Clock::now();
  watch_.notify_all();  // its expiry is due from now
}

void Scheduler::EndSequence(ModelQueue& queue, std::map<std::string, LiveSequence>::iterator live,
                            SequenceEnd end, const std::string& why) {
  queue.sequences_in[live->second.slot]--;
  if (!why.empty()) RememberGone(queue, live->first, why);
  queue.sequences.erase(live);
  if (observer_ != nullptr) {
    observer_->OnSequenceEnded(queue.model->key(), end);
    observer_->OnLiveSequences(queue.model->key(), static_cast<int64_t>(queue.sequences.size()));
  }
}

void Scheduler::RememberGone(ModelQueue& queue, const std::string& id, std::string why) {
  // Remembered for as long again as the idle timeout: long enough for a client that paused.
  const Clock::time_point forget_at = Clock::now() + queue.batching.sequences->idle_timeout;
  queue.gone[id] = GoneSequence{std::move(why), forget_at};
  queue.gone_order.emplace_back(forget_at, id);
  while (queue.gone.size() > kMaxGoneSequences && !queue.gone_order.empty()) {
    auto oldest = queue.gone.find(queue.gone_order.front().second);
    if (oldest != queue.gone.end() && oldest->second.forget_at == queue.gone_order.front().first) {
      queue.gone.erase(oldest);
    }
    queue.gone_order.pop_front();
  }
}

Clock::time_point Scheduler::ExpireSequences(Clock::time_point now) {
  Clock::time_point next = Clock::time_point::max();
  for (auto& [key, queue] : queues_) {
    if (!queue->batching.sequences) continue;
    const std::chrono::milliseconds timeout = queue->batching.sequences->idle_timeout;
    for (auto live = queue->sequences.begin(); live != queue->sequences.end();) {
      auto current = live++;
      if (current->second.pending > 0) continue;
      const Clock::time_point due = current->second.idle_since + timeout;
      if (due > now) {
        next = std::min(next, due);
        continue;
      }
      queue->drops[current->second.slot].push_back(current->first);
      EndSequence(*queue, current, SequenceEnd::kExpired,
                  "expired: it had no request for " + Milliseconds(timeout) +
                      " (the model's sequence idle timeout), and its state was freed");
      work_ready_.notify_all();  // its copy frees the state
    }
    while (!queue->gone_order.empty() && queue->gone_order.front().first <= now) {
      auto old = queue->gone.find(queue->gone_order.front().second);
      if (old != queue->gone.end() && old->second.forget_at <= now) queue->gone.erase(old);
      queue->gone_order.pop_front();
    }
    if (!queue->gone_order.empty()) next = std::min(next, queue->gone_order.front().first);
  }
  return next;
}

void Scheduler::LoseSequences(size_t slot, const std::string& why,
                              std::vector<std::pair<InferJob, Status>>& failed) {
  for (auto& [key, queue] : queues_) {
    if (!queue->batching.sequences) continue;
    queue->drops[slot].clear();  // the states went with the copy
    const std::string gone = "was lost: the interpreter copy that held its state was replaced (" +
                             why + "), and a sequence's state never moves to another copy";
    std::string lost = " of model " + key;
    lost += ' ';
    lost += gone;
    for (auto live = queue->sequences.begin(); live != queue->sequences.end();) {
      auto current = live++;
      if (current->second.slot == slot) {
        EndSequence(*queue, current, SequenceEnd::kLost, gone);
      }
    }
    // Their queued requests would run without their state: refused with the same words.
    for (auto job = queue->jobs.begin(); job != queue->jobs.end();) {
      if (job->sequence && job->sequence->slot == slot) {
        std::string refusal = "sequence " + job->sequence->call.id;
        refusal += lost;
        failed.emplace_back(std::move(*job), InvalidArgument(std::move(refusal)));
        job = queue->jobs.erase(job);
      } else {
        ++job;
      }
    }
    if (observer_ != nullptr) {
      observer_->OnQueueDepth(key, static_cast<int64_t>(queue->jobs.size()));
    }
  }
}

std::deque<InferJob>::iterator Scheduler::NextSequenceJob(ModelQueue& queue, size_t slot) {
  return std::find_if(queue.jobs.begin(), queue.jobs.end(), [slot](const InferJob& job) {
    return job.sequence && job.sequence->slot == slot;
  });
}

bool Scheduler::DropSequenceStates(std::unique_lock<std::mutex>& lock, size_t slot) {
  auto found = std::find_if(queues_.begin(), queues_.end(), [slot](const auto& entry) {
    return entry.second->batching.sequences && entry.second->held_by[slot] &&
           !entry.second->drops[slot].empty();
  });
  if (found == queues_.end()) return false;
  ModelQueue& queue = *found->second;
  std::vector<std::string> ids = std::move(queue.drops[slot]);
  queue.drops[slot].clear();
  queue.running++;  // the model stays loaded meanwhile
  Worker& worker = workers_[slot];
  worker.busy = true;
  const std::shared_ptr<interpreters::ReplicatedModel> model = queue.model;
  lock.unlock();
  {
    interpreters::InterpreterManager::Lease lease = manager_.AcquireSlot(slot);
    // Freeing dicts runs no model code but their objects' __del__; an error there is the
    // model's own and leaves nothing to answer.
    (void)model->DropSequences(*lease, ids);
  }
  lock.lock();
  queue.running--;
  worker.busy = false;
  idle_.notify_all();
  return true;
}

}  // namespace orochi::server

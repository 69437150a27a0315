// The scheduler: one worker thread per interpreter copy, a bounded queue per model, dynamic
// batching and deadlines.
//
// A worker takes the oldest waiting request among the models its copy holds. For a model with
// max_batch_size > 0 it keeps taking that model's requests (waiting up to max_queue_delay_us
// for more, stopping at a preferred batch size, or at a request whose parameters differ from
// the first's) until the batch is full, concatenates their
// inputs along dim 0, runs predict() once in its copy and splits the outputs back by rows.
// Requests whose deadline passes while queued are answered with kDeadlineExceeded and never
// run. A batch still running at its earliest deadline is interrupted inside its copy
// (TimeoutError in the model's Python code) and answered with kDeadlineExceeded; if the copy
// does not return within the execution grace period (stuck in C code), its requests are
// answered, the copy is abandoned and a fresh one, with the same models loaded, takes its
// place. A batch whose clients have all hung up is interrupted the same way (within about
// 100 ms of the last one going), so that nobody's abandoned request holds a copy. A replacement
// that fails (the fresh copy does not start, or a model does not load into it) is retried with
// a backoff; meanwhile the slot serves the models that did load.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "orochi/interpreters/interpreter_manager.h"
#include "orochi/interpreters/model.h"
#include "response_stream.h"

namespace orochi::server {

using Clock = std::chrono::steady_clock;

struct InferTimings {
  std::chrono::nanoseconds queue{0};
  std::chrono::nanoseconds compute{0};
  int64_t batch_rows = 0;  // rows of the batch the request ran in (1 request = its own rows)
};

// Where a batch's time in its copy's worker went (Triton's compute_input, compute_infer and
// compute_output); the three add up to the batch's time, from taking it to its answers.
struct BatchTimings {
  // Taking the batch, concatenating its requests' inputs along dim 0, and making them into
  // predict()'s arguments (interpreters::PredictTimings::input).
  std::chrono::nanoseconds input{0};
  // The model's predict() (interpreters::PredictTimings::infer).
  std::chrono::nanoseconds infer{0};
  // predict()'s result made into host tensors (interpreters::PredictTimings::output), then
  // split back into each request's rows, which are checked.
  std::chrono::nanoseconds output{0};
  std::chrono::nanoseconds total() const { return input + infer + output; }
};

// Called once per request, from a worker thread (or the submitting thread on refusal).
using InferDone =
    std::function<void(Result<std::vector<interpreters::NamedTensor>>, const InferTimings&)>;

// A request of a stateful model: the sequence it belongs to, whose state lives in one copy.
struct SequenceStep {
  interpreters::SequenceCall call;  // id, start, end
  size_t slot = 0;                  // set by Submit: the copy that holds the state
  uint64_t incarnation = 0;         // set by Submit: which life of the id it belongs to
  bool opened = false;              // set by Submit: this start made the id live (it was not)
};

struct InferJob {
  std::vector<interpreters::NamedTensor> inputs;
  // predict() takes one set of parameters per call, so only requests with equal parameters
  // are batched together.
  interpreters::RequestParameters parameters;
  int64_t rows = 0;  // the batch dim of every input; 0 for models that do not batch
  Clock::time_point enqueued = Clock::now();
  std::optional<Clock::time_point> deadline;
  // True once nobody waits for the answer any more (the client hung up): the job is skipped.
  std::function<bool()> abandoned;
  // For a streaming model: where its responses go as they come; `done` then ends the stream
  // (with no outputs on success). Set only for streaming models.
  std::shared_ptr<ResponseStream> stream;
  // For (and only for) a stateful model's request.
  std::optional<SequenceStep> sequence;
  InferDone done;
};

// A stateful model's sequences (the manifest's "sequence", with the server's defaults).
struct SequenceOptions {
  std::chrono::milliseconds idle_timeout{60000};
  int64_t max_per_copy = 256;
};

struct BatchingOptions {
  int64_t max_batch_size = 0;  // 0: requests run one by one
  std::chrono::microseconds max_queue_delay{0};
  std::vector<int64_t> preferred_batch_sizes;
  // A streaming model: each request is a stream (InferJob::stream), run by RunStreams.
  bool streaming = false;
  int64_t max_live_sequences = 16;  // step interface: sequences stepped together per copy
  // A stateful model: each request is a step of a sequence (InferJob::sequence).
  std::optional<SequenceOptions> sequences;
};

// How the scheduler treats streams (streaming models).
struct StreamLimits {
  size_t max_queued_streams = 64;  // per model; more are refused (kResourceExhausted)
  // A stream whose buffer stays full this long (its client reads nothing) is ended.
  std::chrono::milliseconds stall_timeout{30000};
};

// Why a stream ended, for metrics.
enum class StreamEnd { kFinished, kCancelled, kDeadline, kUnloaded, kStalled, kError };
const char* StreamEndName(StreamEnd end);

// Why a stateful model's sequence ended, for metrics: a request with sequence_end, a
// sequence_start for an id that was live, no request within the idle timeout, its copy replaced,
// its model unloaded, or the sequence_start that opened it answered without running.
enum class SequenceEnd { kEnded, kRestarted, kExpired, kLost, kUnloaded, kNeverStarted };
const char* SequenceEndName(SequenceEnd end);

// What the scheduler observes, for metrics and statistics.
class SchedulerObserver {
 public:
  virtual ~SchedulerObserver() = default;
  // A batch ran (its answers are about to go out).
  virtual void OnBatch(const std::string& model_key, int64_t rows, int64_t requests,
                       const BatchTimings& timings, bool ok) = 0;
  virtual void OnQueueDepth(const std::string& model_key, int64_t depth) = 0;
  virtual void OnCopyBusy(size_t slot, std::chrono::nanoseconds busy) = 0;
  // A copy starts (true) or ends (false) running a batch; a copy abandoned while running one
  // ends it when it is abandoned. Called with the scheduler's lock held: must not call back.
  virtual void OnCopyRunning(size_t slot, bool running) = 0;
  // A fresh copy took the place of the stuck one in `slot` (its models are loaded next).
  virtual void OnCopyReplaced(size_t slot) = 0;
  // Slots whose replacement failed and is being retried: `without_copy` have no fresh copy and
  // serve nothing, `missing_models` have one that serves without the models that failed to
  // load into it. Called with the scheduler's lock held: must not call back.
  virtual void OnCopiesRecovering(int64_t without_copy, int64_t missing_models) = 0;
  // Copies abandoned (replaced while stuck) whose thread still runs in them, burning CPU.
  virtual void OnAbandonedCopies(int64_t running) = 0;
  // The model takes no more requests: its code got copies stuck once too often.
  virtual void OnModelUnavailable(const std::string& model_key, const std::string& reason) = 0;
  // Streams: a response went to a stream's buffer, `since` its request was queued (the first)
  // or since its previous response.
  virtual void OnStreamResponse(const std::string& /*model_key*/, bool /*first*/,
                                std::chrono::nanoseconds /*since*/) {}
  // The sequences (streams) live in copies now for the model.
  virtual void OnLiveStreams(const std::string& /*model_key*/, int64_t /*live*/) {}
  virtual void OnStreamEnded(const std::string& /*model_key*/, StreamEnd /*end*/) {}
  // Stateful models: the sequences live now, and one that ended. Called with the scheduler's
  // lock held: must not call back.
  virtual void OnLiveSequences(const std::string& /*model_key*/, int64_t /*live*/) {}
  virtual void OnSequenceEnded(const std::string& /*model_key*/, SequenceEnd /*end*/) {}
};

// How a failed replacement of a stuck copy is retried: after `first`, then twice as long after
// each failure in a row, up to `longest`. Starting a copy and loading models costs seconds of
// CPU that the serving copies need, so retrying faster than about a second would make a lasting
// failure (memory short, a file gone) slow down the whole server; past a minute, a slot whose
// cause has gone away would stay empty for longer than an operator would wait for it.
struct RetryBackoff {
  std::chrono::milliseconds first{1000};
  std::chrono::milliseconds longest{60000};
};

class Scheduler {
 public:
  // `max_abandoned_copies`: once that many abandoned copies still run, a model that gets a
  // copy stuck is made unavailable (its queued requests are answered kUnavailable, new ones
  // refused) so that one model's stuck code cannot take every core.
  Scheduler(interpreters::InterpreterManager& manager, size_t max_queue_size,
            std::chrono::milliseconds execution_grace, size_t max_abandoned_copies,
            SchedulerObserver* observer, RetryBackoff replacement_retry = {});
  ~Scheduler();  // Stop()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Applies to streams queued from now on.
  void SetStreamLimits(StreamLimits limits);
  // Added to the refusal of a request for a sequence this scheduler never knew (no
  // sequence_start): why sequences may have gone without a trace, e.g. that the serving process
  // restarted after a crash.
  void SetUnknownSequenceNote(std::string note);

  // Starts taking requests for `model` (under model->key()). The model must stay loaded until
  // RemoveModel returns.
  void AddModel(std::shared_ptr<interpreters::ReplicatedModel> model, BatchingOptions batching);
  // Stops taking requests for the model (Submit answers kUnavailable), waits until its queued
  // and running requests are answered, then forgets it. With a `grace`, the wait is bounded:
  // past it, the requests still queued are answered kUnavailable and its running batches are
  // interrupted; a copy that has not returned within the execution grace after that is
  // abandoned and replaced, as a copy stuck past a request's deadline is (its batch answered
  // kUnavailable). Returns how many copies were abandoned.
  size_t RemoveModel(const std::string& key, std::optional<Clock::duration> grace = std::nullopt);

  // Queues `job`, taking it (moved from) when accepted; `job.done` is then called exactly once.
  // Refusals (unknown model, queue full, stopping) come back as the Status, `job` is left as it
  // was and `job.done` is not called.
  Status Submit(const std::string& model_key, InferJob& job);

  // Takes `slot`'s copy out of service until ResumeSlot: its worker finishes the batch it runs
  // (PauseSlot waits for that) and takes no more, so that the caller may hold the copy (to load
  // a model into it) while the other copies serve the queued requests. Pauses nest.
  void PauseSlot(size_t slot);
  void ResumeSlot(size_t slot);
  // In place of ResumeSlot, for a slot whose copy got stuck in a model's __init__ past the load
  // timeout (interpreters::LoadOptions::abandon): puts a fresh copy there at once (the stuck
  // thread keeps the old one), has the slot's worker load the slot's models into it, as after a
  // copy stuck in predict, and ends the pause. The copy counts as abandoned (see
  // max_abandoned_copies) until StuckLoadReturned.
  void ReplaceStuckLoad(size_t slot);
  // The call of a copy given up by ReplaceStuckLoad has returned at last.
  void StuckLoadReturned();

  // kUnavailable saying why the model takes no requests (see Observer::OnModelUnavailable, or no
  // copy holds it because loading it into the replacements of stuck copies failed); OK while it
  // does, or when it is not in the scheduler.
  Status Availability(std::string_view model_key) const;

  // Stops the workers after the queued requests are answered. A worker still running at
  // `deadline` is stuck (Python that never returns and no request deadline to interrupt it):
  // its batch is answered kUnavailable, it is logged with its model and copy, and its thread is
  // left behind. Returns how many were left behind; the process must then end without unloading
  // the copies (a thread still executes in one), e.g. with _exit.
  size_t Stop(std::optional<Clock::time_point> deadline = std::nullopt);

 private:
  struct LiveSequence {
    size_t slot = 0;
    uint64_t incarnation = 0;
    int64_t pending = 0;  // its requests queued or running
    Clock::time_point idle_since;
  };
  struct GoneSequence {
    std::string why;  // "expired: ...", "was lost: ..."
    Clock::time_point forget_at;
  };

  struct ModelQueue {
    std::shared_ptr<interpreters::ReplicatedModel> model;
    BatchingOptions batching;
    std::deque<InferJob> jobs;
    int running = 0;
    bool closing = false;       // being removed: takes no new requests
    std::string unavailable;    // why it takes no requests any more (see OnModelUnavailable)
    std::vector<bool> held_by;  // by slot: loaded in the slot's copy, which serves it
    // By slot: the model belongs in the slot but is not loaded in its copy, which replaced a
    // stuck one; held_by is false there until a load succeeds.
    std::vector<bool> missing_in;
    std::string load_error;  // why its last load into a replacement copy failed, until one works
    // Streaming models: whether the model has the step interface, once a stream has told
    // (until then one stream per copy at a time), and its sequences live in copies now.
    std::optional<bool> step_interface;
    int64_t live_streams = 0;
    // Stateful models: the live sequences by id, how many each slot holds, the ids that went
    // lately (why, for the refusal of their next request), and by slot the states to free in
    // the copy before its next request of the model.
    std::map<std::string, LiveSequence> sequences;
    std::vector<int64_t> sequences_in;
    std::map<std::string, GoneSequence> gone;
    std::deque<std::pair<Clock::time_point, std::string>> gone_order;  // by forget time
    std::vector<std::vector<std::string>> drops;
  };

  // A batch being run; answered once, by its worker or, if the copy is stuck, the watchdog.
  struct Batch {
    std::vector<InferJob> jobs;
    std::atomic<bool> answered{false};
    Clock::time_point started;
  };

  // One per copy. generation changes when the copy is abandoned; the worker thread that was
  // stuck in it then finds itself superseded and leaves without touching anything.
  struct Worker {
    uint64_t generation = 0;
    std::thread thread;
    ModelQueue* queue = nullptr;  // of the running batch
    std::shared_ptr<Batch> batch;
    std::shared_ptr<interpreters::Interpreter> copy;
    std::optional<Clock::time_point> deadline;
    bool interrupted = false;
    bool unloading = false;     // interrupted because its model is being removed, not a deadline
    bool clients_gone = false;  // interrupted because every client of its batch hung up
    bool busy = false;          // this generation has taken a batch and not finished it
    // Running streams, between two calls into the copy: nothing to interrupt, the worker
    // itself ends the streams whose deadline passed, whose clients went, or whose model goes.
    bool between_calls = false;
    Clock::time_point call_started;  // streams: the running call into the copy began
    int paused = 0;                  // PauseSlot calls not yet resumed: takes no work while > 0
    bool exited = false;  // the thread of this generation has returned: joining it is quick
    // After an abandon: the stuck copy is still in the slot until manager.Abandon succeeds.
    bool needs_fresh_copy = false;
    int failed_attempts = 0;     // repairs in a row that failed, for the backoff
    Clock::time_point retry_at;  // the next repair does not start before
    // The model RepairSlot is loading into the slot's fresh copy, whose load `deadline` is
    // watched as a batch's is (ReplaceStuckReload).
    ModelQueue* reloading = nullptr;
  };

  void Work(size_t slot, uint64_t generation);
  // Work, then marks the worker exited for Stop.
  void WorkThenExit(size_t slot, uint64_t generation);
  ModelQueue* Pick(size_t slot);
  std::vector<InferJob> TakeBatch(std::unique_lock<std::mutex>& lock, ModelQueue& queue);
  // Runs a batch; false when the worker was superseded meanwhile and must exit.
  bool Run(size_t slot, uint64_t generation, ModelQueue& queue, std::vector<InferJob> jobs);
  // Runs streams of a streaming model in `slot`'s copy, starting with `first`: a generator's
  // stream alone, or with the step interface up to max_live_sequences sequences stepped
  // together, admitting queued streams between steps, until none is left. False when the
  // worker was superseded meanwhile and must exit.
  bool RunStreams(size_t slot, uint64_t generation, ModelQueue& queue, InferJob first);
  void Watch();
  // Stateful models (sequences.cpp). Admits `job` to its sequence under the lock: the slot
  // that holds (or, for a start, will hold) its state, or why not.
  Status AdmitSequenceStep(ModelQueue& queue, InferJob& job);
  // The job's sequence is idle again once its answer goes out (called from `done`).
  void SettleSequenceStep(const std::string& model_key, const SequenceStep& step);
  // A start that opened its sequence and was answered without running (client gone, deadline):
  // the sequence, which has no state in its copy, ends; its next request is refused for `why`.
  void CloseUnstartedSequence(ModelQueue& queue, const SequenceStep& step, const std::string& why);
  // Ends a live sequence for `end`; `why` (not for kEnded/kRestarted) answers its next request.
  void EndSequence(ModelQueue& queue, std::map<std::string, LiveSequence>::iterator live,
                   SequenceEnd end, const std::string& why);
  void RememberGone(ModelQueue& queue, const std::string& id, std::string why);
  // Expires idle sequences and forgets old gone ones; returns when to look again.
  Clock::time_point ExpireSequences(Clock::time_point now);
  // Fails the sequences that `slot`'s copy held (it is being replaced): their queued requests
  // go to `failed` with their refusal.
  void LoseSequences(size_t slot, const std::string& why,
                     std::vector<std::pair<InferJob, Status>>& failed);
  // The oldest queued job for `slot` of a stateful model (its jobs target one slot each).
  static std::deque<InferJob>::iterator NextSequenceJob(ModelQueue& queue, size_t slot);
  // Frees states in `slot`'s copy that their sequences left behind; false when there were none.
  bool DropSequenceStates(std::unique_lock<std::mutex>& lock, size_t slot);
  // Interrupts the batch running on `slot` from a thread of its own (interrupting waits for
  // the copy's GIL, which a copy stuck in C never gives up).
  static void Interrupt(Worker& worker);
  // Abandons the copy on `slot`, whose batch is answered with `answer`, and starts a fresh one
  // with the models the slot holds except `leaving` (a model being removed). Unlocks `lock` for
  // a while.
  void ReplaceStuckCopy(std::unique_lock<std::mutex>& lock, size_t slot, const Status& answer,
                        const ModelQueue* leaving = nullptr);
  // Abandons the copy on `slot` whose worker is stuck reloading `worker.reloading` past the
  // load timeout and the grace (in C code, where the interrupt does not reach), and starts a
  // fresh one with the slot's other models: that model is not loaded into the slot again, so
  // that a model that always gets stuck there costs one copy, not one per retry. Unlocks
  // `lock` for a while.
  void ReplaceStuckReload(std::unique_lock<std::mutex>& lock, size_t slot);
  // Leaves `slot`'s worker thread to its stuck call: a new generation takes the slot, and the
  // thread counts as running an abandoned copy until it returns.
  void LeaveStuckWorker(size_t slot);
  // Starts the worker of a new generation on `slot`, whose copy was just abandoned: it first
  // puts a fresh copy there with the slot's models but `leaving` (RepairSlot), then serves.
  void StartReplacementWorker(size_t slot, const ModelQueue* leaving);
  // Whether `slot` still needs a fresh copy, or models loaded into it, after an abandon.
  bool NeedsRepair(size_t slot) const;
  // One attempt to complete the replacement in `slot`: a fresh copy if it has none yet, then
  // each missing model. What fails is logged and retried after the backoff; the slot serves
  // whatever did load meanwhile. Unlocks `lock` while a copy starts or a model loads.
  void RepairSlot(std::unique_lock<std::mutex>& lock, size_t slot, uint64_t generation);
  // Loads `queue`'s model into `slot`; the model is counted as running meanwhile so that
  // RemoveModel waits for the load. Requests refused because the model has no copy left are
  // added to `refused`. Unlocks `lock` while the model loads.
  // False too when the load got stuck and the worker of `generation` was left to it
  // (ReplaceStuckReload): the caller must then return without touching the slot.
  bool LoadMissingModel(std::unique_lock<std::mutex>& lock, size_t slot, uint64_t generation,
                        ModelQueue& queue, std::vector<InferJob>& refused);
  // Counts a failed repair of `slot` and sets when the next one starts; returns the wait.
  std::chrono::milliseconds BackOff(Worker& worker);
  // Tells the observer how many slots are recovering (see OnCopiesRecovering).
  void ReportRecovering();
  // kUnavailable when `queue` takes no requests for want of a copy, else OK.
  static Status CopyAvailability(const ModelQueue& queue);
  static void Answer(Batch& batch, const Status& error, const InferTimings& timings);
  // Whether every request of `batch` was abandoned by its client (see InferJob::abandoned).
  static bool AllClientsGone(const Batch& batch);
  // The answer, for the record, of a batch interrupted because its clients hung up.
  static Status ClientsGone(Clock::duration ran);

  interpreters::InterpreterManager& manager_;
  const size_t max_queue_size_;
  StreamLimits stream_limits_;  // guarded by mutex_
  std::atomic<uint64_t> next_stream_id_{1};
  uint64_t next_sequence_incarnation_ = 1;  // guarded by mutex_
  std::string unknown_sequence_note_;       // guarded by mutex_
  const std::chrono::milliseconds execution_grace_;
  const size_t max_abandoned_copies_;
  const RetryBackoff replacement_retry_;
  size_t abandoned_running_ = 0;  // abandoned copies whose thread has not come back
  SchedulerObserver* observer_;
  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable idle_;
  std::map<std::string, std::unique_ptr<ModelQueue>, std::less<>> queues_;
  std::condition_variable watch_;
  bool stopping_ = false;
  std::vector<Worker> workers_;
  std::thread watchdog_;
};

}  // namespace orochi::server

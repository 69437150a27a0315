// The scheduler after a copy gets stuck, on real interpreter copies: the abandoned copy's batch
// ends for the observer, its late output says where it comes from, a replacement that fails is
// retried while the slot serves what it can, and a copy stuck in C in a load is replaced too.
#include "scheduler/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "orochi/engine/tensor.h"
#include "orochi/interpreters/interpreter_manager.h"
#include "orochi/interpreters/model.h"

namespace orochi::server {
namespace {

using interpreters::InterpreterManager;
using interpreters::NamedTensor;
using interpreters::OutputSource;
using interpreters::ReplicatedModel;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

// Sleeps for x's sum in seconds. time.sleep ignores the scheduler's interrupt (an exception
// raised in the thread, seen only when Python code runs again), so a long sleep past a deadline
// gets the copy abandoned, and the call comes back later. Loading asks the test whether it may.
std::string ModelCode(const std::string& name) {
  return R"(
import time
import orochi

class Model:
    def __init__(self, context):
        orochi.call_host("load_gate", b")" +
         name + R"(")

    def predict(self, inputs):
        seconds = float(inputs["x"].sum())
        try:
            time.sleep(seconds)
        finally:
            if seconds > 0:
                print("back after", seconds)
        return {"y": inputs["x"]}
)";
}

std::string Manifest(const std::string& name) {
  return R"({"format_version": 1, "name": ")" + name +
         R"(", "version": 1, "entry": "model:Model",
             "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
             "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}]})";
}

// What the scheduler reported, for waiting on.
class RecordingObserver : public SchedulerObserver {
 public:
  struct Counts {
    int64_t busy = 0;
    int64_t replaced = 0;
    int64_t abandoned = 0;
    int64_t without_copy = 0;
    int64_t missing_models = 0;
  };

  void OnBatch(const std::string& /*model_key*/, int64_t /*rows*/, int64_t /*requests*/,
               const BatchTimings& /*timings*/, bool /*ok*/) override {}
  void OnQueueDepth(const std::string& /*model_key*/, int64_t /*depth*/) override {}
  void OnCopyBusy(size_t /*slot*/, std::chrono::nanoseconds /*busy*/) override {}
  void OnModelUnavailable(const std::string& /*model_key*/,
                          const std::string& /*reason*/) override {}
  void OnCopyRunning(size_t /*slot*/, bool running) override {
    Update([&](Counts& counts) { counts.busy += running ? 1 : -1; });
  }
  void OnCopyReplaced(size_t /*slot*/) override {
    Update([](Counts& counts) { counts.replaced++; });
  }
  void OnCopiesRecovering(int64_t without_copy, int64_t missing_models) override {
    Update([&](Counts& counts) {
      counts.without_copy = without_copy;
      counts.missing_models = missing_models;
    });
  }
  void OnAbandonedCopies(int64_t running) override {
    Update([&](Counts& counts) { counts.abandoned = running; });
  }

  Counts Now() {
    std::lock_guard lock(mutex_);
    return counts_;
  }
  // Whether `condition` held within 20 s.
  bool WaitFor(const std::function<bool(const Counts&)>& condition) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, 20s, [&] { return condition(counts_); });
  }

 private:
  void Update(const std::function<void(Counts&)>& change) {
    {
      std::lock_guard lock(mutex_);
      change(counts_);
    }
    changed_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  Counts counts_;
};

struct Output {
  OutputSource source;
  std::string text;
  std::string caller;
};

class SchedulerAfterAStuckCopy : public ::testing::Test {
 protected:
  void SetUp() override {
    interpreters::ManagerOptions options;
    options.copies = 1;
    options.host_functions["load_gate"] =
        [this](std::string_view model) -> Result<interpreters::Value> {
      std::unique_lock lock(mutex_);
      load_attempts_[std::string(model)]++;
      if (stalled_.contains(std::string(model))) {
        lock.unlock();
        // C code (this host function) that no interrupt reaches, then back after all.
        std::this_thread::sleep_for(1500ms);
        return interpreters::Value{true};
      }
      if (refused_.contains(std::string(model))) {
        return Unavailable("the test refuses to load " + std::string(model));
      }
      return interpreters::Value{true};
    };
    options.output = [this](const OutputSource& source, const interpreters::OutputLine& line) {
      std::lock_guard lock(mutex_);
      outputs_.push_back({source, std::string(line.text), std::string(line.caller)});
    };
    auto manager = InterpreterManager::Create(std::move(options));
    ASSERT_TRUE(manager.ok()) << manager.status().ToString();
    manager_ = std::move(manager).value();
  }

  void TearDown() override {
    // The stuck call must be back before the scheduler goes: its thread returns into it.
    EXPECT_TRUE(observer_.WaitFor([](const auto& counts) { return counts.abandoned == 0; }));
    scheduler_.reset();
    for (auto& [name, model] : models_) (void)model->Unload();
    models_.clear();
    manager_.reset();
  }

  static interpreters::ModelSource SourceOf(const std::string& name) {
    interpreters::ModelSource source;
    source.key = name + ":1";
    source.manifest_json = Manifest(name);
    source.code = {{"model.py", ModelCode(name)}};
    source.read_resource = [](std::string_view path) -> Result<std::string> {
      return NotFound(std::string(path));
    };
    return source;
  }

  std::shared_ptr<ReplicatedModel> Load(const std::string& name) {
    auto model = ReplicatedModel::Load(*manager_, SourceOf(name));
    EXPECT_TRUE(model.ok()) << model.status().ToString() << model.status().detail();
    if (!model.ok()) return nullptr;
    std::shared_ptr<ReplicatedModel> shared = std::move(model).value();
    models_[name] = shared;
    return shared;
  }

  void Start(RetryBackoff backoff) {
    scheduler_ = std::make_unique<Scheduler>(*manager_, 16, std::chrono::milliseconds(100), 8,
                                             &observer_, backoff);
    for (auto& [name, model] : models_) scheduler_->AddModel(model, {});
  }

  // The answer to one request that sleeps `seconds`, with an optional deadline.
  std::future<Status> Infer(const std::string& key, float seconds,
                            std::optional<Clock::duration> timeout = std::nullopt) {
    auto answer = std::make_shared<std::promise<Status>>();
    std::future<Status> future = answer->get_future();
    engine::Tensor x = engine::Tensor::Empty({1}, engine::DType::kFloat32);
    x.mutable_data_as<float>()[0] = seconds;
    InferJob job;
    job.inputs = {{"x", x}};
    if (timeout) job.deadline = Clock::now() + *timeout;
    job.done = [answer](const Result<std::vector<NamedTensor>>& outputs, const InferTimings&) {
      answer->set_value(outputs.status());
    };
    Status submitted = scheduler_->Submit(key, job);
    if (!submitted.ok()) answer->set_value(submitted);
    return future;
  }

  // Gets the model's copy stuck until `seconds` have passed; returns once it was abandoned.
  void GetStuck(const std::string& key, float seconds) {
    Status answer = Infer(key, seconds, 100ms).get();
    EXPECT_EQ(answer.code(), StatusCode::kDeadlineExceeded) << answer.ToString();
    EXPECT_THAT(answer.message(), HasSubstr("its interpreter copy was replaced"));
  }

  void Refuse(const std::string& name, bool refuse) {
    std::lock_guard lock(mutex_);
    if (refuse) {
      refused_.insert(name);
    } else {
      refused_.erase(name);
    }
  }

  int LoadAttempts(const std::string& name) {
    std::lock_guard lock(mutex_);
    return load_attempts_[name];
  }

  std::vector<Output> Outputs() {
    std::lock_guard lock(mutex_);
    return outputs_;
  }

  RecordingObserver observer_;
  std::unique_ptr<InterpreterManager> manager_;
  std::map<std::string, std::shared_ptr<ReplicatedModel>> models_;
  std::unique_ptr<Scheduler> scheduler_;
  std::mutex mutex_;
  std::set<std::string> refused_;
  std::set<std::string> stalled_;  // their load stays 1.5 s in the host function
  std::map<std::string, int> load_attempts_;
  std::vector<Output> outputs_;
};

TEST_F(SchedulerAfterAStuckCopy, TheAbandonedCopyIsNoLongerBusyAndItsLateOutputSaysWhoseItIs) {
  Load("sleeper");
  Load("other");
  Start({});
  GetStuck("sleeper:1", 1.5F);
  ASSERT_TRUE(observer_.WaitFor([](const auto& counts) { return counts.replaced == 1; }));
  EXPECT_EQ(observer_.Now().abandoned, 1);
  EXPECT_EQ(observer_.Now().busy, 0) << "the abandoned copy still counts as running its batch";

  // The fresh copy serves both models, and is busy only while it runs.
  for (const char* key : {"sleeper:1", "other:1"}) {
    Status answer = Infer(key, 0).get();
    EXPECT_TRUE(answer.ok()) << answer.ToString();
  }
  EXPECT_EQ(observer_.Now().busy, 0);

  // The stuck call comes back at last, printing as it leaves while the fresh copy (which ran
  // `other` last) has the slot: the line is the abandoned copy's, of the model it ran.
  ASSERT_TRUE(observer_.WaitFor([](const auto& counts) { return counts.abandoned == 0; }));
  std::vector<Output> outputs = Outputs();
  ASSERT_EQ(outputs.size(), 1U);
  EXPECT_EQ(outputs[0].text, "back after 1.5");
  EXPECT_EQ(outputs[0].caller, "sleeper:1");
  EXPECT_EQ(outputs[0].source.slot, 0U);
  EXPECT_EQ(outputs[0].source.copy_id, 0);
  EXPECT_TRUE(outputs[0].source.abandoned);
  EXPECT_EQ(observer_.Now().busy, 0);
}

TEST_F(SchedulerAfterAStuckCopy, AModelThatFailsToLoadIntoTheReplacementIsRetriedWithBackoff) {
  Load("sleeper");
  Load("flaky");
  Start({.first = 50ms, .longest = 200ms});
  Refuse("flaky", true);
  GetStuck("sleeper:1", 1.0F);
  ASSERT_TRUE(observer_.WaitFor([](const auto& counts) { return counts.missing_models == 1; }));
  EXPECT_EQ(observer_.Now().without_copy, 0);

  // The slot serves the model that loaded...
  Status served = Infer("sleeper:1", 0).get();
  EXPECT_TRUE(served.ok()) << served.ToString();
  // ...and refuses the one no copy holds, saying why, rather than queue it for good.
  Status refused = Infer("flaky:1", 0).get();
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  EXPECT_THAT(refused.message(), HasSubstr("model flaky:1 has no interpreter copy to run in: "
                                           "loading it into the replacement of a stuck copy "
                                           "failed"));
  EXPECT_THAT(refused.message(), HasSubstr("the test refuses to load flaky"));
  EXPECT_EQ(scheduler_->Availability("flaky:1").message(), refused.message());

  // Retried after 50, 100, 200, 200... ms: a few times in 700 ms, not in a tight loop.
  const int before = LoadAttempts("flaky");
  std::this_thread::sleep_for(700ms);
  const int retries = LoadAttempts("flaky") - before;
  EXPECT_GE(retries, 2);
  EXPECT_LE(retries, 6);

  Refuse("flaky", false);
  ASSERT_TRUE(observer_.WaitFor([](const auto& counts) { return counts.missing_models == 0; }));
  EXPECT_TRUE(scheduler_->Availability("flaky:1").ok());
  Status recovered = Infer("flaky:1", 0).get();
  EXPECT_TRUE(recovered.ok()) << recovered.ToString();
}

TEST_F(SchedulerAfterAStuckCopy, StopDoesNotWaitForARetry) {
  Load("sleeper");
  Load("flaky");
  Start({.first = 60s, .longest = 60s});
  Refuse("flaky", true);
  GetStuck("sleeper:1", 1.0F);
  ASSERT_TRUE(observer_.WaitFor([](const auto& counts) { return counts.missing_models == 1; }));
  const Clock::time_point start = Clock::now();
  EXPECT_EQ(scheduler_->Stop(), 0U);
  EXPECT_LT(Clock::now() - start, 1s);
}

TEST_F(SchedulerAfterAStuckCopy, RemovingAModelThatFailsToLoadEndsItsRetries) {
  Load("sleeper");
  Load("flaky");
  Start({.first = 50ms, .longest = 50ms});
  Refuse("flaky", true);
  GetStuck("sleeper:1", 1.0F);
  ASSERT_TRUE(observer_.WaitFor([](const auto& counts) { return counts.missing_models == 1; }));
  EXPECT_EQ(scheduler_->RemoveModel("flaky:1"), 0U);
  ASSERT_TRUE(observer_.WaitFor([](const auto& counts) { return counts.missing_models == 0; }));
  const int attempts = LoadAttempts("flaky");
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(LoadAttempts("flaky"), attempts) << "a removed model is still being loaded";
  Status served = Infer("sleeper:1", 0).get();
  EXPECT_TRUE(served.ok()) << served.ToString();
  EXPECT_EQ(Infer("flaky:1", 0).get().code(), StatusCode::kNotFound);
}

using SchedulerStopping = SchedulerAfterAStuckCopy;

// A model removed while the scheduler stops goes only once its running batch is back: the
// worker running it still uses the model's queue (a removal that did not wait freed it under
// the worker).
TEST_F(SchedulerStopping, RemovingAModelWaitsForItsRunningBatch) {
  Load("sleeper");
  Start({});
  std::future<Status> running = Infer("sleeper:1", 0.5F);
  ASSERT_TRUE(observer_.WaitFor([](const auto& counts) { return counts.busy == 1; }));
  std::thread stopping([this] { scheduler_->Stop(Clock::now() + 10s); });
  std::this_thread::sleep_for(50ms);  // Stop is waiting for the worker now
  EXPECT_EQ(scheduler_->RemoveModel("sleeper:1"), 0U);
  EXPECT_EQ(running.wait_for(0s), std::future_status::ready)
      << "the model was removed while its batch still ran";
  stopping.join();
  Status answer = running.get();
  EXPECT_TRUE(answer.ok()) << answer.ToString();
}

TEST_F(SchedulerAfterAStuckCopy, ACopyStuckInCInALoadIsReplacedAndServesItsModelsAgain) {
  Load("sleeper");
  Start({});
  {
    std::lock_guard lock(mutex_);
    stalled_.insert("stuck");
  }
  // As ModelService loads: the copy out of service around the load, replaced if it gets stuck.
  interpreters::LoadOptions options;
  options.timeout = 200ms;
  options.interrupt_grace = 100ms;
  options.pause = [this](size_t slot) { scheduler_->PauseSlot(slot); };
  options.resume = [this](size_t slot) { scheduler_->ResumeSlot(slot); };
  options.abandon = [this](size_t slot) { scheduler_->ReplaceStuckLoad(slot); };
  options.abandoned_returned = [this](size_t) { scheduler_->StuckLoadReturned(); };
  const Clock::time_point start = Clock::now();
  auto stuck = ReplicatedModel::Load(*manager_, SourceOf("stuck"), {}, options);
  EXPECT_LT(Clock::now() - start, 1s) << "the load waited for the stuck copy";
  ASSERT_FALSE(stuck.ok());
  EXPECT_EQ(stuck.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(stuck.status().message(),
              HasSubstr("1 interpreter copies did not stop when interrupted (stuck in C code); "
                        "they were abandoned and replaced by fresh copies"));
  EXPECT_EQ(observer_.Now().replaced, 1);
  EXPECT_EQ(observer_.Now().abandoned, 1);
  // The fresh copy, the only one, serves the slot's model again while the stuck call goes on.
  Status served = Infer("sleeper:1", 0).get();
  EXPECT_TRUE(served.ok()) << served.ToString();
  EXPECT_LT(Clock::now() - start, 1400ms);
  // The stuck call comes back at last: no longer counted, its copy unloaded.
  ASSERT_TRUE(observer_.WaitFor([](const auto& counts) { return counts.abandoned == 0; }));
  EXPECT_EQ(manager_->abandoned_loaded(), 0U);
  served = Infer("sleeper:1", 0).get();
  EXPECT_TRUE(served.ok()) << served.ToString();
}

}  // namespace
}  // namespace orochi::server

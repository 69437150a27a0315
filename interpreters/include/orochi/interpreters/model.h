// A model (a package's code, weights and manifest) loaded into several interpreter copies.
//
// Load() builds the model's entry class once in each chosen copy (in parallel) through
// orochi.serving: the package's code is imported by its own importer in each copy, and every
// copy gets the same weight tensors, never copied. Predict() may be called from any number of
// threads: each call runs in whichever of the model's copies is free first.
//
// Thread-safety: Predict and Unload may be called from any thread; Unload waits for the calls
// that hold a copy to finish and makes later calls fail with kUnavailable. The manager must
// outlive the model, and its copies must not be replaced while the model is loaded (a fresh
// copy does not hold the model).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "orochi/base/status.h"
#include "orochi/engine/tensor.h"
#include "orochi/interpreters/interpreter_manager.h"

namespace orochi::interpreters {

// A tensor of byte strings (KServe's BYTES): row-major items of `shape`.
struct BytesTensor {
  engine::Shape shape;
  std::vector<std::string> items;
};

struct NamedTensor {
  std::string name;
  std::variant<engine::Tensor, BytesTensor> value;
};

// A request's own parameters, for predict(): KServe v2 allows a string, a number or a boolean
// under each name. Sorted by name, each name once (predict() gets them as a dict).
using ParameterValue = std::variant<bool, int64_t, double, std::string>;
using RequestParameters = std::vector<std::pair<std::string, ParameterValue>>;

// A request of a stateful model (its manifest's "sequence"): the sequence whose state, kept in
// the copy, predict() receives. `start` gives it a new, empty state first; `end` frees the
// state after the call, whether predict() succeeds or not.
struct SequenceCall {
  std::string id;
  bool start = false;
  bool end = false;
};

struct ModelSource {
  // Unique among the models loaded into one manager, e.g. "digits:1".
  std::string key;
  // The package's manifest (already validated) and per-deployment config, both JSON objects.
  std::string manifest_json;
  std::string config_json = "{}";
  // Python sources by their path below code/ ("model.py", "pkg/__init__.py").
  std::map<std::string, std::string> code;
  // Read-only tensors shared by every copy.
  std::map<std::string, engine::Tensor> weights;
  // Returns the bytes of resources/<path>; called from copies' threads, so thread-safe.
  std::function<Result<std::string>(std::string_view path)> read_resource;
};

// How ReplicatedModel::Load goes about it.
struct LoadOptions {
  // Past this (> 0), each copy still loading is interrupted (TimeoutError in the entry class's
  // __init__) and the load fails with kDeadlineExceeded. A copy that does not come back from
  // the interrupt within `interrupt_grace` (stuck in C code) is given up: `abandon` when set,
  // else it is left to its loading thread, which holds its slot until it returns, if ever. The
  // result says how many copies were stuck.
  std::chrono::milliseconds timeout{0};
  std::chrono::milliseconds interrupt_grace{5000};
  // Called, from Load's thread and in place of `resume`, with the slot of each copy stuck past
  // the grace: it must put a fresh copy in the slot (InterpreterManager::Abandon) before it
  // returns, since the stuck thread's Lease holds the slot until then (should the call return
  // meanwhile, its thread waits for that). Should a stuck call return at last, its thread
  // calls `abandoned_returned` with the slot once it has let the old copy go.
  std::function<void(size_t slot)> abandon;
  std::function<void(size_t slot)> abandoned_returned;
  // At most this many copies load at once (0: all of them), each taken out of service around
  // its load by `pause` and `resume` (called with the slot, from the loading thread) when they
  // are set: a scheduler's hooks, so that the other copies go on serving while the entry
  // class's __init__ runs.
  size_t max_parallel = 0;
  std::function<void(size_t slot)> pause;
  std::function<void(size_t slot)> resume;
};

// Where the time of one predict() call went, for Triton's compute_input, compute_infer and
// compute_output statistics; the three add up to the call's time.
struct PredictTimings {
  // The inputs made into the copy's values (host), then, in the copy, checked against the
  // manifest and made into predict()'s arguments (BYTES as nested lists, tensors moved to the
  // model's device).
  std::chrono::nanoseconds input{0};
  // The model's predict(), and entering and leaving the copy. All of the call when the copy
  // raised (its own split is then unknown).
  std::chrono::nanoseconds infer{0};
  // In the copy, predict()'s result checked against the manifest and made into host tensors
  // (BYTES flattened), then those read back into NamedTensors (host).
  std::chrono::nanoseconds output{0};
};

class ReplicatedModel {
 public:
  // Loads `source` into copies `slots` of `manager` (every copy when empty). Fails, with the
  // Python traceback for errors raised by the package's code, if any copy fails; copies that
  // had loaded it unload it again. See LoadOptions for deadlines and copies out of service.
  static Result<std::unique_ptr<ReplicatedModel>> Load(InterpreterManager& manager,
                                                       ModelSource source,
                                                       std::vector<size_t> slots = {},
                                                       const LoadOptions& options = {});
  ~ReplicatedModel();  // unloads

  ReplicatedModel(const ReplicatedModel&) = delete;
  ReplicatedModel& operator=(const ReplicatedModel&) = delete;

  // Runs predict() in a free copy holding the model. Outputs come in the manifest's order.
  // Errors: kInvalidArgument for inputs the model's checks refuse (orochi.serving.InputError),
  // kPythonError (with the traceback as detail) for exceptions raised by the model,
  // kUnavailable once unloaded.
  // `parameters` reach predict() only when it takes a `parameters` argument.
  Result<std::vector<NamedTensor>> Predict(const std::vector<NamedTensor>& inputs,
                                           const RequestParameters& parameters = {},
                                           const SequenceCall* sequence = nullptr);

  // Runs predict() in `copy`, which the caller holds through a Lease on one of slots(). For
  // schedulers that give each copy its own worker thread. Says where the time went in
  // `timings` when given, whether the call succeeds or not. A stateful model's call names its
  // `sequence`, whose state stays in `copy`: its later calls must run there too.
  Result<std::vector<NamedTensor>> PredictIn(Interpreter& copy,
                                             const std::vector<NamedTensor>& inputs,
                                             const RequestParameters& parameters = {},
                                             PredictTimings* timings = nullptr,
                                             const SequenceCall* sequence = nullptr);
  // Frees the states of a stateful model's sequences `ids` in `copy` (which the caller holds):
  // sequences that expired, or whose end never ran. Ids without a state there are skipped.
  Status DropSequences(Interpreter& copy, const std::vector<std::string>& ids);

  // Streaming models (orochi.serving's streams), each call in `copy`, which the caller holds.
  // A stream is opened once, advanced by StreamNext (a generator) or StreamStep (the step
  // interface, several sequences in one call), and closed once with StreamClose unless it
  // ended by itself (StreamNext gave nullopt, StreamStep said finished or failed).
  enum class StreamKind { kGenerator, kStep };
  Result<StreamKind> StreamOpen(Interpreter& copy, uint64_t stream,
                                const std::vector<NamedTensor>& inputs,
                                const RequestParameters& parameters);
  // The generator's next response, or nullopt once it has returned. An error has ended it.
  Result<std::optional<std::vector<NamedTensor>>> StreamNext(Interpreter& copy, uint64_t stream);
  struct StepResult {
    std::optional<std::vector<NamedTensor>> outputs;  // nothing streamed this step
    bool finished = false;
    Status error;  // this sequence's entry was malformed; it is finished
  };
  // One step() for `streams`, one result each in order. An error has ended all of them.
  Result<std::vector<StepResult>> StreamStep(Interpreter& copy,
                                             const std::vector<uint64_t>& streams);
  // Closes the generator (GeneratorExit at its yield) or calls the sequence's finish().
  Status StreamClose(Interpreter& copy, uint64_t stream);

  // Unloads the model from every copy, freeing its Python objects; weights are released when
  // the last tensor viewing them goes. Idempotent.
  Status Unload();

  // Loads the model again into copy `slot` (one of slots()), e.g. after the manager put a fresh
  // copy there in place of a stuck one, under the timeout Load had: past it the entry class's
  // __init__ is interrupted (TimeoutError) and the result is kDeadlineExceeded.
  Status LoadInto(size_t slot);

  const std::string& key() const { return key_; }
  const std::vector<size_t>& slots() const { return slots_; }
  // LoadInto's timeout (0: none).
  std::chrono::milliseconds load_timeout() const { return load_timeout_; }

 private:
  ReplicatedModel(InterpreterManager& manager, std::string key, std::vector<size_t> slots);

  InterpreterManager& manager_;
  std::string key_;
  std::vector<size_t> slots_;
  std::vector<Value> load_arguments_;          // what orochi.serving._load got, for LoadInto
  std::chrono::milliseconds load_timeout_{0};  // LoadOptions::timeout, for LoadInto
  std::atomic<bool> unloaded_{false};
};

}  // namespace orochi::interpreters

#include "orochi/interpreters/model.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "builtin_host_functions.h"
#include "orochi/base/crash_record.h"

namespace orochi::interpreters {
namespace {

constexpr const char* kInputErrorType = "orochi.serving.InputError";

// Resource readers of the loaded models, for the built-in "orochi.model_resource" host
// function that ModelContext.resource() calls from inside copies.
class ResourceReaders {
 public:
  static ResourceReaders& Instance() {
    static ResourceReaders readers;
    return readers;
  }
  bool Add(const std::string& key, std::function<Result<std::string>(std::string_view)> reader) {
    std::lock_guard lock(mutex_);
    return readers_.emplace(key, std::move(reader)).second;
  }
  void Remove(const std::string& key) {
    std::lock_guard lock(mutex_);
    readers_.erase(key);
  }
  Result<Value> Read(std::string_view payload) {
    size_t newline = payload.find('\n');
    if (newline == std::string_view::npos) return InvalidArgument("expected 'key\\npath'");
    std::string key(payload.substr(0, newline));
    std::function<Result<std::string>(std::string_view)> reader;
    {
      std::lock_guard lock(mutex_);
      auto found = readers_.find(key);
      if (found == readers_.end()) return NotFound("model " + key + " is not loaded");
      reader = found->second;
    }
    if (!reader) return NotFound("model " + key + " has no resources");
    OROCHI_ASSIGN_OR_RETURN(std::string data, reader(payload.substr(newline + 1)));
    return Value(Bytes{std::move(data)});
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::function<Result<std::string>(std::string_view)>, std::less<>> readers_;
};

Value ToValue(const NamedTensor& input) {
  ValueList pair;
  pair.items.emplace_back(input.name);
  if (const auto* tensor = std::get_if<engine::Tensor>(&input.value)) {
    pair.items.emplace_back(*tensor);
  } else {
    const auto& bytes = std::get<BytesTensor>(input.value);
    ValueList shape;
    for (int64_t size : bytes.shape) shape.items.emplace_back(size);
    ValueList items;
    for (const std::string& item : bytes.items) items.items.emplace_back(Bytes{item});
    pair.items.emplace_back(ValueList{{std::move(shape), std::move(items)}});
  }
  return pair;
}

Status Malformed() { return Internal("orochi.serving returned malformed outputs"); }

// `value`: [[name, tensor | [shape, [bytes, ...]]], ...], as orochi.serving._outputs makes it.
Result<std::vector<NamedTensor>> ParseOutputs(const Value& value) {
  const auto* outputs = std::get_if<ValueList>(&value);
  if (outputs == nullptr) return Malformed();
  std::vector<NamedTensor> result;
  for (const Value& entry : outputs->items) {
    const auto* pair = std::get_if<ValueList>(&entry);
    if (pair == nullptr || pair->items.size() != 2) return Malformed();
    const auto* name = std::get_if<std::string>(&pair->items[0]);
    if (name == nullptr) return Malformed();
    if (const auto* tensor = std::get_if<engine::Tensor>(&pair->items[1])) {
      result.push_back({*name, *tensor});
      continue;
    }
    const auto* bytes = std::get_if<ValueList>(&pair->items[1]);
    if (bytes == nullptr || bytes->items.size() != 2) return Malformed();
    const auto* shape = std::get_if<ValueList>(&bytes->items[0]);
    const auto* items = std::get_if<ValueList>(&bytes->items[1]);
    if (shape == nullptr || items == nullptr) return Malformed();
    BytesTensor tensor;
    for (const Value& size : shape->items) tensor.shape.push_back(std::get<int64_t>(size));
    for (const Value& item : items->items) tensor.items.push_back(std::get<Bytes>(item).data);
    result.push_back({*name, std::move(tensor)});
  }
  return result;
}

// `value`: [outputs, [input_ns, output_ns]] (see orochi.serving._predict); the copy's own
// input and output times go to `copy_input` and `copy_output`.
Result<std::vector<NamedTensor>> FromOutputs(const Value& value,
                                             std::chrono::nanoseconds* copy_input,
                                             std::chrono::nanoseconds* copy_output) {
  const auto* answer = std::get_if<ValueList>(&value);
  if (answer == nullptr || answer->items.size() != 2) return Malformed();
  const auto* times = std::get_if<ValueList>(&answer->items[1]);
  if (times == nullptr || times->items.size() != 2) return Malformed();
  const auto* input_ns = std::get_if<int64_t>(&times->items[0]);
  const auto* output_ns = std::get_if<int64_t>(&times->items[1]);
  if (input_ns == nullptr || output_ns == nullptr) return Malformed();
  *copy_input = std::chrono::nanoseconds(std::max<int64_t>(*input_ns, 0));
  *copy_output = std::chrono::nanoseconds(std::max<int64_t>(*output_ns, 0));
  return ParseOutputs(answer->items[0]);
}

// The model's own InputError is the client's mistake: kInvalidArgument, without its type.
Status ClientErrorOf(const Status& error) {
  if (error.code() == StatusCode::kPythonError && error.message().starts_with(kInputErrorType)) {
    return InvalidArgument(error.message().substr(std::string_view(kInputErrorType).size() + 2));
  }
  return error;
}

ValueList ToArguments(const std::vector<NamedTensor>& inputs) {
  ValueList arguments;
  for (const NamedTensor& input : inputs) arguments.items.push_back(ToValue(input));
  return arguments;
}

// [[name, value], ...]: plain values, which the copy makes into a dict.
ValueList ToParameters(const RequestParameters& parameters) {
  ValueList named_parameters;
  for (const auto& [name, value] : parameters) {
    Value item = std::visit([](const auto& held) { return Value(held); }, value);
    named_parameters.items.push_back(ValueList{{Value(name), std::move(item)}});
  }
  return named_parameters;
}

}  // namespace

const HostFunction* FindBuiltinHostFunction(std::string_view name) {
  static const HostFunction model_resource = [](std::string_view payload) {
    return ResourceReaders::Instance().Read(payload);
  };
  return name == "orochi.model_resource" ? &model_resource : nullptr;
}

ReplicatedModel::ReplicatedModel(InterpreterManager& manager, std::string key,
                                 std::vector<size_t> slots)
    : manager_(manager), key_(std::move(key)), slots_(std::move(slots)) {}

ReplicatedModel::~ReplicatedModel() { (void)Unload(); }

Result<std::unique_ptr<ReplicatedModel>> ReplicatedModel::Load(InterpreterManager& manager,
                                                               ModelSource source,
                                                               std::vector<size_t> slots,
                                                               const LoadOptions& options) {
  const std::chrono::milliseconds timeout = options.timeout;
  if (slots.empty()) {
    for (size_t slot = 0; slot < manager.size(); ++slot) slots.push_back(slot);
  }
  for (size_t slot : slots) {
    if (slot >= manager.size()) {
      return InvalidArgument("copy " + std::to_string(slot) + " does not exist (the manager has " +
                             std::to_string(manager.size()) + ")");
    }
  }
  if (!ResourceReaders::Instance().Add(source.key, source.read_resource)) {
    return AlreadyExists("a model is already loaded as " + source.key);
  }
  auto model = std::unique_ptr<ReplicatedModel>(new ReplicatedModel(manager, source.key, slots));

  ValueList code;
  for (const auto& [path, text] : source.code) {
    code.items.emplace_back(ValueList{{path, Bytes{text}}});
  }
  ValueList weights;
  for (const auto& [name, tensor] : source.weights) {
    weights.items.emplace_back(ValueList{{name, tensor}});
  }
  model->load_timeout_ = timeout;
  model->load_arguments_ = {source.key, source.manifest_json, source.config_json, std::move(code),
                            std::move(weights)};

  // Each copy builds its own instance; they start together, each on its own thread. The
  // threads share `loading` rather than this frame: past the timeout and the grace, a thread
  // stuck in a copy is left behind and outlives the call.
  enum class CopyLoad {
    kWaiting,     // for its turn or its slot
    kCalling,     // in the copy, holding its Lease
    kReturned,    // out of the copy (it may still hold the Lease a moment)
    kAbandoning,  // stuck past the grace: the slot gets a fresh copy; the Lease is kept till then
    kAbandoned,   // the slot has a fresh copy (or the attempt failed): the old Lease means nothing
  };
  struct Loading {
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<Status> results;
    std::vector<std::shared_ptr<Interpreter>> copies;  // while the copy loads
    std::vector<CopyLoad> states;
    size_t running = 0;
    size_t loading_now = 0;  // copies loading at this moment, at most max_parallel
    bool cancelled = false;  // past the timeout: copies yet to start do not
  };
  auto loading = std::make_shared<Loading>();
  loading->results.resize(slots.size());
  loading->copies.resize(slots.size());
  loading->states.resize(slots.size(), CopyLoad::kWaiting);
  loading->running = slots.size();
  const std::string key = source.key;
  const size_t max_parallel = options.max_parallel == 0 ? slots.size() : options.max_parallel;
  for (size_t i = 0; i < slots.size(); ++i) {
    try {
      std::thread([loading, &manager, slot = slots[i], arguments = model->load_arguments_, key, i,
                   max_parallel, options] {
        auto finish = [&](Status result) {
          std::lock_guard lock(loading->mutex);
          loading->results[i] = std::move(result);
          loading->copies[i].reset();
          loading->running--;
          loading->changed.notify_all();
        };
        const Status not_started = DeadlineExceeded("not started: the load timed out");
        {
          std::unique_lock lock(loading->mutex);
          loading->changed.wait(
              lock, [&] { return loading->cancelled || loading->loading_now < max_parallel; });
          if (loading->cancelled) {
            lock.unlock();
            finish(not_started);
            return;
          }
          loading->loading_now++;
        }
        if (options.pause) options.pause(slot);
        Status result;
        bool abandoned = false;
        {
          InterpreterManager::Lease lease = manager.AcquireSlot(slot);
          bool cancelled = false;
          {
            std::lock_guard lock(loading->mutex);
            // The slot came free only after the timeout: nothing to load any more.
            cancelled = loading->cancelled;
            if (!cancelled) {
              loading->copies[i] = lease.shared();
              loading->states[i] = CopyLoad::kCalling;
            }
          }
          if (cancelled) {
            result = not_started;
          } else {
            lease->SetCaller(key);
            Result<Value> loaded = [&] {
              const ScopedCrashContext crash_context(key, static_cast<int>(slot), "load",
                                                     lease->python_stack_writer());
              return lease->Call("orochi.serving:_load", arguments);
            }();
            // This thread ends after the load, while the copy lives on: its Python thread state
            // there would stay until the copy is finalized, a few KB on every load.
            lease->ReleaseThread();
            if (!loaded.ok()) {
              result = Status(loaded.status().code(),
                              "loading model " + key + " in interpreter copy " +
                                  std::to_string(lease->id()) + ": " + loaded.status().message(),
                              loaded.status().detail());
            }
            std::unique_lock lock(loading->mutex);
            // Given up as stuck: the Lease still holds the slot until the fresh copy is in it,
            // so that nobody else gets the old copy meanwhile.
            loading->changed.wait(lock,
                                  [&] { return loading->states[i] != CopyLoad::kAbandoning; });
            abandoned = loading->states[i] == CopyLoad::kAbandoned;
            if (!abandoned) loading->states[i] = CopyLoad::kReturned;
          }
        }
        if (abandoned) {
          if (options.abandoned_returned) options.abandoned_returned(slot);
        } else if (options.resume) {
          options.resume(slot);
        }
        {
          std::lock_guard lock(loading->mutex);
          loading->loading_now--;
        }
        finish(std::move(result));
      }).detach();
    } catch (const std::system_error& error) {
      // No thread to be had: model code's threads count against the process's limits too
      // (RLIMIT_NPROC, a cgroup's pids). This copy's load fails as a load does, rather than
      // std::terminate ending every model with a record that names none.
      std::lock_guard lock(loading->mutex);
      loading->results[i] = ResourceExhausted(
          "loading model " + key + " in interpreter copy " + std::to_string(slots[i]) +
          ": no thread could be started for it: " + error.what());
      loading->running--;
    }
  }
  std::unique_lock lock(loading->mutex);
  auto all_done = [&] { return loading->running == 0; };
  bool timed_out = false;
  if (timeout.count() > 0) {
    timed_out = !loading->changed.wait_for(lock, timeout, all_done);
  } else {
    loading->changed.wait(lock, all_done);
  }
  if (timed_out) {
    loading->cancelled = true;
    loading->changed.notify_all();
    // Interrupting waits for the copy's GIL, which a copy stuck in C never gives up: each on a
    // thread of its own.
    for (const std::shared_ptr<Interpreter>& copy : loading->copies) {
      if (copy == nullptr) continue;
      try {
        std::thread([copy] { (void)copy->Interrupt(); }).detach();
      } catch (const std::system_error&) {
        // No thread to be had: the copy is abandoned after the grace, as one stuck in C is.
      }
    }
    if (!loading->changed.wait_for(lock, options.interrupt_grace, all_done)) {
      const size_t stuck = static_cast<size_t>(
          std::count(loading->states.begin(), loading->states.end(), CopyLoad::kCalling));
      std::vector<size_t> given_up;
      if (options.abandon) {
        for (size_t i = 0; i < slots.size(); ++i) {
          if (loading->states[i] != CopyLoad::kCalling) continue;
          loading->states[i] = CopyLoad::kAbandoning;
          given_up.push_back(i);
        }
      }
      const std::vector<CopyLoad> states = loading->states;
      lock.unlock();
      for (size_t i : given_up) {
        options.abandon(slots[i]);
        {
          std::lock_guard given_up_lock(loading->mutex);
          loading->states[i] = CopyLoad::kAbandoned;
        }
        loading->changed.notify_all();
      }
      // Unloaded from the copies that came back; waiting for a stuck one would never end.
      model->unloaded_ = true;
      for (size_t i = 0; i < slots.size(); ++i) {
        if (states[i] != CopyLoad::kReturned) continue;
        InterpreterManager::Lease lease = manager.AcquireSlot(slots[i]);
        lease->SetCaller(key);
        (void)lease->Call("orochi.serving:_unload", std::vector<Value>{key});
      }
      ResourceReaders::Instance().Remove(key);
      const std::string fate = options.abandon
                                   ? "; they were abandoned and replaced by fresh copies"
                                   : "; they keep their slots until they return";
      return DeadlineExceeded(
          "loading model " + key + " did not finish within the load timeout of " +
          std::to_string(timeout.count()) + " ms, and " + std::to_string(stuck) +
          " interpreter copies did not stop when interrupted (stuck in C code)" + fate);
    }
    lock.unlock();
    (void)model->Unload();
    return DeadlineExceeded("loading model " + key + " did not finish within the load timeout of " +
                            std::to_string(timeout.count()) +
                            " ms (the entry class's __init__ was interrupted)");
  }
  std::vector<Status> results = loading->results;
  lock.unlock();
  for (const Status& result : results) {
    if (!result.ok()) {
      (void)model->Unload();  // from the copies that did load it
      return result;
    }
  }
  return model;
}

Result<std::vector<NamedTensor>> ReplicatedModel::Predict(const std::vector<NamedTensor>& inputs,
                                                          const RequestParameters& parameters,
                                                          const SequenceCall* sequence) {
  if (unloaded_.load()) return Unavailable("model " + key_ + " is unloaded");
  InterpreterManager::Lease lease = manager_.AcquireAnyOf(slots_);
  return PredictIn(*lease, inputs, parameters, nullptr, sequence);
}

Result<std::vector<NamedTensor>> ReplicatedModel::PredictIn(Interpreter& copy,
                                                            const std::vector<NamedTensor>& inputs,
                                                            const RequestParameters& parameters,
                                                            PredictTimings* timings,
                                                            const SequenceCall* sequence) {
  using Clock = std::chrono::steady_clock;
  PredictTimings ignored;
  if (timings == nullptr) timings = &ignored;
  *timings = {};
  const Clock::time_point started = Clock::now();
  if (unloaded_.load()) return Unavailable("model " + key_ + " is unloaded");
  std::vector<Value> call{key_, ToArguments(inputs), ToParameters(parameters)};
  if (sequence != nullptr) {
    call.emplace_back(
        ValueList{{Value(sequence->id), Value(sequence->start), Value(sequence->end)}});
  }
  copy.SetCaller(key_);
  const Clock::time_point calling = Clock::now();
  Result<Value> outputs = copy.Call("orochi.serving:_predict", call);
  const Clock::time_point returned = Clock::now();
  timings->input = calling - started;
  timings->infer = returned - calling;
  if (!outputs.ok()) return ClientErrorOf(outputs.status());
  std::chrono::nanoseconds copy_input{0};
  std::chrono::nanoseconds copy_output{0};
  Result<std::vector<NamedTensor>> result = FromOutputs(*outputs, &copy_input, &copy_output);
  // The copy's own times are part of the call; moved from infer, which never goes below 0.
  copy_input = std::min(copy_input, timings->infer);
  copy_output = std::min(copy_output, timings->infer - copy_input);
  timings->input += copy_input;
  timings->infer -= copy_input + copy_output;
  timings->output = copy_output + (Clock::now() - returned);
  return result;
}

Result<ReplicatedModel::StreamKind> ReplicatedModel::StreamOpen(
    Interpreter& copy, uint64_t stream, const std::vector<NamedTensor>& inputs,
    const RequestParameters& parameters) {
  if (unloaded_.load()) return Unavailable("model " + key_ + " is unloaded");
  copy.SetCaller(key_);
  Result<Value> kind = copy.Call("orochi.serving:_stream_open",
                                 std::vector<Value>{key_, static_cast<int64_t>(stream),
                                                    ToArguments(inputs), ToParameters(parameters)});
  if (!kind.ok()) return ClientErrorOf(kind.status());
  const auto* name = std::get_if<std::string>(&*kind);
  if (name == nullptr) return Malformed();
  return *name == "step" ? StreamKind::kStep : StreamKind::kGenerator;
}

Result<std::optional<std::vector<NamedTensor>>> ReplicatedModel::StreamNext(Interpreter& copy,
                                                                            uint64_t stream) {
  copy.SetCaller(key_);
  Result<Value> next = copy.Call("orochi.serving:_stream_next",
                                 std::vector<Value>{key_, static_cast<int64_t>(stream)});
  if (!next.ok()) return next.status();
  if (std::holds_alternative<std::monostate>(*next)) {
    return std::optional<std::vector<NamedTensor>>();
  }
  OROCHI_ASSIGN_OR_RETURN(std::vector<NamedTensor> outputs, ParseOutputs(*next));
  return std::optional<std::vector<NamedTensor>>(std::move(outputs));
}

Result<std::vector<ReplicatedModel::StepResult>> ReplicatedModel::StreamStep(
    Interpreter& copy, const std::vector<uint64_t>& streams) {
  copy.SetCaller(key_);
  ValueList ids;
  for (uint64_t stream : streams) ids.items.emplace_back(static_cast<int64_t>(stream));
  Result<Value> stepped =
      copy.Call("orochi.serving:_stream_step", std::vector<Value>{key_, std::move(ids)});
  if (!stepped.ok()) return stepped.status();
  const auto* entries = std::get_if<ValueList>(&*stepped);
  if (entries == nullptr || entries->items.size() != streams.size()) return Malformed();
  std::vector<StepResult> results;
  for (const Value& value : entries->items) {
    const auto* entry = std::get_if<ValueList>(&value);
    if (entry == nullptr || entry->items.size() != 3) return Malformed();
    const auto* finished = std::get_if<bool>(&entry->items[1]);
    if (finished == nullptr) return Malformed();
    StepResult result;
    result.finished = *finished;
    if (const auto* error = std::get_if<std::string>(&entry->items[2])) {
      result.error = PythonError(*error);
    }
    if (!std::holds_alternative<std::monostate>(entry->items[0])) {
      OROCHI_ASSIGN_OR_RETURN(std::vector<NamedTensor> outputs, ParseOutputs(entry->items[0]));
      result.outputs = std::move(outputs);
    }
    results.push_back(std::move(result));
  }
  return results;
}

Status ReplicatedModel::StreamClose(Interpreter& copy, uint64_t stream) {
  copy.SetCaller(key_);
  Result<Value> closed = copy.Call("orochi.serving:_stream_close",
                                   std::vector<Value>{key_, static_cast<int64_t>(stream)});
  return closed.ok() ? Status::Ok() : closed.status();
}

Status ReplicatedModel::DropSequences(Interpreter& copy, const std::vector<std::string>& ids) {
  copy.SetCaller(key_);
  ValueList names;
  for (const std::string& id : ids) names.items.emplace_back(id);
  Result<Value> dropped =
      copy.Call("orochi.serving:_sequence_drop", std::vector<Value>{key_, std::move(names)});
  return dropped.ok() ? Status::Ok() : dropped.status();
}

Status ReplicatedModel::LoadInto(size_t slot) {
  if (unloaded_.load()) return Unavailable("model " + key_ + " is unloaded");
  InterpreterManager::Lease lease = manager_.AcquireSlot(slot);
  lease->SetCaller(key_);
  // The timer interrupts the copy past the timeout, under the mutex that this thread takes to
  // say the call returned: it holds the Lease until then, so an interrupt never reaches a later
  // call in the copy. Detached, and sharing `watch` rather than this frame: an interrupt waits
  // for the copy's GIL, which a copy stuck in C never gives up.
  struct Watch {
    std::mutex mutex;
    std::condition_variable returned;
    bool done = false;
    bool interrupted = false;
  };
  auto watch = std::make_shared<Watch>();
  if (load_timeout_.count() > 0) {
    std::thread([watch, copy = lease.shared(), timeout = load_timeout_] {
      std::unique_lock lock(watch->mutex);
      if (watch->returned.wait_for(lock, timeout, [&] { return watch->done; })) return;
      watch->interrupted = true;
      (void)copy->Interrupt();
    }).detach();
  }
  Result<Value> loaded = [&] {
    const ScopedCrashContext crash_context(key_, static_cast<int>(slot), "load",
                                           lease->python_stack_writer());
    return lease->Call("orochi.serving:_load", load_arguments_);
  }();
  bool interrupted = false;
  {
    std::lock_guard lock(watch->mutex);
    watch->done = true;
    interrupted = watch->interrupted;
  }
  watch->returned.notify_all();
  if (interrupted && !loaded.ok()) {
    return Status(StatusCode::kDeadlineExceeded,
                  "reloading model " + key_ + " in interpreter copy " +
                      std::to_string(lease->id()) + " did not finish within the load timeout of " +
                      std::to_string(load_timeout_.count()) +
                      " ms (the entry class's __init__ was interrupted)",
                  loaded.status().detail());
  }
  if (!loaded.ok()) {
    return Status(loaded.status().code(),
                  "reloading model " + key_ + " in interpreter copy " +
                      std::to_string(lease->id()) + ": " + loaded.status().message(),
                  loaded.status().detail());
  }
  return Status::Ok();
}

Status ReplicatedModel::Unload() {
  if (unloaded_.exchange(true)) return Status::Ok();
  Status first;
  for (size_t slot : slots_) {
    InterpreterManager::Lease lease = manager_.AcquireSlot(slot);  // after its running call
    lease->SetCaller(key_);
    Result<Value> unloaded = lease->Call("orochi.serving:_unload", std::vector<Value>{key_});
    if (!unloaded.ok() && first.ok() && unloaded.status().code() != StatusCode::kUnavailable) {
      first = unloaded.status();
    }
  }
  ResourceReaders::Instance().Remove(key_);
  return first;
}

}  // namespace orochi::interpreters

// A pool of private CPython copies, each handed to one thread at a time.
//
// Thread-safety: every method may be called from any thread. A Lease gives its holder sole use
// of one copy until the Lease is destroyed.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "orochi/base/status.h"
#include "orochi/interpreters/interpreter.h"

namespace orochi::interpreters {

// Which copy wrote a line of output.
struct OutputSource {
  size_t slot = 0;
  int copy_id = 0;  // the copy's id (Interpreter::id), never reused, unlike its slot
  // The copy was abandoned (see InterpreterManager::Abandon): another copy holds the slot now,
  // and this line comes from the call that was stuck in it, returning at last.
  bool abandoned = false;
};

struct ManagerOptions {
  size_t copies = 1;  // must be at least 1
  // Offered to every copy; see InterpreterOptions::host_functions.
  std::map<std::string, HostFunction, std::less<>> host_functions;
  PythonFlags flags;  // start-up options for every copy
  // When set, every copy's output goes here with where it comes from (see
  // InterpreterOptions::output); a fresh copy put in a slot reports as that slot, and the copy
  // it replaced as abandoned.
  std::function<void(const OutputSource& source, const OutputLine& line)> output;
};

class InterpreterManager {
 public:
  // Creates `options.copies` copies, started in parallel. Fails if any copy fails to start.
  static Result<std::unique_ptr<InterpreterManager>> Create(ManagerOptions options);

  ~InterpreterManager();  // unloads every copy; no Lease may outlive the manager

  size_t size() const { return slots_.size(); }

  // Exclusive use of one copy, returned to the pool when the Lease is destroyed.
  class Lease {
   public:
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    ~Lease();

    Interpreter& operator*() const { return *interpreter_; }
    Interpreter* operator->() const { return interpreter_.get(); }
    // The copy itself. Holding it past the Lease is allowed, but once the manager replaces or
    // unloads the copy, calls on it return kUnavailable.
    std::shared_ptr<Interpreter> shared() const { return interpreter_; }
    size_t slot() const { return slot_; }

   private:
    friend class InterpreterManager;
    Lease(InterpreterManager* manager, size_t slot, uint64_t generation,
          std::shared_ptr<Interpreter> interpreter);
    InterpreterManager* manager_;
    size_t slot_;
    uint64_t generation_;
    std::shared_ptr<Interpreter> interpreter_;
  };

  // Waits until some copy is free.
  Lease Acquire();
  // Waits up to `timeout` for a free copy.
  std::optional<Lease> TryAcquire(std::chrono::milliseconds timeout);
  // Waits until copy `slot` is free. Precondition: slot < size().
  Lease AcquireSlot(size_t slot);
  // Waits until one of `slots` is free. Precondition: `slots` is non-empty, each < size().
  Lease AcquireAnyOf(std::span<const size_t> slots);

  // Waits until copy `slot` is free, unloads it and starts a fresh copy in its place.
  // Precondition: slot < size(), and the caller holds no Lease on that slot.
  Status Replace(size_t slot);

  // Puts a fresh copy in `slot` at once, without waiting for the current one: for a copy stuck
  // in a call that ignores interrupts. A Lease on the old copy no longer holds the slot. The old
  // copy stays loaded while that Lease lives (a thread is still inside it; unloading would pull
  // its code from under it) and is unloaded when it goes, its memory reclaimed, unless threads
  // the copy started itself still run in it: then it stays loaded for good. Models the old copy
  // held must be loaded into the new one.
  Status Abandon(size_t slot);

  // Abandoned copies still loaded (their call has not returned, or their own threads run on).
  size_t abandoned_loaded() const;

 private:
  struct Slot {
    std::shared_ptr<Interpreter> interpreter;
    bool leased = false;
    uint64_t generation = 0;  // bumped when the slot's copy is abandoned
    // Set when `interpreter` is abandoned; its output callback reads it from any thread.
    std::shared_ptr<std::atomic<bool>> abandoned = std::make_shared<std::atomic<bool>>(false);
  };

  explicit InterpreterManager(ManagerOptions options);
  // The options of a new copy for `slot`, whose output reports `abandoned` as it is then.
  InterpreterOptions OptionsFor(int copy_id, size_t slot,
                                std::shared_ptr<const std::atomic<bool>> abandoned) const;
  Lease LeaseLocked(size_t slot);
  void Release(size_t slot, uint64_t generation);

  ManagerOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable slot_freed_;
  std::vector<Slot> slots_;
  // An abandoned copy, kept loaded until the Lease of its generation of its slot is released.
  struct Abandoned {
    size_t slot = 0;
    uint64_t generation = 0;
    std::shared_ptr<Interpreter> interpreter;
    bool reclaimable = true;  // false once an unload found threads still running in it
  };
  // Unloads an abandoned copy whose call has returned; keeps it for good if it cannot be.
  void Reclaim(Abandoned abandoned);

  std::vector<Abandoned> abandoned_;
  int next_copy_id_ = 0;
};

}  // namespace orochi::interpreters

#include "orochi/interpreters/interpreter_manager.h"

#include <algorithm>
#include <optional>
#include <thread>
#include <utility>

#include "orochi/base/check.h"

namespace orochi::interpreters {

InterpreterManager::InterpreterManager(ManagerOptions options) : options_(std::move(options)) {}

InterpreterManager::~InterpreterManager() {
  std::lock_guard lock(mutex_);
  // Abandoned copies may still have a thread inside: they are never unloaded (see Abandon).
  for (Abandoned& copy : abandoned_) {
    new std::shared_ptr<Interpreter>(std::move(copy.interpreter));  // NOLINT: leaked on purpose
  }
  for (const Slot& slot : slots_) {
    OROCHI_INTERNAL_ASSERT(!slot.leased, "an InterpreterManager was destroyed with a live Lease");
  }
  // Each Interpreter unloads itself when its last reference goes.
}

InterpreterOptions InterpreterManager::OptionsFor(
    int copy_id, size_t slot, std::shared_ptr<const std::atomic<bool>> abandoned) const {
  InterpreterOptions options;
  options.id = copy_id;
  options.host_functions = options_.host_functions;
  options.flags = options_.flags;
  if (options_.output) {
    // The flag, not the manager: an abandoned copy may write after the manager is gone.
    options.output = [output = options_.output, slot, copy_id,
                      abandoned = std::move(abandoned)](const OutputLine& line) {
      output(OutputSource{slot, copy_id, abandoned->load()}, line);
    };
  }
  return options;
}

Result<std::unique_ptr<InterpreterManager>> InterpreterManager::Create(ManagerOptions options) {
  if (options.copies == 0) return InvalidArgument("an InterpreterManager needs at least one copy");
  std::unique_ptr<InterpreterManager> manager(new InterpreterManager(std::move(options)));
  size_t count = manager->options_.copies;
  std::vector<Result<std::unique_ptr<Interpreter>>> created;
  created.reserve(count);
  for (size_t i = 0; i < count; ++i) created.emplace_back(Internal("not started"));
  manager->slots_.resize(count);
  {
    // CPython start-up is CPU-bound: one thread per copy puts every core to work.
    std::vector<std::jthread> starters;
    starters.reserve(count);
    for (size_t i = 0; i < count; ++i) {
      InterpreterOptions copy_options =
          manager->OptionsFor(static_cast<int>(i), i, manager->slots_[i].abandoned);
      starters.emplace_back([&created, i, copy_options = std::move(copy_options)]() mutable {
        created[i] = Interpreter::Create(std::move(copy_options));
      });
    }
  }
  for (size_t i = 0; i < count; ++i) {
    if (!created[i].ok()) return created[i].status();
    manager->slots_[i].interpreter = std::move(created[i]).value();
  }
  manager->next_copy_id_ = static_cast<int>(count);
  return manager;
}

InterpreterManager::Lease::Lease(InterpreterManager* manager, size_t slot, uint64_t generation,
                                 std::shared_ptr<Interpreter> interpreter)
    : manager_(manager),
      slot_(slot),
      generation_(generation),
      interpreter_(std::move(interpreter)) {}

InterpreterManager::Lease::Lease(Lease&& other) noexcept
    : manager_(std::exchange(other.manager_, nullptr)),
      slot_(other.slot_),
      generation_(other.generation_),
      interpreter_(std::move(other.interpreter_)) {}

InterpreterManager::Lease::~Lease() {
  if (manager_ != nullptr) manager_->Release(slot_, generation_);
}

InterpreterManager::Lease InterpreterManager::LeaseLocked(size_t slot) {
  slots_[slot].leased = true;
  return Lease(this, slot, slots_[slot].generation, slots_[slot].interpreter);
}

void InterpreterManager::Release(size_t slot, uint64_t generation) {
  std::optional<Abandoned> returned;
  {
    std::lock_guard lock(mutex_);
    if (slots_[slot].generation == generation) {
      slots_[slot].leased = false;
    } else {
      // A lease on an abandoned copy no longer holds the slot; its call has returned at last,
      // so no thread of ours is inside the copy any more.
      auto found = std::find_if(abandoned_.begin(), abandoned_.end(), [&](const Abandoned& a) {
        return a.slot == slot && a.generation == generation && a.reclaimable;
      });
      if (found != abandoned_.end()) {
        returned = std::move(*found);
        abandoned_.erase(found);
      }
    }
  }
  slot_freed_.notify_all();
  if (returned) Reclaim(std::move(*returned));  // outside the lock: unloading takes a while
}

void InterpreterManager::Reclaim(Abandoned abandoned) {
  if (abandoned.interpreter->Unload().ok()) return;
  // Threads the copy started itself still run in it: unmapping it would crash them.
  abandoned.reclaimable = false;
  std::lock_guard lock(mutex_);
  abandoned_.push_back(std::move(abandoned));
}

size_t InterpreterManager::abandoned_loaded() const {
  std::lock_guard lock(mutex_);
  return abandoned_.size();
}

Status InterpreterManager::Abandon(size_t slot) {
  OROCHI_INTERNAL_ASSERT(slot < slots_.size(), "Abandon: slot out of range");
  int copy_id = 0;
  {
    std::lock_guard lock(mutex_);
    copy_id = next_copy_id_++;
  }
  auto fresh_abandoned = std::make_shared<std::atomic<bool>>(false);
  Result<std::unique_ptr<Interpreter>> fresh =
      Interpreter::Create(OptionsFor(copy_id, slot, fresh_abandoned));
  if (!fresh.ok()) return fresh.status();
  std::optional<Abandoned> unused;
  {
    std::lock_guard lock(mutex_);
    Slot& current = slots_[slot];
    current.abandoned->store(true);
    current.abandoned = std::move(fresh_abandoned);
    Abandoned old{slot, current.generation, std::move(current.interpreter)};
    // Its call may have returned meanwhile: then no Lease is left to release it.
    if (current.leased) {
      abandoned_.push_back(std::move(old));
    } else {
      unused = std::move(old);
    }
    current.interpreter = std::move(fresh).value();
    current.generation++;
    current.leased = false;
  }
  slot_freed_.notify_all();
  if (unused) Reclaim(std::move(*unused));
  return Status::Ok();
}

InterpreterManager::Lease InterpreterManager::Acquire() {
  std::unique_lock lock(mutex_);
  while (true) {
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (!slots_[i].leased) return LeaseLocked(i);
    }
    slot_freed_.wait(lock);
  }
}

std::optional<InterpreterManager::Lease> InterpreterManager::TryAcquire(
    std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (!slots_[i].leased) return LeaseLocked(i);
    }
    if (slot_freed_.wait_until(lock, deadline) == std::cv_status::timeout) return std::nullopt;
  }
}

InterpreterManager::Lease InterpreterManager::AcquireSlot(size_t slot) {
  OROCHI_INTERNAL_ASSERT(slot < slots_.size(), "AcquireSlot: slot out of range");
  std::unique_lock lock(mutex_);
  slot_freed_.wait(lock, [&] { return !slots_[slot].leased; });
  return LeaseLocked(slot);
}

InterpreterManager::Lease InterpreterManager::AcquireAnyOf(std::span<const size_t> slots) {
  OROCHI_INTERNAL_ASSERT(!slots.empty(), "AcquireAnyOf: no slots given");
  std::unique_lock lock(mutex_);
  while (true) {
    for (size_t slot : slots) {
      OROCHI_INTERNAL_ASSERT(slot < slots_.size(), "AcquireAnyOf: slot out of range");
      if (!slots_[slot].leased) return LeaseLocked(slot);
    }
    slot_freed_.wait(lock);
  }
}

Status InterpreterManager::Replace(size_t slot) {
  OROCHI_INTERNAL_ASSERT(slot < slots_.size(), "Replace: slot out of range");
  std::shared_ptr<Interpreter> old;
  int copy_id = 0;
  auto fresh_abandoned = std::make_shared<std::atomic<bool>>(false);
  {
    std::unique_lock lock(mutex_);
    slot_freed_.wait(lock, [&] { return !slots_[slot].leased; });
    slots_[slot].leased = true;  // keep others out while the copy is swapped
    old = slots_[slot].interpreter;
    copy_id = next_copy_id_++;
    // The old copy is unloaded, not abandoned: nothing of it can write any more.
    slots_[slot].abandoned = fresh_abandoned;
  }
  // Unload first: whoever still holds the old copy now gets kUnavailable, never a dead table.
  Status unloaded = old->Unload();
  old.reset();
  Result<std::unique_ptr<Interpreter>> fresh =
      Interpreter::Create(OptionsFor(copy_id, slot, fresh_abandoned));
  Status started = fresh.status();
  {
    std::lock_guard lock(mutex_);
    if (started.ok()) slots_[slot].interpreter = std::move(fresh).value();
    slots_[slot].leased = false;
  }
  slot_freed_.notify_all();
  if (!started.ok()) return started;
  return unloaded;
}

}  // namespace orochi::interpreters

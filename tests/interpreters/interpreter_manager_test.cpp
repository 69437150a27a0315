// Tests of the pool of copies: leases, replacement, and that replacing copies leaks nothing.
#include "orochi/interpreters/interpreter_manager.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <pthread.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "test_support.h"

namespace orochi::interpreters {
namespace {

using namespace std::chrono_literals;
using testing::HasSubstr;

std::unique_ptr<InterpreterManager> NewManager(size_t copies) {
  ManagerOptions options;
  options.copies = copies;
  auto manager = InterpreterManager::Create(std::move(options));
  if (!manager.ok()) ADD_FAILURE() << manager.status().ToString();
  return manager.ok() ? std::move(manager).value() : nullptr;
}

TEST(InterpreterManager, RejectsZeroCopies) {
  auto manager = InterpreterManager::Create(ManagerOptions{.copies = 0});
  EXPECT_EQ(manager.status().code(), StatusCode::kInvalidArgument);
}

TEST(InterpreterManager, LeasesAreExclusive) {
  auto manager = NewManager(2);
  ASSERT_EQ(manager->size(), 2U);
  auto first = manager->Acquire();
  auto second = manager->Acquire();
  EXPECT_NE(first.slot(), second.slot());
  EXPECT_NE(first->id(), second->id());
  EXPECT_FALSE(manager->TryAcquire(50ms).has_value());
  size_t freed_slot = second.slot();
  { auto released = std::move(second); }
  auto third = manager->TryAcquire(1s);
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(third->slot(), freed_slot);
}

TEST(InterpreterManager, AcquireWaitsForARelease) {
  auto manager = NewManager(1);
  auto held = std::make_optional(manager->Acquire());
  std::jthread releaser([&] {
    std::this_thread::sleep_for(100ms);
    held.reset();
  });
  auto lease = manager->Acquire();  // blocks until the releaser lets go
  EXPECT_EQ(lease.slot(), 0U);
}

TEST(InterpreterManager, ReplaceGivesAFreshCopyAndStubsTheOldOne) {
  auto manager = NewManager(1);
  std::shared_ptr<Interpreter> old;
  {
    auto lease = manager->Acquire();
    ASSERT_OK(lease->Exec("state = 'kept in the old copy'"));
    old = lease.shared();
  }
  ASSERT_OK(manager->Replace(0));
  auto lease = manager->Acquire();
  EXPECT_NE(lease->id(), old->id());
  EXPECT_EQ(EvalString(*lease, "str(globals().get('state'))"), "None");
  // A caller that kept the old copy gets a clean error.
  Status late = old->Exec("state");
  EXPECT_EQ(late.code(), StatusCode::kUnavailable);
  EXPECT_THAT(late.message(), HasSubstr("is unloaded"));
}

// Unload and replace a copy 200 times: every cycle runs Python code that starts and joins a
// thread, so both the copy's memory and its threads must be fully gone for the counts to hold.
// pthread keys are a process-wide resource of about a thousand: a copy that leaks one makes the
// server fail after that many reloads. Counted by taking every free key and giving them back.
int CountFreePthreadKeys() {
  std::vector<pthread_key_t> keys;
  pthread_key_t key;
  while (pthread_key_create(&key, nullptr) == 0) keys.push_back(key);
  for (pthread_key_t taken : keys) pthread_key_delete(taken);
  return static_cast<int>(keys.size());
}

// Runs `code` in copy 0 of `manager` and replaces the copy, `cycles` times after a warm-up, and
// checks that descriptors, mappings and pthread keys come back to where they were and that
// resident memory grows by less than `max_growth_per_cycle`.
void ExpectReplacingLeavesNothingBehind(InterpreterManager& manager, const std::string& code,
                                        const char* label, int warmup_cycles, int cycles,
                                        long max_growth_per_cycle) {
  auto cycle = [&] {
    {
      auto lease = manager.Acquire();
      ASSERT_OK(lease->Exec(code));
    }
    ASSERT_OK(manager.Replace(0));
  };
  for (int i = 0; i < warmup_cycles; ++i) {
    cycle();
    if (testing::Test::HasFatalFailure()) return;
  }
  malloc_trim(0);
  const int keys_before = CountFreePthreadKeys();
  const int fds_before = CountOpenFds();
  const int mappings_before = CountAllMappings();
  const long resident_before = ResidentBytes();
  for (int i = 0; i < cycles; ++i) {
    cycle();
    if (testing::Test::HasFatalFailure()) return;
  }
  malloc_trim(0);
  const int keys_after = CountFreePthreadKeys();
  const int fds_after = CountOpenFds();
  const int mappings_after = CountAllMappings();
  const long resident_after = ResidentBytes();
  const long growth_per_cycle = (resident_after - resident_before) / cycles;
  std::printf(
      "%s x%d: fds %d -> %d, mappings %d -> %d, RSS %ld KB -> %ld KB (%+ld bytes per cycle)\n",
      label, cycles, fds_before, fds_after, mappings_before, mappings_after, resident_before / 1024,
      resident_after / 1024, growth_per_cycle);
  EXPECT_EQ(fds_after, fds_before);
  EXPECT_EQ(keys_after, keys_before) << "thread-local keys leaked by unloaded copies";
  EXPECT_EQ(mappings_after, mappings_before);
  EXPECT_LT(growth_per_cycle, max_growth_per_cycle);
}

TEST(InterpreterManager, ReplacingTwoHundredTimesLeaksNoFdsMappingsOrMemory) {
  auto manager = NewManager(1);
  ExpectReplacingLeavesNothingBehind(
      *manager,
      "import json, threading\n"
      "box = []\n"
      "worker = threading.Thread(target=lambda: box.append(json.dumps({'n': 1})))\n"
      "worker.start()\nworker.join()\nassert box == ['{\"n\": 1}']\n"
      // The engine bindings too: their types and functions must go with the copy.
      "import orochi, orochi.nn as nn\n"
      "layer = nn.Linear(4, 2)\n"
      "assert layer(orochi.ones(3, 4)).shape == (3, 2)",
      "replace", /*warmup_cycles=*/10, /*cycles=*/200, /*max_growth_per_cycle=*/250L * 1024);
}

// The same for copies that imported numpy and the stdlib's C modules through Orochi's ELF
// loader: each copy maps its own numpy (a dozen objects, thread-local storage included) and
// must give all of it back.
TEST(InterpreterManager, HundredCopiesThatImportedNumpyLeaveNothingBehind) {
  ManagerOptions options;
  options.copies = 1;
  options.flags.extra_paths = {"/usr/lib/python3/dist-packages"};
  auto created = InterpreterManager::Create(std::move(options));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  ExpectReplacingLeavesNothingBehind(
      **created,
      "import numpy, json, decimal, sqlite3\n"
      "a = numpy.arange(16.0).reshape(4, 4)\n"
      "assert float(numpy.linalg.det(a + numpy.eye(4))) != 0\n"
      "assert numpy.random.default_rng(1).integers(0, 10, 5).shape == (5,)\n"
      "assert json.encoder.c_make_encoder is not None\n"
      "assert sqlite3.connect(':memory:').execute('select 2').fetchone() == (2,)",
      "numpy copies", /*warmup_cycles=*/5, /*cycles=*/100, /*max_growth_per_cycle=*/512L * 1024);
}

}  // namespace
}  // namespace orochi::interpreters

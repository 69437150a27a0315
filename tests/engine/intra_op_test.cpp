// The intra-op pool (engine/cpu/thread_pool.h): results that do not depend on it, calls that
// borrow only free permits, and many callers at once. Built into engine_concurrency_test, which
// scripts/test.sh also runs under ThreadSanitizer.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "engine_test_support.h"
#include "orochi/engine/threads.h"

namespace orochi::engine {
namespace {

struct NamedOp {
  std::string name;
  std::function<Tensor()> run;
  // Float32 GEMMs and convolutions may round differently when split: each output block is its
  // own BLAS or oneDNN call. Everything else computes each element the same way on any thread.
  double tolerance = 0;
};

// Ops big enough to spread over the pool, each covering one kernel that uses it.
std::vector<NamedOp> Ops() {
  const Tensor a = RandomTensor({256, 512}, DType::kFloat32, -2, 2, 1);
  const Tensor b = RandomTensor({512}, DType::kFloat32, -2, 2, 2);
  const Tensor gamma = RandomTensor({512}, DType::kFloat32, 0.5, 1.5, 3);
  const Tensor left = RandomTensor({192, 384}, DType::kFloat32, -1, 1, 4);
  const Tensor right = RandomTensor({384, 160}, DType::kFloat32, -1, 1, 5);
  const Tensor wide = RandomTensor({4, 384}, DType::kFloat32, -1, 1, 6);
  const Tensor wide_right = RandomTensor({384, 1024}, DType::kFloat32, -1, 1, 7);
  const Tensor batched = RandomTensor({8, 64, 96}, DType::kFloat32, -1, 1, 8);
  const Tensor batched_right = RandomTensor({8, 96, 64}, DType::kFloat32, -1, 1, 9);
  const Tensor image = RandomTensor({2, 16, 40, 40}, DType::kFloat32, -1, 1, 10);
  const Tensor filters = RandomTensor({32, 16, 3, 3}, DType::kFloat32, -1, 1, 11);
  Conv2dOptions same;
  same.padding = {1, 1};
  return {
    {"add, broadcast row", [=] { return Binary(Op::add, a, b); }},
        {"mul, transposed view",
         [=] { return Binary(Op::mul, a.Transpose(0, 1), a.Transpose(0, 1)); }},
        {"exp", [=] { return Unary(Op::exp, a); }},
        {"gelu, float16", [=] { return Unary(Op::gelu, a.To(DType::kFloat16)); }},
        {"copy of a transpose", [=] { return a.Transpose(0, 1).Contiguous(); }},
        {"softmax", [=] { return Softmax(a, -1); }},
        {"softmax, float64", [=] { return Softmax(a.To(DType::kFloat64), -1); }},
        {"layer_norm", [=] { return LayerNorm(a, {512}, gamma, b); }},
        {"matmul, rows split", [=] { return Matmul(left, right); }, 1e-5},
        {"matmul, columns split", [=] { return Matmul(wide, wide_right); }, 1e-5},
        {"matmul, batched", [=] { return Matmul(batched, batched_right); }, 1e-5},
        {"matmul, float64",
         [=] { return Matmul(left.To(DType::kFloat64), right.To(DType::kFloat64)); }, 1e-12},
        {"linear, transposed weight", [=] { return Linear(left, right.Transpose(0, 1)); }, 1e-5},
#if !defined(__SANITIZE_THREAD__)  // under ThreadSanitizer oneDNN stays on its caller (onednn.cpp)
        {"conv2d (oneDNN)", [=] { return Conv2d(image, filters, {}, same); }, 1e-5},
#endif
  };
}

// Restores the default pool (every core) when a test ends, however it ends.
struct PoolSize {
  explicit PoolSize(int threads) { SetIntraOpThreads(threads); }
  ~PoolSize() { SetIntraOpThreads(0); }
  PoolSize(const PoolSize&) = delete;
  PoolSize& operator=(const PoolSize&) = delete;
};

void ExpectSame(const Tensor& actual, const Tensor& expected, double tolerance,
                const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  int64_t differing = 0;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    const double x = actual.ItemAsDouble(i);
    const double y = expected.ItemAsDouble(i);
    if (tolerance == 0 ? x != y : std::abs(x - y) > tolerance * (1 + std::abs(y))) ++differing;
  }
  EXPECT_EQ(differing, 0) << what << ": " << differing << " of " << actual.numel()
                          << " elements differ beyond " << tolerance;
}

TEST(IntraOp, ResultsDoNotDependOnThePool) {
  const std::vector<NamedOp> ops = Ops();
  std::vector<Tensor> single;
  {
    const PoolSize one(1);
    for (const NamedOp& op : ops) {
      const int64_t before = IntraOpThreadsBorrowed();
      single.push_back(op.run());
      EXPECT_EQ(IntraOpThreadsBorrowed(), before) << op.name << " borrowed from a pool of 1";
    }
  }
  const PoolSize four(4);  // more than this machine may have: permits, not cores, are counted
  for (size_t i = 0; i < ops.size(); ++i) {
    const int64_t before = IntraOpThreadsBorrowed();
    const Tensor pooled = ops[i].run();
    EXPECT_GT(IntraOpThreadsBorrowed(), before) << ops[i].name << " did not use the pool";
    ExpectSame(pooled, single[i], ops[i].tolerance, ops[i].name);
  }
  EXPECT_EQ(IntraOpThreadsFree(), 4);
}

TEST(IntraOp, SmallTensorsStayOnTheCallingThread) {
  const PoolSize four(4);
  const Tensor small = RandomTensor({16, 16}, DType::kFloat32, -1, 1, 1);
  const int64_t before = IntraOpThreadsBorrowed();
  (void)Binary(Op::add, small, small);
  (void)Softmax(small, -1);
  (void)Matmul(small, small);
  EXPECT_EQ(IntraOpThreadsBorrowed(), before);
}

TEST(IntraOp, BusyCallersLeaveNoPermitsToBorrow) {
  const PoolSize two(2);
  const Tensor a = RandomTensor({512, 512}, DType::kFloat32, -1, 1, 1);
  EXPECT_EQ(IntraOpThreadsFree(), 2);
  std::latch busy(1);
  std::latch release(1);
  std::jthread other([&] {
    const BusyCaller copy_running_a_request;
    busy.count_down();
    release.wait();
  });
  busy.wait();
  EXPECT_EQ(IntraOpThreadsFree(), 1);
  int64_t before = IntraOpThreadsBorrowed();
  (void)Unary(Op::exp, a);  // this thread and the busy one hold both permits
  EXPECT_EQ(IntraOpThreadsBorrowed(), before);
  release.count_down();
  other.join();
  EXPECT_EQ(IntraOpThreadsFree(), 2);
  before = IntraOpThreadsBorrowed();
  (void)Unary(Op::exp, a);
  EXPECT_EQ(IntraOpThreadsBorrowed(), before + 1);
  EXPECT_EQ(IntraOpThreadsFree(), 2);
}

TEST(IntraOp, CallerLimitHoldsUntilItsBusyScopeEnds) {
  const PoolSize four(4);
  const Tensor a = RandomTensor({512, 512}, DType::kFloat32, -1, 1, 1);
  EXPECT_EQ(CallerIntraOpThreads(), 4);
  SetCallerIntraOpLimit(1);
  EXPECT_EQ(CallerIntraOpThreads(), 1);
  int64_t before = IntraOpThreadsBorrowed();
  (void)Unary(Op::exp, a);
  EXPECT_EQ(IntraOpThreadsBorrowed(), before);
  {
    const BusyCaller request;  // a new call into a copy starts without the limit
    EXPECT_EQ(CallerIntraOpThreads(), 4);
    SetCallerIntraOpLimit(2);
    before = IntraOpThreadsBorrowed();
    (void)Unary(Op::exp, a);
    EXPECT_EQ(IntraOpThreadsBorrowed(), before + 1);
  }
  EXPECT_EQ(CallerIntraOpThreads(), 1);
  SetCallerIntraOpLimit(0);
  EXPECT_EQ(CallerIntraOpThreads(), 4);
  EXPECT_THROW(SetIntraOpThreads(-1), Error);
}

TEST(IntraOp, ManyCallersAtOnceGetTheSameResults) {
  const std::vector<NamedOp> ops = Ops();
  std::vector<Tensor> expected;
  {
    const PoolSize one(1);
    for (const NamedOp& op : ops) expected.push_back(op.run());
  }
  const PoolSize four(4);
  constexpr int kCallers = 8;
  constexpr int kRounds = 3;
  std::atomic<int64_t> mismatches{0};
  {
    std::vector<std::jthread> callers;
    for (int c = 0; c < kCallers; ++c) {
      callers.emplace_back([&, c] {
        const bool copy = c % 2 == 0;  // half as copies running a request, half as bare threads
        std::optional<BusyCaller> busy;
        if (copy) busy.emplace();
        for (int round = 0; round < kRounds; ++round) {
          for (size_t i = 0; i < ops.size(); ++i) {
            const Tensor result = ops[i].run();
            for (int64_t e = 0; e < result.numel(); ++e) {
              const double x = result.ItemAsDouble(e);
              const double y = expected[i].ItemAsDouble(e);
              if (std::abs(x - y) > ops[i].tolerance * (1 + std::abs(y))) ++mismatches;
            }
          }
        }
      });
    }
  }
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(IntraOpThreadsFree(), 4);  // every permit back
}

}  // namespace
}  // namespace orochi::engine

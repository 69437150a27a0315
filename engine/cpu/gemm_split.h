// How a batch of GEMMs is cut into blocks of output for the intra-op pool (matmul.cpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include "thread_pool.h"

namespace orochi::engine::cpu {

// Multiply-adds per thread from which a GEMM is split: 2^18 take about 10-20 us on one core,
// several times a helper's wake-up and a BLAS call's fixed cost, so a split never costs more than
// it saves. (Set from those costs; not tuned on an idle machine: docs/PERFORMANCE.md.)
inline constexpr int64_t kGemmGrain = int64_t{1} << 18;

// Output blocks are whole rows or whole columns, in steps of kGemmQuantum so that each block
// still fills the BLAS kernels' registers.
inline constexpr int64_t kGemmQuantum = 16;

struct GemmBlock {
  int64_t row = 0;
  int64_t column = 0;
  int64_t rows = 0;
  int64_t columns = 0;
};

struct GemmSplit {
  int64_t batch = 1;
  int64_t m = 0;
  int64_t n = 0;
  bool by_rows = true;  // blocks of rows (the taller output), else of columns
  int64_t step = 0;     // rows or columns per block
  int64_t blocks = 1;   // per matrix
  int64_t grain = 1;    // blocks per thread at least

  int64_t units() const { return batch * blocks; }
  GemmBlock Block(int64_t index) const {
    const int64_t start = index * step;
    if (by_rows) return {start, 0, std::min(step, m - start), n};
    return {0, start, m, std::min(step, n - start)};
  }
};

// A batch of `batch` [m, k] x [k, n] products: one block per matrix when the pool cannot help,
// else a few blocks per thread it might lend (whole matrices first, when the batch is large).
inline GemmSplit SplitGemm(int64_t batch, int64_t m, int64_t n, int64_t k) {
  GemmSplit split{.batch = batch, .m = m, .n = n, .by_rows = m >= n, .step = m >= n ? m : n};
  const int64_t work = batch * m * n * k;
  const int helpers = std::min(HelpersFor(work, kGemmGrain), CallerThreadLimit() - 1);
  if (helpers <= 0) return split;
  const int64_t along = split.by_rows ? m : n;
  const int64_t wanted = (4 * (int64_t{helpers} + 1) + batch - 1) / batch;  // blocks per matrix
  const int64_t most = (along + kGemmQuantum - 1) / kGemmQuantum;
  const int64_t blocks = std::clamp<int64_t>(wanted, 1, most);
  const int64_t step = (along + blocks - 1) / blocks;
  split.step = (step + kGemmQuantum - 1) / kGemmQuantum * kGemmQuantum;
  split.blocks = (along + split.step - 1) / split.step;
  const int64_t work_per_block = work / split.units();
  split.grain = std::max<int64_t>(1, kGemmGrain / std::max<int64_t>(work_per_block, 1));
  return split;
}

}  // namespace orochi::engine::cpu

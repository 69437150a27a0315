// The bytes the server holds in memory for its clients at once: request bodies, from their
// header until their answer has gone (HTTP, and gRPC's transport through its resource quota),
// and the answers of ModelStreamInfer streams waiting for their client to read them. Past the
// bound a new body is refused (503) before it is read, and a stream's answer is replaced by an
// error that says so, so that many large bodies at once (32 of 60 MB from one address got the
// process OOM-killed), or a stream client that never reads (1.1 GB of answers from one
// connection), cannot take the process's memory. A chunked body, whose size is not known
// ahead, counts as it comes.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>

namespace orochi::server {

class BufferBudget {
 public:
  explicit BufferBudget(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  // Takes `bytes` if they fit; false (nothing taken) if not.
  bool Take(uint64_t bytes) {
    uint64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (bytes > max_bytes_ || used > max_bytes_ - bytes) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
  }
  // Gives back bytes taken before.
  void Give(uint64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t max_bytes() const { return max_bytes_; }

 private:
  const uint64_t max_bytes_;
  std::atomic<uint64_t> used_{0};
};

}  // namespace orochi::server

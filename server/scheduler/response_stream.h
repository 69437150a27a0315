// The responses of one streaming request on their way from its copy to its client: a bounded
// buffer between the scheduler's worker (the producer) and the transport (the consumer, which
// writes one response to the connection at a time).
//
// The producer pushes a response only while the buffer has room; while it is full the stream's
// generator or sequence is not advanced (the worker waits, or steps the other sequences), so a
// slow reader never makes the server buffer without bound. The end of the stream (its final
// status) always fits. The consumer cancels the stream when its client goes; the producer then
// stops it inside its copy.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "orochi/base/status.h"
#include "orochi/interpreters/model.h"

namespace orochi::server {

class ResponseStream {
 public:
  using Clock = std::chrono::steady_clock;
  using Response = std::vector<interpreters::NamedTensor>;

  explicit ResponseStream(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  // --- producer (the scheduler) ---
  bool HasRoom() const;
  // Queues a response; false (and dropped) once the stream was cancelled or has ended.
  bool Push(Response response);
  // Waits until the buffer has room, the stream is cancelled, or `until`; true when there is
  // room.
  bool WaitForRoom(Clock::time_point until);
  // The last thing the producer does: the stream's final status. Later calls are ignored.
  void End(Status status);

  // --- consumer (the transport) ---
  // Called (on the producer's thread, without the stream's lock) after each Push and at End:
  // the consumer then takes what is ready with Pop. Set before the stream is submitted.
  void SetListener(std::function<void()> listener);
  struct Item {
    std::optional<Response> response;  // else the end
    Status end;
  };
  // The next response, or the end once every response has been taken; nullopt when nothing is
  // ready yet (or the end was taken already).
  std::optional<Item> Pop();
  // The client went: the producer stops the stream at its next chance.
  void Cancel();
  bool cancelled() const;

 private:
  void Notify();

  const size_t capacity_;
  mutable std::mutex mutex_;
  std::condition_variable room_;
  std::deque<Response> responses_;
  std::optional<Status> end_;
  bool end_taken_ = false;
  bool cancelled_ = false;
  std::function<void()> listener_;
};

}  // namespace orochi::server

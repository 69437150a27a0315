#include "response_stream.h"

#include <utility>

namespace orochi::server {

bool ResponseStream::HasRoom() const {
  std::lock_guard lock(mutex_);
  return responses_.size() < capacity_;
}

bool ResponseStream::Push(Response response) {
  {
    std::lock_guard lock(mutex_);
    if (cancelled_ || end_) return false;
    responses_.push_back(std::move(response));
  }
  Notify();
  return true;
}

bool ResponseStream::WaitForRoom(Clock::time_point until) {
  std::unique_lock lock(mutex_);
  room_.wait_until(lock, until, [&] { return cancelled_ || responses_.size() < capacity_; });
  return !cancelled_ && responses_.size() < capacity_;
}

void ResponseStream::End(Status status) {
  {
    std::lock_guard lock(mutex_);
    if (end_) return;
    end_ = std::move(status);
  }
  Notify();
}

void ResponseStream::SetListener(std::function<void()> listener) {
  std::lock_guard lock(mutex_);
  listener_ = std::move(listener);
}

std::optional<ResponseStream::Item> ResponseStream::Pop() {
  std::lock_guard lock(mutex_);
  if (!responses_.empty()) {
    Item item{std::move(responses_.front()), Status::Ok()};
    responses_.pop_front();
    room_.notify_all();
    return item;
  }
  if (!end_ || end_taken_) return std::nullopt;
  end_taken_ = true;
  return Item{std::nullopt, *end_};
}

void ResponseStream::Cancel() {
  std::lock_guard lock(mutex_);
  cancelled_ = true;
  responses_.clear();
  room_.notify_all();
}

bool ResponseStream::cancelled() const {
  std::lock_guard lock(mutex_);
  return cancelled_;
}

void ResponseStream::Notify() {
  std::function<void()> listener;
  {
    std::lock_guard lock(mutex_);
    listener = listener_;
  }
  if (listener) listener();
}

}  // namespace orochi::server

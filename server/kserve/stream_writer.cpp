#include "stream_writer.h"

#include <string_view>
#include <utility>

namespace orochi::server::kserve {

namespace bhttp = boost::beast::http;

namespace {
// An SSE comment, which every event-stream reader skips (see http::Responder::Stream).
constexpr std::string_view kHangUpProbe = ":\n\n";
}  // namespace

StreamWriter::StreamWriter(http::Responder respond, bool events)
    : respond_(std::move(respond)), events_(events) {}

void StreamWriter::Run(InferenceRunner& runner, InferenceCall call, size_t buffered) {
  stream_ = std::make_shared<ResponseStream>(buffered);
  model_ = call.model;
  stream_->SetListener([weak = weak_from_this()] {
    if (auto self = weak.lock()) self->Pump();
  });
  call.client_gone = [respond = respond_, stream = stream_] {
    return respond.client_gone() || stream->cancelled();
  };
  call.stream = stream_;
  runner.Run(std::move(call), [self = shared_from_this()](Result<InferenceResult> result) {
    self->Done(std::move(result));
  });
}

void StreamWriter::Done(Result<InferenceResult> result) {
  {
    std::lock_guard lock(mutex_);
    if (result.ok()) model_ = result->model;
  }
  if (result.ok() && !result->outputs.empty()) (void)stream_->Push(std::move(result->outputs));
  stream_->End(result.ok() ? Status::Ok() : result.status());
}

void StreamWriter::Pump() {
  std::unique_lock lock(mutex_);
  while (!sending_) {
    std::optional<ResponseStream::Item> item = stream_->Pop();
    if (!item) return;
    if (!events_) {
      if (item->response) {
        Collect(*model_, *item->response);
        continue;
      }
      http::Response answer = item->end.ok() ? Answer() : Failure(item->end);
      lock.unlock();
      respond_(std::move(answer));
      return;
    }
    if (body_ == nullptr) {
      if (!item->response && !item->end.ok()) {  // refused before any response: a status
        http::Response failure = Failure(item->end);
        lock.unlock();
        respond_(std::move(failure));
        return;
      }
      http::Response header{bhttp::status::ok, 11};
      header.set(bhttp::field::content_type, "text/event-stream");
      header.set(bhttp::field::cache_control, "no-cache");
      body_ = respond_.Stream(std::move(header), std::string(kHangUpProbe));
      if (body_ == nullptr) return;
    }
    std::shared_ptr<http::BodyStream> body = body_;
    // Every response ready now goes out in one write: a writer that fell behind a step-batched
    // stream catches up with one send (and one wake-up of the reader) instead of one per token.
    std::string events;
    bool ended = false;
    for (; item; item = stream_->Pop()) {
      if (!item->response) {
        events += Closing(item->end);
        ended = true;
        break;
      }
      events += Event(*model_, *item->response);
    }
    if (ended) {
      lock.unlock();
      if (!events.empty()) body->Send(std::move(events), nullptr);
      body->End();
      return;
    }
    if (events.empty()) continue;
    sending_ = true;
    lock.unlock();
    body->Send(std::move(events), [self = shared_from_this()](bool ok) {
      if (!ok) self->stream_->Cancel();  // the client is gone: the model stops
      {
        std::lock_guard relock(self->mutex_);
        self->sending_ = false;
      }
      self->Pump();
    });
    return;
  }
}

}  // namespace orochi::server::kserve

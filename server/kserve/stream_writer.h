// Carries a model's responses to an HTTP client, for the endpoints that serve streaming models
// (Triton's generate extension, the OpenAI-compatible one): as Server-Sent Events, one part
// written at a time (the stream's buffer holds the rest, and its model waits while that is
// full), or once, combined, when the request asked for one answer. A subclass says how its
// protocol writes a response, the end and a failure.
//
// Thread-safety: the producer (a scheduler worker) and the transport call in on their own
// threads; the subclass's hooks run one at a time, under the writer's lock.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "http/http_server.h"
#include "inference.h"

namespace orochi::server::kserve {

class StreamWriter : public std::enable_shared_from_this<StreamWriter> {
 public:
  // `events`: answer as Server-Sent Events; else once, after the last response.
  StreamWriter(http::Responder respond, bool events);
  virtual ~StreamWriter() = default;
  StreamWriter(const StreamWriter&) = delete;
  StreamWriter& operator=(const StreamWriter&) = delete;

  // Submits `call` (its stream and client_gone are the writer's) and answers the client with
  // what comes back. `buffered` responses wait for a slow reader before the model is held.
  void Run(InferenceRunner& runner, InferenceCall call, size_t buffered);

 protected:
  using Response = ResponseStream::Response;
  // Events: the text sent for one response ("" for nothing).
  virtual std::string Event(const ServedModel& model, const Response& response) = 0;
  // Events: the text sent after the last response, or after a failure once events were sent.
  virtual std::string Closing(const Status& end) = 0;
  // One answer: takes a response; then, after the last one, the answer.
  virtual void Collect(const ServedModel& model, const Response& response) = 0;
  virtual http::Response Answer() = 0;
  // The answer to a request that failed before it could be answered with events, or at all.
  virtual http::Response Failure(const Status& error) = 0;

 private:
  // The model's answer: a model that does not stream gives its one response here.
  void Done(Result<InferenceResult> result);
  void Pump();

  http::Responder respond_;
  const bool events_;
  std::shared_ptr<ResponseStream> stream_;
  std::mutex mutex_;
  std::shared_ptr<const ServedModel> model_;
  std::shared_ptr<http::BodyStream> body_;
  bool sending_ = false;
};

}  // namespace orochi::server::kserve

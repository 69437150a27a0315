// The supervisor's liveness probe: whether the serving process still answers on each of its
// ports. A process can be alive and serve nothing: frozen (a tracer's stop), its descriptors
// used up, a listener made deaf by an option model code set on it, accepts blocked. None of
// these ends the process, so no wait of the supervisor's sees them; an answer on the port does.
//
// Once a second each port is asked: an HTTP port with `OPTIONS *` (which the HTTP transport
// answers itself with 204, before any route, token or log), gRPC's with the HTTP/2 connection
// preface (which the server answers with its SETTINGS). Any answer counts, a connection closed
// or reset after it was accepted too (a listener at its connection limit); a port with none
// for the timeout is unanswered (Unanswered), and the supervisor restarts the serving process
// on fresh listeners.
//
// Driven by the supervisor's one poll loop (no thread of its own: the supervisor forks, and a
// second thread could hold a lock the child then waits on for ever). Not thread-safe.
#pragma once

#include <poll.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace orochi::server {

class LivenessProbe {
 public:
  using Clock = std::chrono::steady_clock;
  struct Port {
    std::string address;  // where it listens; an unspecified address is asked on loopback
    int port = 0;
    bool http2 = false;  // gRPC's
  };

  LivenessProbe() = default;
  ~LivenessProbe() { Stop(); }
  LivenessProbe(const LivenessProbe&) = delete;
  LivenessProbe& operator=(const LivenessProbe&) = delete;

  // Starts asking `ports`, at once, each counted as answered now for Unanswered (the serving
  // process just said it serves).
  void Start(std::vector<Port> ports, Clock::time_point now);
  // Closes the probes in flight; nothing is asked until the next Start.
  void Stop();
  bool running() const { return running_; }

  // The descriptors to poll, with their events, appended to `watched`; Advance takes the same
  // entries back, from `first` on.
  void AddTo(std::vector<pollfd>& watched) const;
  // After poll: reads what the probes in flight got, and sends new ones when they are due.
  void Advance(const std::vector<pollfd>& watched, size_t first, Clock::time_point now);
  // Whether every port has answered since Start: the serving process serves, whatever it
  // said (model code can write its report lines too).
  bool AllAnswered() const;
  // The first port that has had no answer for `timeout`, if any.
  std::optional<int> Unanswered(Clock::duration timeout, Clock::time_point now) const;
  // How long poll may wait before Advance has something to do; -1: forever (not running).
  int WaitMs(Clock::time_point now) const;

 private:
  struct State {
    Port port;
    int fd = -1;                      // the probe in flight, or -1
    bool sent = false;                // its request written
    Clock::time_point asked_at{};     // when it was sent off
    Clock::time_point answered_at{};  // the last answer
    bool answered = false;            // an answer since Start
  };
  void Ask(State& state, Clock::time_point now);
  static void Close(State& state);

  std::vector<State> states_;
  bool running_ = false;
};

}  // namespace orochi::server

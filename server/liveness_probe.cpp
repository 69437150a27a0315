#include "liveness_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string_view>
#include <utility>

namespace orochi::server {
namespace {

constexpr std::chrono::milliseconds kInterval{1000};

constexpr std::string_view kHttpRequest =
    "OPTIONS * HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
// The client connection preface and an empty SETTINGS frame (RFC 9113, 3.4 and 6.5).
constexpr char kHttp2Preface[] =
    "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    "\x00\x00\x00\x04\x00\x00\x00\x00\x00";
constexpr std::string_view kHttp2Request(kHttp2Preface, sizeof(kHttp2Preface) - 1);

// A non-blocking socket connecting to `address`:`port` (an unspecified address on loopback);
// -1 if it cannot even be begun.
int ConnectTo(const std::string& address, int port) {
  sockaddr_storage storage{};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  const std::string target = address == "0.0.0.0" ? "127.0.0.1" : address == "::" ? "::1" : address;
  if (::inet_pton(AF_INET, target.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    length = sizeof(sockaddr_in);
  } else if (::inet_pton(AF_INET6, target.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    length = sizeof(sockaddr_in6);
  } else {
    return -1;
  }
  const int fd = ::socket(storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&storage), length) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

void LivenessProbe::Start(std::vector<Port> ports, Clock::time_point now) {
  Stop();
  for (Port& port : ports) {
    State state;
    state.port = std::move(port);
    state.answered_at = now;
    state.asked_at = now - kInterval;  // the first question at once
    states_.push_back(std::move(state));
  }
  running_ = true;
}

void LivenessProbe::Stop() {
  for (State& state : states_) Close(state);
  states_.clear();
  running_ = false;
}

void LivenessProbe::AddTo(std::vector<pollfd>& watched) const {
  for (const State& state : states_) {
    if (state.fd >= 0) {
      watched.push_back({state.fd, static_cast<short>(state.sent ? POLLIN : POLLOUT), 0});
    }
  }
}

void LivenessProbe::Advance(const std::vector<pollfd>& watched, size_t first,
                            Clock::time_point now) {
  size_t at = first;
  for (State& state : states_) {
    if (state.fd < 0) continue;
    const short events = at < watched.size() ? watched[at].revents : short{0};
    ++at;
    if (events == 0) continue;
    if (!state.sent) {
      int error = 0;
      socklen_t length = sizeof(error);
      ::getsockopt(state.fd, SOL_SOCKET, SO_ERROR, &error, &length);
      const std::string_view request = state.port.http2 ? kHttp2Request : kHttpRequest;
      if (error != 0 || (events & POLLOUT) == 0 ||
          ::send(state.fd, request.data(), request.size(), MSG_NOSIGNAL) !=
              static_cast<ssize_t>(request.size())) {
        Close(state);  // refused, or no room for a few bytes: no answer this round
        continue;
      }
      state.sent = true;
      continue;
    }
    // Bytes, or a connection closed or reset once accepted: something tends the port (a
    // listener at its connection limit closes newcomers at once, and that is an answer too).
    // What a process that no longer accepts leaves is silence, until the timeout.
    char answer[256];
    const ssize_t got = ::recv(state.fd, answer, sizeof(answer), 0);
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (got >= 0 || errno == ECONNRESET) {
      state.answered_at = now;
      state.answered = true;
    }
    Close(state);
  }
  for (State& state : states_) {
    if (state.fd < 0 && now - state.asked_at >= kInterval) Ask(state, now);
  }
}

bool LivenessProbe::AllAnswered() const {
  return running_ && std::all_of(states_.begin(), states_.end(),
                                 [](const State& state) { return state.answered; });
}

std::optional<int> LivenessProbe::Unanswered(Clock::duration timeout, Clock::time_point now) const {
  for (const State& state : states_) {
    if (now - state.answered_at > timeout) return state.port.port;
  }
  return std::nullopt;
}

int LivenessProbe::WaitMs(Clock::time_point now) const {
  if (!running_) return -1;
  Clock::duration wait = kInterval;
  for (const State& state : states_) {
    if (state.fd < 0) wait = std::min<Clock::duration>(wait, state.asked_at + kInterval - now);
  }
  return static_cast<int>(
      std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(wait).count()));
}

void LivenessProbe::Ask(State& state, Clock::time_point now) {
  state.asked_at = now;
  state.sent = false;
  state.fd = ConnectTo(state.port.address, state.port.port);
}

void LivenessProbe::Close(State& state) {
  if (state.fd >= 0) ::close(state.fd);
  state.fd = -1;
  state.sent = false;
}

}  // namespace orochi::server

#include "listening_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "log.h"

namespace orochi::server {

Result<int> BindListener(const std::string& address, int port) {
  sockaddr_storage storage{};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  if (inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    length = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    length = sizeof(sockaddr_in6);
  } else {
    return InvalidArgument("'" + address + "' is not an IP address");
  }
  const int fd = ::socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable(std::string("cannot create a socket: ") + std::strerror(errno));
  const int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&storage), length) != 0 ||
      ::listen(fd, SOMAXCONN) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Unavailable("cannot listen on " + address + ":" + std::to_string(port) + ": " + why);
  }
  return fd;
}

int BoundPort(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return 0;
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  }
  return 0;
}

bool ListenerIntact(int fd) {
  int listening = 0;
  int shared = 0;
  socklen_t length = sizeof(int);
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) != 0 || listening == 0) {
    return false;
  }
  length = sizeof(int);
  return ::getsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &shared, &length) == 0 && shared == 0;
}

bool TendListener(int fd) {
  if (!ListenerIntact(fd) || ::listen(fd, SOMAXCONN) != 0) return false;
  // The flag lives on the open file description, which model code shares: cleared, accepts
  // block the thread that makes them (an I/O thread of every HTTP port) until a client comes.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0 && (flags & O_NONBLOCK) == 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  return true;
}

namespace {

// The ports this process listens on (0: a free entry), and the highest descriptor a listener or
// connection has had, for CloseServerSocketsInChild. Plain atomics: the fork handler may take
// no lock.
constexpr size_t kMaxListeners = 64;
std::array<std::atomic<int>, kMaxListeners> listening_ports{};
std::atomic<int> highest_socket{-1};

// The fork handler (see RegisterListeningPort). Only getsockname, getsockopt and close, which
// are async-signal-safe, as the child of a threaded process requires.
void CloseServerSocketsInChild() {
  const int highest = highest_socket.load(std::memory_order_relaxed);
  for (int fd = 0; fd <= highest; ++fd) {
    const int port = BoundPort(fd);  // async-signal-safe: getsockname only
    int type = 0;
    socklen_t type_length = sizeof(type);
    if (port == 0 || ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_length) != 0 ||
        type != SOCK_STREAM) {
      continue;
    }
    for (const std::atomic<int>& listening : listening_ports) {
      if (listening.load(std::memory_order_relaxed) == port) {
        ::close(fd);
        break;
      }
    }
  }
}

}  // namespace

void NoteServerSocket(int fd) {
  int seen = highest_socket.load(std::memory_order_relaxed);
  while (fd > seen && !highest_socket.compare_exchange_weak(seen, fd)) {
  }
}

void RegisterListeningPort(int fd, int port) {
  static std::once_flag registered;
  std::call_once(registered, [] { ::pthread_atfork(nullptr, nullptr, CloseServerSocketsInChild); });
  NoteServerSocket(fd);
  for (std::atomic<int>& entry : listening_ports) {
    int free = 0;
    if (entry.compare_exchange_strong(free, port)) return;
  }
}

void UnregisterListeningPort(int port) {
  for (std::atomic<int>& entry : listening_ports) {
    int expected = port;
    if (entry.compare_exchange_strong(expected, 0)) return;
  }
}

namespace {

std::mutex listener_lost_mutex;
std::function<void()> listener_lost_handler;
bool listener_lost_reported = false;

}  // namespace

void SetListenerLostHandler(std::function<void()> handler) {
  std::lock_guard lock(listener_lost_mutex);
  listener_lost_handler = std::move(handler);
}

void ReportListenerLost(int port) {
  std::function<void()> handler;
  {
    std::lock_guard lock(listener_lost_mutex);
    Log(LogLevel::kError,
        "a listening socket was shut down or shared (SO_REUSEPORT) by model code; the serving "
        "process exits so that the supervisor binds the port again",
        {{"port", std::to_string(port), false}});
    if (listener_lost_reported) return;
    listener_lost_reported = true;
    handler = listener_lost_handler;
  }
  if (!handler) std::_Exit(kListenerLostExitStatus);
  handler();
}

}  // namespace orochi::server

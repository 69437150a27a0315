#include "peer_process.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <vector>

namespace orochi::server {
namespace {

// A descriptor closed when it goes out of scope.
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

struct PeerAddress {
  int family = AF_INET;
  std::array<uint32_t, 4> words{};  // as inet_diag_sockid holds it, in network order
};

// "127.0.0.1", "::1", "[::1]" and "::ffff:127.0.0.1" (an IPv4 peer of a dual-stack listener,
// whose own socket is an AF_INET one).
std::optional<PeerAddress> ParsePeerAddress(std::string_view text) {
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    text = text.substr(1, text.size() - 2);
  }
  const std::string address(text);
  PeerAddress parsed;
  in_addr v4{};
  if (::inet_pton(AF_INET, address.c_str(), &v4) == 1) {
    parsed.words[0] = v4.s_addr;
    return parsed;
  }
  in6_addr v6{};
  if (::inet_pton(AF_INET6, address.c_str(), &v6) != 1) return std::nullopt;
  if (IN6_IS_ADDR_V4MAPPED(&v6)) {
    std::memcpy(parsed.words.data(), &v6.s6_addr[12], 4);
    return parsed;
  }
  parsed.family = AF_INET6;
  std::memcpy(parsed.words.data(), &v6.s6_addr[0], 16);
  return parsed;
}

struct SocketSearch {
  bool found = false;
  unsigned inode = 0;
};

// The socket on this host whose own end is `peer`:`peer_port` and whose other end is port
// `server_port`: the client's end of the connection (the server's own end has the ports the
// other way round). A dump of the family's TCP sockets, matched here.
std::optional<SocketSearch> FindThroughSockDiag(const PeerAddress& peer, uint16_t peer_port,
                                                uint16_t server_port, std::string* error) {
  Descriptor netlink(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (netlink.get() < 0) {
    *error = std::string("cannot open a sock_diag socket: ") + std::strerror(errno);
    return std::nullopt;
  }
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } message{};
  message.header.nlmsg_len = sizeof(message);
  message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  message.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;  // NOLINT(hicpp-signed-bitwise)
  message.request.sdiag_family = static_cast<uint8_t>(peer.family);
  message.request.sdiag_protocol = IPPROTO_TCP;
  message.request.idiag_states = ~0U;  // closing ones too: they have no inode, and say so
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (::sendto(netlink.get(), &message, sizeof(message), 0, reinterpret_cast<sockaddr*>(&kernel),
               sizeof(kernel)) < 0) {
    *error = std::string("cannot ask the kernel for its TCP sockets: ") + std::strerror(errno);
    return std::nullopt;
  }
  const size_t address_bytes = peer.family == AF_INET ? 4 : 16;
  SocketSearch search;
  std::vector<char> buffer(size_t{64} << 10);
  for (;;) {
    const ssize_t got = ::recv(netlink.get(), buffer.data(), buffer.size(), 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      *error = std::string("cannot read the kernel's TCP sockets: ") + std::strerror(errno);
      return std::nullopt;
    }
    auto remaining = static_cast<int>(got);
    for (auto* header = reinterpret_cast<nlmsghdr*>(buffer.data()); NLMSG_OK(header, remaining);
         header = NLMSG_NEXT(header, remaining)) {
      if (header->nlmsg_type == NLMSG_DONE) return search;
      if (header->nlmsg_type == NLMSG_ERROR) {
        const auto* failure = static_cast<const nlmsgerr*>(NLMSG_DATA(header));
        *error = std::string("the kernel refused to list its TCP sockets: ") +
                 std::strerror(-failure->error);
        return std::nullopt;
      }
      const auto* entry = static_cast<const inet_diag_msg*>(NLMSG_DATA(header));
      if (search.found || ntohs(entry->id.idiag_sport) != peer_port ||
          ntohs(entry->id.idiag_dport) != server_port ||
          std::memcmp(entry->id.idiag_src, peer.words.data(), address_bytes) != 0) {
        continue;
      }
      search.found = true;
      search.inode = entry->idiag_inode;
    }
  }
}

// The same search in /proc/net/tcp or tcp6, for where netlink sockets are not allowed (systemd's
// RestrictAddressFamilies, some sandboxes): each line has the local and remote address (the
// words of the address as the kernel holds them, in hex, then the port), the state, and the
// inode in its tenth field.
std::optional<SocketSearch> FindThroughProcNet(const PeerAddress& peer, uint16_t peer_port,
                                               uint16_t server_port, std::string* error) {
  const char* path = peer.family == AF_INET ? "/proc/net/tcp" : "/proc/net/tcp6";
  std::ifstream table(path);
  if (!table) {
    *error += std::string("; cannot read ") + path;
    return std::nullopt;
  }
  const size_t words = peer.family == AF_INET ? 1 : 4;
  auto parse_end = [words](const std::string& field, std::array<uint32_t, 4>& address,
                           unsigned long& port) {
    const size_t colon = field.find(':');
    if (colon != words * 8) return false;
    for (size_t i = 0; i < words; ++i) {
      address[i] = static_cast<uint32_t>(std::stoul(field.substr(i * 8, 8), nullptr, 16));
    }
    port = std::stoul(field.substr(colon + 1), nullptr, 16);
    return true;
  };
  SocketSearch search;
  std::string line;
  std::getline(table, line);  // the heading
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string slot;
    std::string local;
    std::string remote;
    std::string skipped;
    unsigned long inode = 0;
    if (!(fields >> slot >> local >> remote)) continue;
    // The state, the queues, the timer, retransmits, the uid and the timeout; then the inode.
    for (int i = 0; i < 6; ++i) fields >> skipped;
    if (!(fields >> inode)) continue;
    std::array<uint32_t, 4> local_address{};
    std::array<uint32_t, 4> remote_address{};
    unsigned long local_port = 0;
    unsigned long remote_port = 0;
    try {
      if (!parse_end(local, local_address, local_port) ||
          !parse_end(remote, remote_address, remote_port)) {
        continue;
      }
    } catch (const std::exception&) {
      continue;
    }
    if (local_port == peer_port && remote_port == server_port &&
        std::equal(local_address.begin(), local_address.begin() + static_cast<long>(words),
                   peer.words.begin())) {
      search.found = true;
      search.inode = static_cast<unsigned>(inode);
      break;
    }
  }
  return search;
}

std::optional<SocketSearch> FindClientSocket(const PeerAddress& peer, uint16_t peer_port,
                                             uint16_t server_port, bool sock_diag,
                                             std::string* error) {
  if (sock_diag) {
    if (std::optional<SocketSearch> found =
            FindThroughSockDiag(peer, peer_port, server_port, error)) {
      return found;
    }
  }
  return FindThroughProcNet(peer, peer_port, server_port, error);
}

// Whether the kernel lists each thread's children (/proc/<pid>/task/<tid>/children, which
// CONFIG_PROC_CHILDREN brings): then a walk of a process tree reads that tree's files only,
// not every process's.
bool KernelListsChildren() {
  static const bool lists = [] {
    const std::string own = "/proc/self/task/" + std::to_string(::gettid()) + "/children";
    return ::access(own.c_str(), R_OK) == 0;
  }();
  return lists;
}

// The children of every thread of `pid`, from the children files; none if it is gone.
std::vector<pid_t> ListedChildren(pid_t pid) {
  std::vector<pid_t> children;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  DIR* directory = ::opendir(tasks.c_str());
  if (directory == nullptr) return children;
  while (const dirent* entry = ::readdir(directory)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream listed(tasks + "/" + entry->d_name + "/children");
    for (pid_t child = 0; listed >> child;) children.push_back(child);
  }
  ::closedir(directory);
  return children;
}

// Every process's parent, from /proc/<pid>/stat (the field after the command, whose name may
// hold spaces and parentheses, so read from the last ')').
std::map<pid_t, std::vector<pid_t>> ChildrenByParent() {
  std::map<pid_t, std::vector<pid_t>> children;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return children;
  while (const dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::ifstream stat(std::string("/proc/") + entry->d_name + "/stat");
    std::string line;
    if (!std::getline(stat, line)) continue;  // gone meanwhile
    const size_t command_end = line.rfind(')');
    if (command_end == std::string::npos) continue;
    std::istringstream fields(line.substr(command_end + 1));
    std::string state;
    long parent = 0;
    if (fields >> state >> parent) {
      children[static_cast<pid_t>(parent)].push_back(static_cast<pid_t>(pid));
    }
  }
  ::closedir(proc);
  return children;
}

// When `pid` started, in clock ticks since boot (/proc/<pid>/stat's 22nd field); 0 if gone.
uint64_t StartTime(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return 0;
  const size_t command_end = line.rfind(')');
  if (command_end == std::string::npos) return 0;
  std::istringstream fields(line.substr(command_end + 1));
  std::string field;
  for (int skipped = 0; skipped < 19 && fields >> field; ++skipped) {  // fields 3 to 21
  }
  uint64_t start = 0;
  fields >> start;
  return start;
}

// "socket:[inode]" for each of `inodes`: what /proc/<pid>/fd links to them read.
std::vector<std::string> SocketLinks(const std::vector<unsigned long>& inodes) {
  std::vector<std::string> links;
  links.reserve(inodes.size());
  for (unsigned long inode : inodes) links.push_back("socket:[" + std::to_string(inode) + "]");
  return links;
}

// Whether `pid` holds one of the sockets `wanted` (SocketLinks).
bool HoldsSocketLink(pid_t pid, const std::vector<std::string>& wanted) {
  const std::string directory = "/proc/" + std::to_string(pid) + "/fd";
  DIR* descriptors = ::opendir(directory.c_str());
  if (descriptors == nullptr) return false;  // gone, or not ours to read (the supervisor)
  bool held = false;
  std::array<char, 64> target{};
  while (const dirent* entry = ::readdir(descriptors)) {
    if (entry->d_name[0] == '.') continue;
    const std::string link = directory + "/" + entry->d_name;
    const ssize_t length = ::readlink(link.c_str(), target.data(), target.size());
    if (length <= 0) continue;
    const std::string_view name(target.data(), static_cast<size_t>(length));
    if (std::find(wanted.begin(), wanted.end(), name) != wanted.end()) {
      held = true;
      break;
    }
  }
  ::closedir(descriptors);
  return held;
}

}  // namespace

bool HoldsSocket(pid_t pid, const std::vector<unsigned long>& inodes) {
  return !inodes.empty() && HoldsSocketLink(pid, SocketLinks(inodes));
}

std::vector<pid_t> ProcessesHoldingSockets(pid_t root, const std::vector<unsigned long>& inodes,
                                           const std::vector<pid_t>& except, size_t most) {
  const std::vector<std::string> wanted = SocketLinks(inodes);
  std::vector<pid_t> holders;
  if (wanted.empty()) return holders;
  for (const pid_t pid : Descendants(root)) {
    if (holders.size() >= most) break;
    if (std::find(except.begin(), except.end(), pid) == except.end() &&
        HoldsSocketLink(pid, wanted)) {
      holders.push_back(pid);
    }
  }
  return holders;
}

std::vector<pid_t> ChildrenOf(pid_t pid) {
  if (KernelListsChildren()) return ListedChildren(pid);
  std::map<pid_t, std::vector<pid_t>> children = ChildrenByParent();
  return std::move(children[pid]);
}

std::vector<pid_t> Descendants(pid_t root) {
  std::optional<std::map<pid_t, std::vector<pid_t>>> by_parent;
  if (!KernelListsChildren()) by_parent = ChildrenByParent();
  std::vector<pid_t> found;
  std::set<pid_t> seen;
  std::vector<pid_t> pending{root};
  while (!pending.empty()) {
    const pid_t pid = pending.back();
    pending.pop_back();
    if (!seen.insert(pid).second) continue;  // met twice in a tree that changed as it was read
    found.push_back(pid);
    if (!by_parent) {
      const std::vector<pid_t> children = ListedChildren(pid);
      pending.insert(pending.end(), children.begin(), children.end());
    } else if (auto listed = by_parent->find(pid); listed != by_parent->end()) {
      pending.insert(pending.end(), listed->second.begin(), listed->second.end());
    }
  }
  return found;
}

std::vector<pid_t> ProcessesUnder(pid_t root, const std::vector<pid_t>& except) {
  std::vector<std::pair<uint64_t, pid_t>> found;  // (start time, pid)
  for (const pid_t pid : Descendants(root)) {
    if (std::find(except.begin(), except.end(), pid) == except.end()) {
      found.emplace_back(StartTime(pid), pid);
    }
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  std::vector<pid_t> youngest_first;
  youngest_first.reserve(found.size());
  for (const auto& [start, pid] : found) youngest_first.push_back(pid);
  return youngest_first;
}

std::optional<std::string> ProcessTreePeers::Refusal(const std::string& peer_address,
                                                     uint16_t peer_port,
                                                     uint16_t server_port) const {
  const std::optional<PeerAddress> peer = ParsePeerAddress(peer_address);
  if (!peer) return "cannot tell where the connection comes from (peer '" + peer_address + "')";
  std::string error;
  std::optional<SocketSearch> client =
      FindClientSocket(*peer, peer_port, server_port, sock_diag_, &error);
  if (client && !client->found && peer->family == AF_INET) {
    // An IPv6 socket connected to an IPv4 address ("::ffff:127.0.0.1", as gRPC's clients make
    // them) shows up to the server as an IPv4 peer.
    PeerAddress mapped{AF_INET6, {0, 0, htonl(0xffff), peer->words[0]}};
    client = FindClientSocket(mapped, peer_port, server_port, sock_diag_, &error);
  }
  if (!client) return "cannot tell which process the connection comes from: " + error;
  if (!client->found) return std::nullopt;  // another host's
  if (client->inode == 0) {
    return "the connection's other end on this host is held by no process (closed before the "
           "answer): cannot tell whether model code sent it";
  }
  if (const std::vector<pid_t> holder =
          ProcessesHoldingSockets(tree_root_, {client->inode}, {}, /*most=*/1);
      !holder.empty()) {
    return "the connection comes from process " + std::to_string(holder.front()) +
           ", which the server started (model code, or a process model code started): model "
           "code may not manage models";
  }
  return std::nullopt;
}

}  // namespace orochi::server

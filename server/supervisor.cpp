#include "orochi/server/supervisor.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "culprit_search.h"
#include "exit_guard.h"
#include "listening_socket.h"
#include "liveness_probe.h"
#include "log.h"
#include "orochi/base/crash_record.h"
#include "orochi/interpreters/interpreter.h"
#include "orochi/packaging/model_key.h"
#include "orochi/server/server.h"
#include "peer_process.h"
#include "repository/repository_store.h"
#include "supervisor_shield.h"

namespace orochi::server {
namespace {

using Clock = std::chrono::steady_clock;

// A restart is immediate, unless the serving processes keep dying before they serve, soon after
// they start: from the kQuickCrashesAllowed-th such death in a row, the next start waits
// kFirstRestartDelay, doubling up to kLongestRestartDelay, so that a process that cannot start
// does not take every core restarting. A process that served is restarted at once however soon
// it died (a crash that a client's request or a model's thread causes again and again): waiting
// would only add to the time nothing is served.
constexpr int kQuickCrashesAllowed = 3;
constexpr std::chrono::milliseconds kFirstRestartDelay{100};
constexpr std::chrono::milliseconds kLongestRestartDelay{5000};
// The longest the serving process's teardown may take once it has drained
// (EndUnlessTornDownWithin).
constexpr std::chrono::seconds kLongestTeardown{10};
// A serving process that ran this long before dying was not in a crash loop.
constexpr std::chrono::seconds kStableAfter{30};
// The most a round of the search for processes holding a listener may take
// (KillListenerHolders).
constexpr std::chrono::milliseconds kHolderScanBudget{50};

// What the serving process reported on the pipe before it ended.
struct Report {
  bool ready = false;
  std::map<std::string, std::string> crash;  // the crash line's fields, if one came
  // The crashed copy's Python frames that followed the crash line, most recent first, each
  // as CPython writes it: File "<package digits:1>/code/model.py", line 12 in predict
  std::vector<std::string> python_stack;
  // Model versions whose load ran past the load timeout at its start ("stuck_load" lines).
  std::vector<std::string> stuck_loads;
  // Quarantined versions an operator loaded explicitly since the last read ("lifted" lines).
  std::vector<std::string> lifted;
  // Why the start failed ("start_failed" line), as `orochi serve` says it: a message, a
  // newline, and the detail (a traceback, say).
  std::string start_failure;
  std::string unfinished;  // a line read without its end yet
  // The model version whose load at the start began last ("loading" lines, before "ready"):
  // a death there with no crash record (SIGKILL from the kernel's OOM killer, say) makes it
  // the first suspect of the search (CulpritSearch), tried both ways before any quarantine.
  std::string loading;
  int loads_begun = 0;  // "loading" lines before "ready": how far the start has come
  // Every version whose load the start began, in order, for the search for a model behind
  // deaths that name none (CulpritSearch).
  std::vector<std::string> loads;
};

// A report line's text: backslashes and newlines escaped, cut so that the line is written and
// read whole (within PIPE_BUF, and a read of ReadReport's).
std::string EscapeReportText(std::string_view text) {
  constexpr size_t kMostBytes = 3 << 10;
  std::string escaped;
  for (const char c : text) {
    if (escaped.size() >= kMostBytes) break;
    if (c == '\\') {
      escaped += "\\\\";
    } else if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped += c;
    }
  }
  return escaped;
}

std::string UnescapeReportText(std::string_view escaped) {
  std::string text;
  for (size_t i = 0; i < escaped.size(); ++i) {
    if (escaped[i] == '\\' && i + 1 < escaped.size()) {
      text += escaped[++i] == 'n' ? '\n' : escaped[i];
    } else {
      text += escaped[i];
    }
  }
  return text;
}

// Where report lines come from.
enum class ReportSource {
  // The report pipe, which model code can write to as well (its descriptor is in
  // /proc/self/fd), where the serving process's filter takes its load lines.
  kPipe,
  // The pipe, where no filter's listener takes reports (a kernel without seccomp's user
  // notifications): the load lines come here too.
  kPipeAlone,
  // The filter's listener, from the serving process's first thread (SendReport), which runs no
  // model code: its "loading" and "stuck_load" lines are the server's own.
  kFirstThread,
};

// Takes the report lines of `text`: "ready" once it serves, a crash line if the process died
// of a fatal signal (see crash_record.h), the loads of its start.
//
// The load lines ("loading", "stuck_load") are taken from the pipe only where nothing else
// tells them (kPipeAlone): model code once wrote a "loading" line naming an innocent model, then
// died with no record, at every start, and the innocent model was quarantined while nothing was
// served. There a "stuck_load" line is also taken only when `stuck_loads_plausible` (the
// process has been starting for at least the load timeout, which is when the server writes
// one) and before "ready": model code could write one naming another model, which the next
// serving process would skip.
void TakeReportLines(std::string_view text, ReportSource source, bool stuck_loads_plausible,
                     Report& report) {
  constexpr size_t kMostLinesKept = 128;
  constexpr size_t kMostLoadsKept = 4096;
  const bool loads_told = source != ReportSource::kPipe;
  if (source == ReportSource::kFirstThread) stuck_loads_plausible = true;
  std::istringstream lines{std::string(text)};
  std::string line;
  while (std::getline(lines, line)) {
    if (line == "ready") {
      report.ready = true;
    } else if (line.starts_with("loading model=")) {
      if (loads_told && !report.ready) {
        report.loading = line.substr(sizeof("loading model=") - 1);
        report.loads_begun++;
        if (report.loads.size() < kMostLoadsKept) report.loads.push_back(report.loading);
      }
    } else if (line.starts_with("start_failed ")) {
      if (!report.ready) report.start_failure = UnescapeReportText(line.substr(13));
    } else if (line.starts_with("lifted model=")) {
      if (report.lifted.size() < kMostLinesKept) {
        report.lifted.push_back(line.substr(sizeof("lifted model=") - 1));
      }
    } else if (line.starts_with("stuck_load model=")) {
      if (loads_told && stuck_loads_plausible && !report.ready &&
          report.stuck_loads.size() < kMostLinesKept) {
        report.stuck_loads.push_back(line.substr(sizeof("stuck_load model=") - 1));
      }
    } else if (!report.crash.empty() && line.starts_with("  File ") &&
               report.python_stack.size() < kMostLinesKept) {
      report.python_stack.push_back(line.substr(2));
    } else if (line.starts_with("crash ")) {
      // The last line wins whole: the dying process's own comes after anything model code
      // wrote to the pipe before it.
      report.crash.clear();
      report.python_stack.clear();
      std::istringstream fields(line.substr(6));
      std::string field;
      while (fields >> field) {
        const size_t equals = field.find('=');
        if (equals != std::string::npos) {
          report.crash[field.substr(0, equals)] = field.substr(equals + 1);
        }
      }
    }
  }
}

// Reads what the serving process wrote to the report pipe, and takes its lines
// (TakeReportLines). Model code can write to the pipe too: what one call reads is bounded, as
// are the frames kept, so that a writer as fast as this reader neither keeps it here nor grows
// its memory.
Report ReadReport(int fd, Report report, ReportSource source, bool stuck_loads_plausible) {
  constexpr size_t kMostBytesRead = 1 << 16;
  // Read while the process writes: a line may come in two reads. What follows the last
  // newline waits for the rest (a line longer than a read's bound is taken cut).
  std::string text = std::move(report.unfinished);
  report.unfinished.clear();
  char buffer[4096];
  while (text.size() < kMostBytesRead) {
    const ssize_t got = ::read(fd, buffer, sizeof(buffer));
    if (got <= 0) break;
    text.append(buffer, static_cast<size_t>(got));
  }
  if (const size_t end = text.rfind('\n'); end != std::string::npos || text.size() < 4096) {
    const size_t kept = end == std::string::npos ? 0 : end + 1;
    report.unfinished = text.substr(kept);
    text.resize(kept);
  }
  TakeReportLines(text, source, stuck_loads_plausible, report);
  return report;
}

std::string SignalName(int signal_number) {
  const char* name = sigabbrev_np(signal_number);
  return name != nullptr ? std::string("SIG") + name : std::to_string(signal_number);
}

// What the serving process writes straight to its descriptors 1 and 2 (C code, os.write(1, ..),
// a fatal error message as it dies) once it serves: each line a `process output` record,
// cut at the copies' line limit and at most kLinesPerSecond a second (the rest counted and
// reported), as print() in a copy gives. Read here, in the supervisor, so that what a dying
// process wrote last is logged too.
class DescriptorOutput {
 public:
  static constexpr size_t kLineLimit = 4096;
  static constexpr double kLinesPerSecond = 200;

  // `descriptor`: where the read end of the pipe is, once it exists.
  DescriptorOutput(const int* descriptor, const char* stream)
      : descriptor_(descriptor), stream_(stream) {}

  // Reads what is there (the descriptor is non-blocking) and logs its complete lines.
  void Drain() {
    char buffer[16384];
    while (true) {
      const ssize_t got = ::read(*descriptor_, buffer, sizeof(buffer));
      if (got <= 0) break;
      for (ssize_t i = 0; i < got; ++i) {
        if (buffer[i] == '\n') {
          Emit();
        } else if (pending_.size() < kLineLimit) {
          pending_.push_back(buffer[i]);
        } else {
          cut_ = true;
        }
      }
    }
  }

 private:
  void Emit() {
    const Clock::time_point now = Clock::now();
    tokens_ =
        std::min(kLinesPerSecond, tokens_ + std::chrono::duration<double>(now - refilled_).count() *
                                                kLinesPerSecond);
    refilled_ = now;
    if (tokens_ < 1) {
      dropped_++;
    } else {
      tokens_ -= 1;
      if (dropped_ > 0) {
        Log(LogLevel::kWarning, "process output dropped: written faster than its limit",
            {{"stream", stream_}, {"dropped_lines", std::to_string(dropped_), false}});
        dropped_ = 0;
      }
      std::vector<LogField> fields{{"stream", stream_}, {"line", pending_}};
      if (cut_) fields.push_back({"cut", "true", false});
      Log(LogLevel::kWarning, "process output", fields);
    }
    pending_.clear();
    cut_ = false;
  }

  const int* descriptor_;
  const char* stream_;
  std::string pending_;
  bool cut_ = false;
  double tokens_ = kLinesPerSecond;
  Clock::time_point refilled_ = Clock::now();
  int64_t dropped_ = 0;
};

// The serving process's own log records, through a pipe of their own: model code can write to
// any descriptor of its process, this one too, and what it writes there must not flood the
// supervisor's log (it once wrote 1.5 GB of records in a second). Forwarded a line at a time,
// as written, up to kBytesPerSecond (a busy server logging every request writes a few MB a
// second); past that, lines are dropped, counted, and reported once there is room again. A
// line longer than kLineLimit (no record of the server's is) is cut there.
class ServerLogForwarder {
 public:
  static constexpr size_t kLineLimit = size_t{64} << 10;
  static constexpr double kBytesPerSecond = 16.0 * (1 << 20);

  explicit ServerLogForwarder(const int* descriptor) : descriptor_(descriptor) {}

  // Reads what is there (the descriptor is non-blocking) and forwards its complete lines.
  void Drain() {
    char buffer[65536];
    while (true) {
      const ssize_t got = ::read(*descriptor_, buffer, sizeof(buffer));
      if (got <= 0) break;
      std::string_view chunk(buffer, static_cast<size_t>(got));
      while (!chunk.empty()) {
        const size_t end = chunk.find('\n');
        const std::string_view part = chunk.substr(0, end);
        pending_.append(part.substr(0, kLineLimit - std::min(kLineLimit, pending_.size())));
        if (end == std::string_view::npos) break;
        Forward();
        chunk.remove_prefix(end + 1);
      }
    }
  }

  // Forwards a line that its process, now dead, did not end: not joined to the next one's.
  void Flush() {
    if (!pending_.empty()) Forward();
  }

 private:
  void Forward() {
    pending_ += '\n';
    const Clock::time_point now = Clock::now();
    budget_ =
        std::min(kBytesPerSecond, budget_ + std::chrono::duration<double>(now - refilled_).count() *
                                                kBytesPerSecond);
    refilled_ = now;
    if (budget_ < static_cast<double>(pending_.size())) {
      dropped_++;
    } else {
      budget_ -= static_cast<double>(pending_.size());
      if (dropped_ > 0) {
        Log(LogLevel::kWarning,
            "log records of the serving process dropped: written faster than "
            "the log's limit (model code writing to the log's descriptor?)",
            {{"dropped_lines", std::to_string(dropped_), false},
             {"bytes_per_second", std::to_string(static_cast<int64_t>(kBytesPerSecond)), false}});
        dropped_ = 0;
      }
      WriteLogLines(pending_);
    }
    pending_.clear();
  }

  const int* descriptor_;
  std::string pending_;
  double budget_ = kBytesPerSecond;
  Clock::time_point refilled_ = Clock::now();
  int64_t dropped_ = 0;
};

// How many descriptors `pid` holds, and its limit as /proc/<pid>/limits gives it ("unlimited",
// or "?" where it cannot be read).
struct DescriptorUse {
  int64_t open = 0;
  std::string limit = "?";
};
DescriptorUse DescriptorUseOf(pid_t pid) {
  DescriptorUse use;
  const std::string process = "/proc/" + std::to_string(pid);
  if (DIR* descriptors = ::opendir((process + "/fd").c_str())) {
    while (const dirent* entry = ::readdir(descriptors)) {
      if (entry->d_name[0] != '.') ++use.open;
    }
    ::closedir(descriptors);
  }
  std::ifstream limits(process + "/limits");
  std::string line;
  while (std::getline(limits, line)) {
    // "Max open files            1024                 1048576              files"
    if (!line.starts_with("Max open files")) continue;
    std::istringstream fields(line.substr(sizeof("Max open files") - 1));
    fields >> use.limit;  // the soft limit, the one that fails a call
  }
  return use;
}

// supervisor.max_model_processes, lowered to half of the limits every process of this user
// and container counts against (RLIMIT_NPROC, the pids cgroup's pids.max), so that what model
// code starts leaves the serving process room for its threads. 0: no bound.
size_t ModelProcessBound(int64_t configured) {
  if (configured <= 0) return 0;
  auto bound = static_cast<uint64_t>(configured);
  rlimit processes{};
  if (::getrlimit(RLIMIT_NPROC, &processes) == 0 && processes.rlim_cur != RLIM_INFINITY) {
    bound = std::min<uint64_t>(bound, processes.rlim_cur / 2);
  }
  // cgroup v2 ("0::/path") or v1's pids controller ("N:pids:/path").
  std::ifstream groups("/proc/self/cgroup");
  std::string line;
  while (std::getline(groups, line)) {
    std::string directory;
    if (line.starts_with("0::")) {
      directory = "/sys/fs/cgroup" + line.substr(3);
    } else if (const size_t at = line.find(":pids:"); at != std::string::npos) {
      directory = "/sys/fs/cgroup/pids" + line.substr(at + 6);
    } else {
      continue;
    }
    std::ifstream limit(directory + "/pids.max");
    uint64_t most = 0;
    if (limit >> most) bound = std::min<uint64_t>(bound, most / 2);  // "max": no limit
  }
  return static_cast<size_t>(std::max<uint64_t>(bound, 1));
}

// The descriptors past 2 that the program starting the server left open across its exec (a
// shell's `9>file`, a process manager's pipe): not close-on-exec, which every descriptor the
// server opens is.
std::vector<int> LauncherDescriptors() {
  std::vector<int> found;
  DIR* directory = ::opendir("/proc/self/fd");
  if (directory == nullptr) return found;
  while (const dirent* entry = ::readdir(directory)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd <= STDERR_FILENO || fd == ::dirfd(directory)) {
      continue;
    }
    const int flags = ::fcntl(static_cast<int>(fd), F_GETFD);
    if (flags >= 0 && (flags & FD_CLOEXEC) == 0) found.push_back(static_cast<int>(fd));
  }
  ::closedir(directory);
  return found;
}

class Supervisor {
 public:
  explicit Supervisor(ServerConfig config) : config_(std::move(config)) {}

  Result<int> Run() {
    OROCHI_RETURN_IF_ERROR(ValidateServerConfig(config_));
    ConfigureLog(config_.log.level, config_.log.format);
    launcher_descriptors_ = LauncherDescriptors();
    HideSupervisorMemory();
    // What the serving process's models start and leave behind (setsid() daemons, out of the
    // group that kill(-child) reaches) becomes the supervisor's child when its parent dies,
    // rather than init's, so that KillDescendants finds it.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    // Signals a descriptor's owner or the terminal can send, which no seccomp filter sees
    // coming: none is the supervisor's business, and their default actions end or stop it.
    for (int unused : {SIGIO, SIGURG, SIGPIPE, SIGTTIN, SIGTTOU, SIGTSTP}) {
      ::signal(unused, SIG_IGN);
    }
    LoadQuarantine();
    OROCHI_RETURN_IF_ERROR(
        Listen(config_.http.bind_address, config_.http.inference_port, inherited_.inference_fd));
    OROCHI_RETURN_IF_ERROR(
        Listen(config_.http.bind_address, config_.http.metrics_port, inherited_.metrics_fd));
    OROCHI_RETURN_IF_ERROR(
        Listen(config_.management.bind_address, config_.management.port, inherited_.management_fd));
    if (config_.grpc.enabled) {
      // Held here too, so that gRPC clients' connections wait in its backlog while a serving
      // process restarts instead of being refused (and backing off for seconds).
      OROCHI_RETURN_IF_ERROR(Listen(config_.grpc.bind_address, config_.grpc.port,
                                    inherited_.grpc_fd,
                                    /*http2=*/true));
    }
    // The signals the supervisor acts on come through a signalfd, never to handlers: one poll
    // waits for them and for the serving process's output. The serving process gets the mask
    // it would have had.
    sigset_t handled;
    sigemptyset(&handled);
    for (int signal_number : {SIGTERM, SIGINT, SIGCHLD}) sigaddset(&handled, signal_number);
    sigset_t original;
    ::pthread_sigmask(SIG_BLOCK, &handled, &original);
    signals_ = ::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
    if (signals_ < 0 || ::pipe2(stdout_pipe_, O_CLOEXEC | O_NONBLOCK) != 0 ||
        ::pipe2(stderr_pipe_, O_CLOEXEC | O_NONBLOCK) != 0 ||
        ::pipe2(log_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
      return Internal(std::string("cannot set up the supervisor: ") + std::strerror(errno));
    }
    // The write ends are the serving process's to block on: a full pipe slows a model that
    // floods its descriptors instead of dropping the server's own lines.
    for (const int* pipe : {stdout_pipe_, stderr_pipe_, log_pipe_}) ::fcntl(pipe[1], F_SETFL, 0);

    bool first_start = true;
    std::chrono::milliseconds delay{0};
    int quick_crashes = 0;  // deaths in a row, each soon after its start
    while (true) {
      int report_pipe[2];
      if (::pipe2(report_pipe, O_CLOEXEC) != 0) {
        return Internal(std::string("cannot create a pipe: ") + std::strerror(errno));
      }
      // What the serving process hands its exit filter's listener over (ExitWarden).
      int guard_channel[2];
      if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, guard_channel) != 0) {
        ::close(report_pipe[0]);
        ::close(report_pipe[1]);
        return Internal(std::string("cannot create a socket pair: ") + std::strerror(errno));
      }
      const Clock::time_point started = Clock::now();
      HealListeners();
      RestoreRepositoryModes();
      const pid_t supervisor = ::getpid();
      const pid_t supervisor_group = ::getpgrp();
      const pid_t child = ::fork();
      if (child < 0 && (errno == EAGAIN || errno == ENOMEM) && !first_start) {
        // Out of processes (the user's limit, a pids cgroup): what the last serving process
        // left is gone (KillDescendants), so the slots come back; retry rather than end.
        Log(LogLevel::kError, "cannot start the serving process; retrying",
            {{"error", std::strerror(errno)}});
        for (int descriptor :
             {report_pipe[0], report_pipe[1], guard_channel[0], guard_channel[1]}) {
          ::close(descriptor);
        }
        KillDescendants();
        if (WaitOrStop(std::chrono::milliseconds(500))) return 0;
        continue;
      }
      if (child < 0) {
        return Internal(std::string("cannot start the serving process: ") + std::strerror(errno));
      }
      if (child == 0) {
        // A process group of its own, which processes its models fork join: they end with it.
        ::setpgid(0, 0);
        ::close(report_pipe[0]);
        ::close(signals_);
        ::pthread_sigmask(SIG_SETMASK, &original, nullptr);
        ::close(guard_channel[0]);
        ServeInChild(report_pipe[1], guard_channel[1], supervisor,
                     supervisor_group);  // does not return
      }
      ::close(report_pipe[1]);
      ::close(guard_channel[1]);
      exit_warden_.Receive(guard_channel[0], child);
      loads_told_by_warden_ = exit_warden_.takes_reports();
      ::close(guard_channel[0]);
      ::fcntl(report_pipe[0], F_SETFL, O_NONBLOCK);
      int status = 0;
      bool stopping = false;
      // Read as it comes (Wait), so that when a line arrived is known.
      report_fd_ = report_pipe[0];
      report_open_ = true;
      report_ = Report{};
      started_ = started;
      start_step_deadline_ = Clock::now() + StartStepBound();
      start_steps_seen_ = 0;
      served_ = false;
      serving_ = child;
      const Report& report = report_;
      bool unresponsive = false;
      // Stopped for the search (TendSearch), to start again at once: killed if its drain is not
      // over by the deadline.
      bool restarting = false;
      bool restart_killed = false;
      Clock::time_point restart_deadline{};
      while (true) {
        std::optional<std::chrono::milliseconds> wait_at_most;
        if (restarting && !restart_killed) {
          wait_at_most = std::max(std::chrono::milliseconds(0),
                                  std::chrono::duration_cast<std::chrono::milliseconds>(
                                      restart_deadline - Clock::now()));
        }
        const auto [signal_number, sender, why, unanswered_port, restart_for_search] =
            Wait(wait_at_most);
        if (restart_for_search && !stopping && !restarting) {
          Log(LogLevel::kWarning,
              "stopping the serving process to start it again with other models held back");
          serving_ = 0;  // asked no more
          start_step_deadline_.reset();
          probe_.Stop();
          restarting = true;
          restart_deadline = Clock::now() + std::chrono::seconds(config_.http.shutdown_grace_s) +
                             std::chrono::milliseconds(config_.models.execution_grace_ms) +
                             std::chrono::seconds(5);
          ::kill(child, SIGINT);  // SIGINT: no shutdown_delay_s, straight to the drain
          continue;
        }
        if (restarting && !restart_killed && Clock::now() >= restart_deadline && !stopping) {
          Log(LogLevel::kError, "the serving process did not stop in time; killing it");
          restart_killed = true;
          ::kill(child, SIGKILL);
          ::kill(-child, SIGKILL);
          continue;
        }
        if (why != nullptr && !stopping) {
          // Descriptors model code exhausted are the commonest cause of an unanswered port, and
          // name no model: the numbers at least tell an operator which it was.
          const DescriptorUse descriptors = DescriptorUseOf(child);
          std::vector<LogField> fields;
          if (unanswered_port != 0) {
            fields.push_back({"port", std::to_string(unanswered_port), false});
            fields.push_back(
                {"seconds", std::to_string(config_.supervisor.liveness_timeout_s), false});
            rebind_listeners_ = true;
          } else {
            fields.push_back(
                {"seconds",
                 std::to_string(
                     std::chrono::duration_cast<std::chrono::seconds>(StartStepBound()).count()),
                 false});
            if (!report.loading.empty()) fields.push_back({"loading", report.loading});
          }
          fields.push_back({"open_descriptors", std::to_string(descriptors.open), false});
          fields.push_back({"descriptor_limit", descriptors.limit, false});
          Log(LogLevel::kError, why, fields);
          unresponsive = true;
          serving_ = 0;  // asked no more
          start_step_deadline_.reset();
          probe_.Stop();
          // Its group too: a tracer among what it started would keep its death from this wait.
          ::kill(child, SIGKILL);
          ::kill(-child, SIGKILL);
          continue;
        }
        if ((signal_number == SIGTERM || signal_number == SIGINT) &&
            FromServingProcess(sender, child)) {
          // Model code does not decide when the server stops. (Its calls cannot reach the
          // supervisor where the seccomp filter is in place: this is for where it is not.)
          Log(LogLevel::kWarning, "a stop signal from the serving process itself is ignored",
              {{"signal", SignalName(signal_number)},
               {"sender_pid", std::to_string(sender), false}});
          continue;
        }
        if (signal_number == SIGTERM || signal_number == SIGINT) {
          stopping = true;
          probe_.Stop();  // a draining process stops accepting: that is no failure
          start_step_deadline_.reset();
          ::kill(child, signal_number);
          continue;
        }
        ReadReportNow();
        if (ReapChildren(child, status)) break;
      }
      serving_ = 0;
      start_step_deadline_.reset();
      probe_.Stop();
      // What model code forked and left behind (a child deadlocked on a lock the fork copied,
      // say) must not outlive the process it came from, nor hold what it inherited.
      ::kill(-child, SIGKILL);
      KillDescendants();
      exit_warden_.Close();
      ReadReportNow();
      ::close(report_pipe[0]);
      report_fd_ = -1;
      server_log_.Drain();  // its last records and words, if it wrote any
      server_log_.Flush();
      stdout_.Drain();
      stderr_.Drain();
      const int exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (stopping) {
        // Asked to stop, and stopped. The signal passed on ends a serving process that was
        // still starting (before it handles signals): that is the stop asked for, not a
        // failure. A crash that came with the request is logged, and not restarted.
        if (WIFSIGNALED(status) && WTERMSIG(status) != SIGTERM && WTERMSIG(status) != SIGINT) {
          RecordDeath(status, report, "the serving process died as the server stopped");
          return exit_status;
        }
        return WIFEXITED(status) ? exit_status : 0;
      }
      if (restarting) {
        // Asked to stop by the search: no death, and nothing to wait for.
        Log(LogLevel::kInfo, "starting the serving process again with other models held back",
            {{"exit_code", std::to_string(exit_status), false}});
        first_start = false;
        continue;
      }
      // A start that fails is not restarted: it says why, once. Only the server's own word
      // counts (its start_failed line, then its exit 1): any other exit before ready is a death
      // during that start's loads, restarted and put on the load in flight as a crash would
      // be. Once, a package whose __init__ exec'd /bin/true ended the supervisor with 0.
      if (first_start && !report.ready && WIFEXITED(status) && WEXITSTATUS(status) == 1 &&
          !report.start_failure.empty()) {
        std::fprintf(stderr, "orochi serve: %s", report.start_failure.c_str());
        return exit_status;
      }
      if (!report.start_failure.empty()) {
        Log(LogLevel::kError, "the serving process could not start",
            {{"reason", report.start_failure}});
      }
      QuarantineStuckLoads(report);
      first_start = false;
      // A clean exit nobody asked for is model code's doing too (a SIGTERM to its own
      // process starts the graceful shutdown): the server goes on, as after a crash.
      const Blame blame = RecordDeath(
          status, report,
          unresponsive ? "the serving process stopped answering; restarting it"
          : WIFEXITED(status) && WEXITSTATUS(status) == 0
              ? "the serving process exited though nobody asked it to stop; restarting it"
              : "the serving process died; restarting it");
      if (blame.recorded.empty()) {
        Act(culprit_search_.NoteUnnamedDeath(
            Clock::now(), report.loads,
            std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started),
            blame.load_in_flight));
      }
      quick_crashes = served_ || Clock::now() - started >= kStableAfter ? 0 : quick_crashes + 1;
      if (quick_crashes < kQuickCrashesAllowed) {
        delay = std::chrono::milliseconds(0);
      } else {
        delay = std::min(kLongestRestartDelay, std::max(kFirstRestartDelay, delay * 2));
      }
      if (WaitOrStop(delay)) return 0;
    }
  }

 private:
  [[noreturn]] void ServeInChild(int report_fd, int guard_channel, pid_t supervisor,
                                 pid_t supervisor_group) {
    // Kept by the supervisor, whose launcher's they are; model code has no business with them.
    for (int descriptor : launcher_descriptors_) ::close(descriptor);
    // Its records go through the supervisor (ServerLogForwarder), bounded. Close-on-exec: what
    // models start does not inherit it.
    SetLogDescriptor(log_pipe_[1]);
    ::close(log_pipe_[0]);
    // If the supervisor is killed outright, the serving process must not linger on its ports.
    // SIGINT, not SIGTERM: it skips http.shutdown_delay_s (nothing routes here by then that
    // waiting would help) and goes straight to the drain.
    ::prctl(PR_SET_PDEATHSIG, SIGINT);
    // In a process group of its own, the serving process is in the background of the terminal
    // it was started from: model code reading it (input(), pdb) would stop the process with
    // SIGTTIN. Ignored, such a read fails (EIO) instead.
    for (int job_control : {SIGTTIN, SIGTTOU, SIGTSTP}) ::signal(job_control, SIG_IGN);
    IgnoreUnusedSignals();
    // The supervisor may have gone before the request above took effect. (It may be PID 1 itself,
    // in a container: compare with its pid, not with init's.)
    if (::getppid() != supervisor) std::_Exit(1);
    // Never blocks: a pipe that model code filled loses the crash record, not the restart.
    ::fcntl(report_fd, F_SETFL, O_NONBLOCK);
    // Before any model code, and before the shield, which refuses filters installed after it:
    // model code cannot end this process by exiting it, replace it by an exec, or shut down,
    // close or copy a listener (or a copy's archive); the supervisor
    // answers what the filter asks, through the listener handed to it here (exit_guard.h).
    std::vector<int> kept;
    for (const Listener& listener : listeners_) {
      if (*listener.fd >= 0) kept.push_back(*listener.fd);
    }
    // Made now, so that their numbers are known to the filter.
    if (Result<std::vector<int>> archives = interpreters::PythonArchiveDescriptors();
        archives.ok()) {
      kept.insert(kept.end(), archives->begin(), archives->end());
    }
    Result<int> exit_listener = InstallExitFilter(kept);
    HandListener(guard_channel, exit_listener.ok() ? *exit_listener : -1);
    ::close(guard_channel);
    if (!exit_listener.ok()) {
      Log(LogLevel::kWarning, "model code can end the serving process by exiting it",
          {{"reason", exit_listener.status().message()}});
    }
    // From here no call of this process or of what it starts can signal the supervisor
    // (supervisor_shield.h).
    if (Status shielded = ShieldSupervisorFrom(supervisor, supervisor_group); !shielded.ok()) {
      Log(LogLevel::kWarning, "model code can signal the supervisor",
          {{"reason", shielded.message()}});
    }
    InstallCrashRecorder(report_fd);
    inherited_.report_fd = report_fd;
    inherited_.supervisor = supervisor;
    // What is written to descriptors 1 and 2 goes to the supervisor's log (DescriptorOutput),
    // bounded, from before the first model loads: an __init__ writing to them must not reach the
    // supervisor's own output (its terminal, its log file) unchecked.
    ::fflush(stdout);
    ::fflush(stderr);
    ::dup2(stdout_pipe_[1], STDOUT_FILENO);
    ::dup2(stderr_pipe_[1], STDERR_FILENO);
    for (int descriptor : {stdout_pipe_[0], stdout_pipe_[1], stderr_pipe_[0], stderr_pipe_[1]}) {
      ::close(descriptor);
    }
    // Left unloaded as the quarantined are, for this start only (CulpritSearch).
    for (const std::string& model_key : culprit_search_.held_back()) {
      inherited_.quarantined.emplace(
          model_key,
          "held back: the serving process died with no crash record naming a model too often, "
          "and the supervisor is finding which model's doing it is by holding models back in "
          "turn (see the log)");
    }
    Result<std::unique_ptr<Server>> started = Server::Start(config_, inherited_);
    if (!started.ok()) {
      // Said by the supervisor on its own stderr, as the one line a start that fails leaves.
      const std::string line = "start_failed " + EscapeReportText(started.status().message() +
                                                                  "\n" + started.status().detail());
      [[maybe_unused]] ssize_t written = ::write(report_fd, (line + "\n").data(), line.size() + 1);
      ExitServingProcess(1);
    }
    static constexpr char kReady[] = "ready\n";
    [[maybe_unused]] ssize_t written = ::write(report_fd, kReady, sizeof(kReady) - 1);
    const int code = (*started)->Run();
    EndUnlessTornDownWithin(kLongestTeardown, code);
    started->reset();
    ExitServingProcess(code);
  }

  // After the drain, tearing the server down unloads each model, which takes its copy's GIL: a
  // thread model code keeps asleep in C with that GIL held (ctypes.PyDLL) once kept a stopped
  // serving process, and every port, for good. What the teardown has not done by `bound` is
  // left undone: the process ends with `code`, from a thread of its own.
  static void EndUnlessTornDownWithin(std::chrono::seconds bound, int code) {
    try {
      std::thread([bound, code] {
        std::this_thread::sleep_for(bound);
        Log(LogLevel::kWarning,
            "the server's teardown did not end in time (a copy held by model code); ending the "
            "process",
            {{"seconds", std::to_string(bound.count()), false}});
        ExitServingProcess(code, /*flush_streams=*/false);
      }).detach();
    } catch (const std::system_error&) {
      // No thread to be had (model code took them all): the teardown is unbounded, as before.
    }
  }

  // Binds address:port into `fd`, and remembers where for HealListeners (the port the kernel
  // picked, where the configured one is 0).
  Status Listen(const std::string& address, int port, int& fd, bool http2 = false) {
    OROCHI_ASSIGN_OR_RETURN(fd, BindListener(address, port));
    listeners_.push_back({address, BoundPort(fd), &fd, http2, ListenerOptions::Of(fd)});
    return Status::Ok();
  }

  // The permissions of the repository's directories (the repository, its state directory, each
  // model's and each version's) as the first start found them, or as they were made since, put
  // back before each restart if they changed: model code runs as the repository's owner, and a
  // chmod(repository, 0) made every later start fail on its uploads directory, a restart loop
  // with nothing served; a chmod of another model's directory left that model unlisted. A
  // directory its owner (the server) cannot read or search when first seen is given those
  // rights: the next cold start would otherwise fail listing the repository, for good.
  static std::string Octal(mode_t mode) {
    char text[16];
    std::snprintf(text, sizeof(text), "%04o", static_cast<unsigned>(mode));
    return text;
  }
  void RestoreRepositoryModes() {
    if (config_.models.repository.empty()) return;
    const std::string& repository = config_.models.repository;
    std::set<std::string> seen = {repository, repository + "/.orochi"};
    RestoreMode(repository);
    RestoreMode(repository + "/.orochi");
    // Bounded: model code can make directories there too, and each restart walks them.
    constexpr size_t kMostDirectories = 4096;
    for (const std::string& model : Subdirectories(repository, kMostDirectories)) {
      if (seen.size() >= kMostDirectories) break;
      RestoreMode(model);
      seen.insert(model);
      for (const std::string& version : Subdirectories(model, kMostDirectories)) {
        if (seen.size() >= kMostDirectories) break;
        RestoreMode(version);
        seen.insert(version);
      }
    }
    // What is gone (or past the bound) is forgotten, so that what is kept stays bounded too.
    std::erase_if(repository_modes_,
                  [&](const auto& entry) { return seen.count(entry.first) == 0; });
  }
  void RestoreMode(const std::string& path) {
    struct stat status {};
    if (::lstat(path.c_str(), &status) != 0 || !S_ISDIR(status.st_mode)) return;
    const mode_t mode = status.st_mode & 07777;
    auto [known, first_seen] = repository_modes_.try_emplace(path, mode);
    mode_t wanted = known->second;
    const char* message =
        "the permissions of the model repository changed while the server ran; put back";
    if (first_seen) {
      constexpr mode_t kOwnerReadsAndSearches = S_IRUSR | S_IXUSR;
      if (status.st_uid != ::geteuid() ||
          (mode & kOwnerReadsAndSearches) == kOwnerReadsAndSearches) {
        return;
      }
      wanted = known->second = mode | kOwnerReadsAndSearches;
      message = "a directory of the model repository was closed to the server; opened again";
    }
    if (mode == wanted || ::chmod(path.c_str(), wanted) != 0) return;
    Log(LogLevel::kWarning, message,
        {{"path", path}, {"found", Octal(mode)}, {"restored", Octal(wanted)}});
  }
  // The directories in `directory` but hidden ones (the state directory), at most `most`.
  static std::vector<std::string> Subdirectories(const std::string& directory, size_t most) {
    std::vector<std::string> found;
    DIR* listing = ::opendir(directory.c_str());
    if (listing == nullptr) return found;
    while (const dirent* entry = ::readdir(listing)) {
      if (found.size() >= most) break;
      if (entry->d_name[0] == '.' || (entry->d_type != DT_DIR && entry->d_type != DT_UNKNOWN)) {
        continue;
      }
      found.push_back(directory + "/" + entry->d_name);
    }
    ::closedir(listing);
    return found;
  }

  // Binds again each listener that no longer listens (see listening_socket.h), on its port;
  // every one after the serving process stopped answering (rebind_listeners_): a listener
  // still listening may be deaf (an option model code set on it) or shared with a process
  // outside the server.
  void HealListeners() {
    const bool all = std::exchange(rebind_listeners_, false);
    for (Listener& listener : listeners_) {
      if (!all && ListenerIntact(*listener.fd)) continue;
      ::close(*listener.fd);
      Result<int> bound = BindListener(listener.address, listener.port);
      if (!bound.ok()) {
        // The serving process binds the port itself (-1), if it is free by then; the next
        // restart tries here again.
        *listener.fd = -1;
        Log(LogLevel::kError,
            "a listening socket was shut down or shared and cannot be bound again",
            {{"port", std::to_string(listener.port), false}, {"error", bound.status().message()}});
        continue;
      }
      *listener.fd = *bound;
      listener.options = ListenerOptions::Of(*bound);
      Log(LogLevel::kWarning, "a listening socket was shut down or shared; bound again",
          {{"port", std::to_string(listener.port), false}});
    }
  }

  // Kills and reaps every process under the supervisor, the serving process being dead: what
  // its models left, reparented here (PR_SET_CHILD_SUBREAPER). A tree that forks as fast as it
  // is killed (a fork bomb in a session of its own) once kept the supervisor here for good: it
  // is stopped first, SIGSTOP to every process under the supervisor, round after round until a
  // round finds none it has not stopped (a stopped process forks no more), then killed whole.
  // The rounds that follow kill and reap the children, round after round, since killing a
  // process reparents its own children here in turn. Bounded; what is left then is met again
  // at the next death.
  static void KillDescendants() {
    // Each round walks the tree through the children files of /proc (a few small reads, not a
    // scan of every process: Descendants), so that a round is quicker than a few forks.
    const pid_t supervisor = ::getpid();
    std::set<pid_t> stopped;
    for (int round = 0; round < 1000; ++round) {
      bool found_new = false;
      for (const pid_t pid : Descendants(supervisor)) {
        if (pid != supervisor && stopped.insert(pid).second) {
          ::kill(pid, SIGSTOP);
          found_new = true;
        }
      }
      if (!found_new) break;
    }
    for (const pid_t pid : stopped) ::kill(pid, SIGKILL);
    for (int round = 0; round < 1000; ++round) {
      const std::vector<pid_t> children = ChildrenOf(supervisor);
      if (children.empty()) return;
      for (pid_t pid : children) ::kill(pid, SIGKILL);
      for (pid_t pid : children) ::waitpid(pid, nullptr, 0);
    }
  }

  // Reaps what ended among the supervisor's children: true, with its `status`, when the
  // serving process `child` did. Any other child is reaped and forgotten (one that model code
  // made the supervisor's with CLONE_PARENT, where the filter does not stop it), so that none
  // stays a zombie. A serving process stopped from inside (model code's
  // os.kill(os.getpid(), SIGSTOP)) is continued: nobody else would, and a stopped process holds
  // every port and answers nothing.
  static bool ReapChildren(pid_t child, int& status) {
    while (true) {
      int reaped_status = 0;
      const pid_t reaped = ::waitpid(-1, &reaped_status, WNOHANG | WUNTRACED);
      if (reaped <= 0) return false;
      if (reaped != child) continue;
      if (WIFSTOPPED(reaped_status)) {
        Log(LogLevel::kWarning, "the serving process was stopped; continuing it",
            {{"signal", SignalName(WSTOPSIG(reaped_status))}});
        ::kill(child, SIGCONT);
        continue;
      }
      status = reaped_status;
      return true;
    }
  }

  // Quarantines an earlier supervisor recorded (a container restarted, say) whose packages are
  // still there unchanged: otherwise each new supervisor would meet a crashing package
  // max_model_crashes times again before keeping it out.
  void LoadQuarantine() {
    if (config_.models.repository.empty()) return;
    inherited_.quarantined =
        repository::RepositoryStore(config_.models.repository).ReadQuarantine();
    for (const auto& [model_key, reason] : inherited_.quarantined) {
      Log(LogLevel::kWarning, "model quarantined at an earlier start; not loading it",
          {{"model", model_key}, {"reason", reason}});
    }
  }

  void Quarantine(const std::string& model_key, const std::string& reason) {
    inherited_.quarantined[model_key] = reason;
    Log(LogLevel::kError, "model quarantined", {{"model", model_key}, {"reason", reason}});
    SaveQuarantine();
  }

  void SaveQuarantine() {
    if (config_.models.repository.empty()) return;
    const Status saved = repository::RepositoryStore(config_.models.repository)
                             .WriteQuarantine(inherited_.quarantined);
    if (!saved.ok()) {
      Log(LogLevel::kWarning, "the quarantine is not recorded in the repository",
          {{"error", saved.message()}});
    }
  }

  // A model version whose load ran past the load timeout at the start of the serving process
  // that just died would make the next start wait as long again (stuck in C, say, with nothing
  // to interrupt): the next serving process skips it, as a quarantined one.
  void QuarantineStuckLoads(const Report& report) {
    for (const std::string& model_key : report.stuck_loads) {
      if (inherited_.quarantined.count(model_key) != 0) continue;
      const std::string reason =
          "quarantined: loading model " + model_key + " did not finish within " +
          std::to_string(config_.models.load_timeout_s) +
          " s (models.load_timeout_s) at an earlier start; load it explicitly or deploy another "
          "version";
      Quarantine(model_key, reason);
    }
  }

  // Whom a death was put on (RecordDeath).
  struct Blame {
    std::string recorded;        // the model version its crash record names
    std::string load_in_flight;  // or, with no record, the load in flight at the start
  };

  // Logs the death of a serving process and keeps the books for the next one.
  Blame RecordDeath(int status, const Report& report,
                    const char* message = "the serving process died; restarting it") {
    inherited_.restarts++;
    std::vector<LogField> fields;
    if (WIFSIGNALED(status)) {
      fields.push_back({"signal", SignalName(WTERMSIG(status))});
    } else {
      fields.push_back({"exit_code", std::to_string(WEXITSTATUS(status)), false});
    }
    auto field = [&](const char* name) {
      auto found = report.crash.find(name);
      return found != report.crash.end() ? found->second : std::string();
    };
    // A record is the process's only if the handler could have written it and it names the
    // signal the process died of: a line that model code wrote before killing its process some
    // other way (SIGKILL, which no handler sees) must not put its crash on another model.
    const bool recorded = WIFSIGNALED(status) && IsRecordedSignal(WTERMSIG(status)) &&
                          field("signal") == std::to_string(WTERMSIG(status));
    // No record, at a start: the load in flight, if the serving process named one. Not for a
    // lost listener (its own exit status): model code of any model loaded before may have shut
    // it down, and an innocent model loading then was once quarantined for it.
    const bool listener_lost = WIFEXITED(status) && WEXITSTATUS(status) == kListenerLostExitStatus;
    const bool load_in_flight = !recorded && !listener_lost && !served_ && !report.loading.empty();
    const std::string model_key =
        recorded ? field("model") : (load_in_flight ? report.loading : std::string());
    if (load_in_flight) {
      fields.push_back({"model", model_key});
      fields.push_back({"activity", "load"});
      fields.push_back({"record", "none: the load in flight at the start"});
    } else if (!model_key.empty()) {
      fields.push_back({"model", model_key});
      fields.push_back({"copy", field("copy"), false});
      fields.push_back({"activity", field("activity")});
      if (!report.python_stack.empty()) {
        std::string frames;
        for (const std::string& frame : report.python_stack) {
          frames += (frames.empty() ? "" : "; ") + frame;
        }
        fields.push_back({"python_stack", frames});
      }
    }
    if (!model_key.empty()) {
      Result<packaging::ModelKey> parsed_key = packaging::ModelKey::Parse(model_key);
      inherited_.model_crashes[parsed_key.ok() ? parsed_key->name : model_key]++;
    }
    // A death at a load with no record is only a suspicion (CulpritSearch) until it is tried.
    if (recorded && !model_key.empty()) {
      std::deque<Clock::time_point>& crashes = crash_times_[model_key];
      const Clock::time_point now = Clock::now();
      crashes.push_back(now);
      while (!crashes.empty() &&
             now - crashes.front() > std::chrono::seconds(config_.supervisor.crash_window_s)) {
        crashes.pop_front();
      }
      if (static_cast<int64_t>(crashes.size()) >= config_.supervisor.max_model_crashes &&
          inherited_.quarantined.count(model_key) == 0) {
        const std::string reason =
            "quarantined: model " + model_key + " crashed the server " +
            std::to_string(crashes.size()) + " times within " +
            std::to_string(config_.supervisor.crash_window_s) +
            " s (supervisor.max_model_crashes); load it explicitly or deploy another version";
        Quarantine(model_key, reason);
      }
    }
    fields.push_back({"restarts", std::to_string(inherited_.restarts), false});
    Log(LogLevel::kError, message, fields);
    return recorded ? Blame{model_key, ""} : Blame{"", model_key};
  }

  // Logs what a step of the search for the model behind deaths naming none did, and
  // quarantines what it found.
  void Act(const CulpritSearch::Step& step) {
    if (step.what.empty()) return;
    std::string held_back;
    for (const std::string& key : culprit_search_.held_back()) {
      held_back += (held_back.empty() ? "" : ",") + key;
    }
    Log(LogLevel::kWarning, step.what,
        held_back.empty() ? std::vector<LogField>{}
                          : std::vector<LogField>{{"held_back", held_back}});
    if (step.culprit && inherited_.quarantined.count(*step.culprit) == 0) {
      Quarantine(*step.culprit,
                 "quarantined: model " + *step.culprit +
                     " was tried both ways after the serving process died with no crash record "
                     "naming a model " +
                     std::to_string(config_.supervisor.max_model_crashes) + " times within " +
                     std::to_string(config_.supervisor.crash_window_s) +
                     " s: held back, the server served; loaded again, it died so again; load it "
                     "explicitly or deploy another version");
    }
  }

  // Waits for a signal (returned), logging the serving process's output meanwhile; with a
  // `timeout`, 0 when it passes first.
  struct Signal {
    int number = 0;  // 0: the timeout passed first, or:
    pid_t sender = 0;
    // The serving process is to be killed, `why` says why for the log: its start stalled
    // (TendStart), or it left `unanswered_port` unanswered (LivenessProbe), or that port's
    // listener has options that cannot be put back (TendListenerOptions).
    const char* why = nullptr;
    int unanswered_port = 0;
    // The search for a model behind deaths naming none wants another set of models held back:
    // the serving process is to be stopped, and started again without them.
    bool restart_for_search = false;
  };
  Signal Wait(std::optional<std::chrono::milliseconds> timeout) {
    const Clock::time_point until = Clock::now() + timeout.value_or(std::chrono::milliseconds(0));
    while (true) {
      std::vector<pollfd> watched = {{signals_, POLLIN, 0},
                                     {stdout_pipe_[0], POLLIN, 0},
                                     {stderr_pipe_[0], POLLIN, 0},
                                     {log_pipe_[0], POLLIN, 0},
                                     {report_open_ ? report_fd_ : -1, POLLIN, 0},  // -1: unwatched
                                     {exit_warden_.descriptor(), POLLIN, 0}};
      constexpr size_t kProbesFrom = 6;
      probe_.AddTo(watched);
      int wait_ms = probe_.WaitMs(Clock::now());
      // The upkeep of TendServingProcess, every second; or the end of a start's step.
      std::optional<Clock::time_point> next_tending;
      if (serving_ != 0 && report_.ready) next_tending = next_upkeep_;
      if (serving_ != 0 && !served_ && start_step_deadline_) {
        next_tending =
            std::min(next_tending.value_or(Clock::time_point::max()), *start_step_deadline_);
      }
      if (next_tending) {
        const auto tending_ms = static_cast<int>(std::clamp<int64_t>(
            std::chrono::duration_cast<std::chrono::milliseconds>(*next_tending - Clock::now())
                .count(),
            0, std::numeric_limits<int>::max()));
        wait_ms = wait_ms < 0 ? tending_ms : std::min(wait_ms, tending_ms);
      }
      if (timeout) {
        const auto left = static_cast<int>(std::max<int64_t>(
            0,
            std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count()));
        wait_ms = wait_ms < 0 ? left : std::min(wait_ms, left);
      }
      if (::poll(watched.data(), watched.size(), wait_ms) < 0 && errno != EINTR) return {};
      if ((watched[1].revents & POLLIN) != 0) stdout_.Drain();
      if ((watched[2].revents & POLLIN) != 0) stderr_.Drain();
      if ((watched[3].revents & POLLIN) != 0) server_log_.Drain();
      if ((watched[4].revents & POLLIN) != 0) {
        ReadReportNow();
      } else if (watched[4].revents != 0) {
        report_open_ = false;  // closed (model code can close it): it would poll ready for ever
      }
      if ((watched[5].revents & POLLIN) != 0) {
        exit_warden_.AnswerOne();
        if (exit_warden_.reports_unreadable()) loads_told_by_warden_ = false;
        TakeReportLines(exit_warden_.TakeReports(), ReportSource::kFirstThread,
                        /*stuck_loads_plausible=*/true, report_);
      } else if (watched[5].revents != 0) {
        exit_warden_.Close();  // no process uses the filter any more
      }
      signalfd_siginfo info{};
      if (::read(signals_, &info, sizeof(info)) == sizeof(info)) {
        return {static_cast<int>(info.ssi_signo), static_cast<pid_t>(info.ssi_pid)};
      }
      if (std::optional<Signal> stalled = TendStart()) return *stalled;
      if (std::optional<Signal> failed = TendServingProcess(watched, kProbesFrom)) {
        return *failed;
      }
      if (timeout && Clock::now() >= until) return {};
    }
  }

  // The longest a start may go without a step forward: a model's load begun, or "ready". A
  // load ends within models.load_timeout_s and the grace of its interrupt (model_service.h);
  // what comes between loads (reading packages, starting copies) gets as long again.
  std::chrono::milliseconds StartStepBound() const {
    return std::chrono::seconds(2 * config_.models.load_timeout_s + 5) +
           std::chrono::milliseconds(config_.models.execution_grace_ms);
  }

  // Before the serving process serves, no port of its answers and the probe has nothing to
  // ask: what bounds its start is its steps. A process frozen there (every thread stopped or
  // blocked where the load deadline does not reach) once held the start for good. Killed, the
  // load in flight is charged with its death (RecordDeath), so that a package that freezes
  // every start is quarantined.
  std::optional<Signal> TendStart() {
    if (serving_ == 0 || served_ || !start_step_deadline_) return std::nullopt;
    if (report_.loads_begun != start_steps_seen_) {
      start_steps_seen_ = report_.loads_begun;
      start_step_deadline_ = Clock::now() + StartStepBound();
      return std::nullopt;
    }
    if (Clock::now() < *start_step_deadline_) return std::nullopt;
    return Signal{0, 0, "the serving process's start made no progress; killing it"};
  }

  // Once the serving process serves: each second kills what it started that holds a listener
  // or is past supervisor.max_model_processes and puts back its listeners' options; and asks
  // its ports (LivenessProbe). A port to restart the serving process for, if any.
  std::optional<Signal> TendServingProcess(const std::vector<pollfd>& watched, size_t probes_from) {
    const Clock::time_point now = Clock::now();
    if (serving_ == 0 || !report_.ready) return std::nullopt;
    if (now >= next_upkeep_) {
      next_upkeep_ = now + std::chrono::seconds(1);
      KillListenerHolders();
      BoundModelProcesses();
      if (std::optional<int> port = TendListenerOptions()) {
        return Signal{0, 0,
                      "a listener's socket options cannot be put back; killing the serving "
                      "process, to restart it on fresh listeners",
                      *port};
      }
    }
    if (config_.supervisor.liveness_timeout_s == 0) {
      served_ = true;  // nothing asked: its word is taken
      return TendSearch(now);
    }
    if (!probe_.running()) {
      std::vector<LivenessProbe::Port> ports;
      for (const Listener& listener : listeners_) {
        ports.push_back({listener.address, listener.port, listener.http2});
      }
      probe_.Start(std::move(ports), now);
      return std::nullopt;
    }
    probe_.Advance(watched, probes_from, now);
    if (!served_) {
      // Until its ports answer, a death is one of its start's: model code can write "ready"
      // on the report pipe too, and a forged one followed by a death with no record once made
      // every start's death one after serving, put on no load and restarted at once, for good.
      served_ = probe_.AllAnswered();
      return std::nullopt;  // and the start's bound applies (TendStart)
    }
    if (std::optional<int> port =
            probe_.Unanswered(std::chrono::seconds(config_.supervisor.liveness_timeout_s), now)) {
      return Signal{0, 0,
                    "the serving process left a port unanswered; killing it, to restart it on "
                    "fresh listeners",
                    *port};
    }
    return TendSearch(now);
  }

  // A serving process that serves with models held back, past the search's trial: the search
  // takes a step, and may want it restarted with others held back.
  std::optional<Signal> TendSearch(Clock::time_point now) {
    if (!culprit_search_.searching() || !served_) return std::nullopt;
    const CulpritSearch::Step step = culprit_search_.NoteServing(
        std::chrono::duration_cast<std::chrono::milliseconds>(now - started_));
    Act(step);
    if (!step.restart) return std::nullopt;
    Signal restart;
    restart.restart_for_search = true;
    return restart;
  }

  // Puts back the options model code changed on a listener (ListenerOptions); the port of one
  // it could not, which needs binding again.
  std::optional<int> TendListenerOptions() {
    for (const Listener& listener : listeners_) {
      if (*listener.fd < 0) continue;
      const ListenerOptions::Drift drift = listener.options.Restore(*listener.fd);
      if (drift.changed.empty()) continue;
      std::string names;
      for (const std::string& name : drift.changed) names += (names.empty() ? "" : ",") + name;
      Log(LogLevel::kError,
          drift.restored ? "a listener's socket options were changed; put back"
                         : "a listener's socket options were changed and cannot all be put back",
          {{"port", std::to_string(listener.port), false}, {"options", names}});
      if (!drift.restored) return listener.port;
    }
    return std::nullopt;
  }

  // A process the serving process started that holds a listening socket (passed to it across
  // an exec, where the fork handler of listening_socket.h does not run) takes connections meant
  // for the server, and answers them as it likes: killed. The serving process itself, the only
  // process that should hold one, is not looked at (its descriptors are many).
  void KillListenerHolders() {
    std::vector<unsigned long> inodes;
    for (const Listener& listener : listeners_) {
      struct stat status {};
      if (*listener.fd >= 0 && ::fstat(*listener.fd, &status) == 0) inodes.push_back(status.st_ino);
    }
    // A walk reads every descriptor of every process: it takes at most kHolderScanBudget a
    // round, and the next round goes on from there. Whole, each round, 150 forks holding
    // 19,000 descriptors each once took over this loop, and the probe, late, killed a serving
    // process that answered.
    if (holder_scan_pending_.empty()) holder_scan_pending_ = Descendants(::getpid());
    const Clock::time_point until = Clock::now() + kHolderScanBudget;
    while (!holder_scan_pending_.empty() && Clock::now() < until) {
      const pid_t pid = holder_scan_pending_.back();
      holder_scan_pending_.pop_back();
      if (pid == ::getpid() || pid == serving_ || !HoldsSocket(pid, inodes)) continue;
      Log(LogLevel::kError,
          "a process the serving process started held a listening socket; "
          "killed it",
          {{"pid", std::to_string(pid), false}});
      ::kill(pid, SIGKILL);
    }
  }

  // What model code starts (forks, spawns, daemons it left) counts against the user's process
  // limit and a container's pids limit, as the serving process's own threads do: 284 sleeping
  // children once left gRPC none to start. Past supervisor.max_model_processes (and never past
  // half of those limits) the youngest are killed.
  void BoundModelProcesses() {
    const size_t bound = ModelProcessBound(config_.supervisor.max_model_processes);
    if (bound == 0) return;
    const std::vector<pid_t> processes = ProcessesUnder(::getpid(), {::getpid(), serving_});
    if (processes.size() <= bound) {
      processes_bounded_ = false;
      return;
    }
    const size_t excess = processes.size() - bound;
    for (size_t i = 0; i < excess; ++i) ::kill(processes[i], SIGKILL);  // youngest first
    if (!processes_bounded_) {
      Log(LogLevel::kError,
          "model code started more processes than it may have; killed the youngest",
          {{"processes", std::to_string(processes.size()), false},
           {"bound", std::to_string(bound), false},
           {"killed", std::to_string(excess), false}});
    }
    processes_bounded_ = true;
  }

  void ReadReportNow() {
    if (report_fd_ < 0) return;
    const bool stuck_loads_plausible =
        Clock::now() - started_ >= std::chrono::seconds(config_.models.load_timeout_s);
    report_ = ReadReport(report_fd_, std::move(report_),
                         loads_told_by_warden_ ? ReportSource::kPipe : ReportSource::kPipeAlone,
                         stuck_loads_plausible);
    if (report_.lifted.empty()) return;
    bool changed = false;
    for (const std::string& model_key : report_.lifted) {
      changed = inherited_.quarantined.erase(model_key) != 0 || changed;
      Act(culprit_search_.Excuse(model_key));
    }
    report_.lifted.clear();
    if (changed) SaveQuarantine();
  }

  // Whether `sender` is the serving process `child` or a process of its group (what its models
  // forked).
  static bool FromServingProcess(pid_t sender, pid_t child) {
    return sender > 0 && (sender == child || ::getpgid(sender) == child);
  }

  // Sleeps `delay` unless SIGTERM or SIGINT comes first (true then: stop).
  bool WaitOrStop(std::chrono::milliseconds delay) {
    const Clock::time_point until = Clock::now() + delay;
    while (Clock::now() < until) {
      const int signal_number =
          Wait(std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now())).number;
      if (signal_number == SIGTERM || signal_number == SIGINT) return true;
    }
    return false;
  }

  struct Listener {
    std::string address;
    int port = 0;
    int* fd = nullptr;        // in inherited_
    bool http2 = false;       // gRPC's
    ListenerOptions options;  // as bound, put back each second (TendListenerOptions)
  };

  const ServerConfig config_;
  Inheritance inherited_;
  std::vector<Listener> listeners_;
  int signals_ = -1;               // a signalfd for SIGTERM, SIGINT and SIGCHLD
  int stdout_pipe_[2] = {-1, -1};  // the serving process's descriptor 1, once it serves
  int stderr_pipe_[2] = {-1, -1};  // and 2
  int log_pipe_[2] = {-1, -1};     // its own log records
  ExitWarden exit_warden_;         // the serving process's exit filter's listener, while it lives
  // Whether the serving process's filter tells its loads (ReportSource), for its whole life: its
  // pipe's last lines are read after the listener is closed.
  bool loads_told_by_warden_ = false;
  std::vector<int> launcher_descriptors_;  // LauncherDescriptors, as the supervisor started
  DescriptorOutput stdout_{&stdout_pipe_[0], "stdout"};
  DescriptorOutput stderr_{&stderr_pipe_[0], "stderr"};
  ServerLogForwarder server_log_{&log_pipe_[0]};
  LivenessProbe probe_;
  std::map<std::string, mode_t> repository_modes_;  // by path: see RestoreRepositoryModes
  pid_t serving_ = 0;                               // the serving process while it runs
  bool rebind_listeners_ = false;           // every listener bound afresh before the next start
  Clock::time_point next_upkeep_{};         // see TendServingProcess
  std::vector<pid_t> holder_scan_pending_;  // KillListenerHolders' walk, still to read
  bool processes_bounded_ = false;          // BoundModelProcesses killed some; logged once a burst
  int report_fd_ = -1;                      // the serving process's report pipe, while it runs
  bool report_open_ = false;                // its write end not closed yet
  Report report_;                           // what came on it so far
  Clock::time_point started_;
  // While it starts: when it is killed unless it comes a step further (TendStart).
  std::optional<Clock::time_point> start_step_deadline_;
  int start_steps_seen_ = 0;  // report_.loads_begun when that deadline was set
  // Its ports have all answered since its "ready" (TendServingProcess): it serves.
  bool served_ = false;
  std::map<std::string, std::deque<Clock::time_point>> crash_times_;  // by model key
  CulpritSearch culprit_search_{
      {.deaths_to_start = config_.supervisor.max_model_crashes,
       .window = std::chrono::seconds(config_.supervisor.crash_window_s),
       .shortest_trial = std::chrono::seconds(10),
       .longest_trial = std::chrono::seconds(config_.supervisor.crash_window_s)}};
};

}  // namespace

Result<int> RunSupervised(ServerConfig config) { return Supervisor(std::move(config)).Run(); }

}  // namespace orochi::server

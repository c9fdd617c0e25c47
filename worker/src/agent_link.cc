#include "dlrun/agent_link.h"
#include "recovery/agent_word.h"

#include <fcntl.h>
#include <malloc.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <fstream>

#include "text.h"
#include "common/contract.h"
#include "common/scheduler_env.h"
#include "dlrun/nvtx_ranges.h"

extern char** environ;

namespace dlrun::worker {

namespace {

// `s` as a JSON string literal (UTF-8 passes through; control characters are escaped).
std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += lite::StrFormat("\\u%04x", static_cast<unsigned>(c));
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

int HeartbeatFd() {
  static const int fd = [] {
    const char* v = std::getenv(contract::kHeartbeatFd);
    int fd = -1;
    if (v == nullptr || !lite::SimpleAtoi(v, &fd) || fd < 0 || fcntl(fd, F_GETFD) < 0) return -1;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
  }();
  return fd;
}

}  // namespace

void report_step(const StepReport& r) {
  profile_capture_after_step(r.step);  // --profile nsys --profile-steps (dlrun/nvtx_ranges.h)
  const int fd = HeartbeatFd();
  if (fd < 0) return;
  // "S <step> <samples> <step_s> [data_s=] [compute_s=] [sync_s=] [loss=]\n" (step_record.h).
  char line[256];
  int n = std::snprintf(line, sizeof line, "S %lld %lld %.6f", r.step, r.samples,
                        r.step_s < 0 ? 0.0 : r.step_s);
  auto add = [&](const char* key, double v) {
    if (n > 0 && n < static_cast<int>(sizeof line) - 40) {
      n += std::snprintf(line + n, sizeof line - static_cast<size_t>(n), " %s=%.6g", key, v);
    }
  };
  if (r.data_s >= 0) add("data_s", r.data_s);
  if (r.compute_s >= 0) add("compute_s", r.compute_s);
  if (r.sync_s >= 0) add("sync_s", r.sync_s);
  if (std::isfinite(r.loss)) add("loss", r.loss);
  if (n <= 0 || n >= static_cast<int>(sizeof line) - 1) return;
  line[n++] = '\n';
  (void)!write(fd, line, static_cast<size_t>(n));  // one write: atomic on a pipe (< PIPE_BUF)
}

void report_resume(long long step, double load_s) {
  const int fd = HeartbeatFd();
  if (fd < 0 || step < 0) return;
  char line[64];
  const int n = std::snprintf(line, sizeof line, "R %lld %.6f\n", step,
                              std::isfinite(load_s) && load_s > 0 ? load_s : 0.0);
  if (n > 0 && n < static_cast<int>(sizeof line)) {
    (void)!write(fd, line, static_cast<size_t>(n));  // one write: atomic on a pipe
  }
}

namespace {
// A record is at most 256 bytes (launcher/workers/step_record.h).
void WriteRecord(const char* line, int n) {
  const int fd = HeartbeatFd();
  if (fd < 0 || n <= 0 || n > 256) return;
  (void)!write(fd, line, static_cast<size_t>(n));  // one write: atomic on a pipe
}
}  // namespace

void declare_in_process_recovery() { WriteRecord("C recovery\n", 11); }

namespace detail {
void RecordRefusal(const std::string& rule) {
  // The rule's first line, in ASCII, as much as a record holds.
  std::string line = "C refused ";
  for (const char c : rule.substr(0, rule.find('\n'))) {
    if (line.size() >= 240) break;
    line += static_cast<unsigned char>(c) < 0x80 && c >= ' ' ? c : '?';
  }
  line += '\n';
  WriteRecord(line.data(), static_cast<int>(line.size()));
}
}  // namespace detail

void report_done() { WriteRecord("D done\n", 7); }

HangPause::HangPause(const char* what) {
  char line[96];
  int n = std::snprintf(line, sizeof line, "Z pause ");
  for (const char* c = what; c != nullptr && *c != '\0' && n < 72; ++c) {
    const bool ok = std::isalnum(static_cast<unsigned char>(*c)) || *c == '.' || *c == '_' ||
                    *c == '-';
    line[n++] = ok ? *c : '_';
  }
  if (n == 8) n += std::snprintf(line + n, sizeof line - 8, "pause");
  line[n++] = '\n';
  WriteRecord(line, n);
}

HangPause::~HangPause() { WriteRecord("Z resume\n", 9); }

void report_state_from_peer(long long step, double seconds) {
  char line[128];
  const int n = std::snprintf(line, sizeof line, "P %lld %.6f\n", step < 0 ? 0 : step,
                              std::isfinite(seconds) && seconds > 0 ? seconds : 0.0);
  WriteRecord(line, n);
}

void heartbeat() {
  const int fd = HeartbeatFd();
  if (fd >= 0) {
    const char beat = 'h';
    (void)!write(fd, &beat, 1);  // a full pipe means the agent has beats enough: drop it
  }
}

bool await_promotion() {
  const char* v = std::getenv(contract::kSpareFd);
  int fd = -1;
  if (v == nullptr || !lite::SimpleAtoi(v, &fd) || fd < 0) return false;
  std::string block;
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n > 0) {
      block.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  close(fd);
  if (block.empty()) std::_Exit(0);  // not needed (the agent went away or discarded this spare)
  clearenv();
  size_t start = 0;
  while (start < block.size()) {
    size_t end = block.find('\0', start);
    if (end == std::string::npos) end = block.size();
    const std::string kv = block.substr(start, end - start);
    const size_t eq = kv.find('=');
    if (eq != std::string::npos && eq > 0) {
      setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
    }
    start = end + 1;
  }
  return true;
}

void record_error(const std::string& message) {
  const char* path = std::getenv(contract::kErrorFile);
  if (path == nullptr || *path == '\0') return;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  // torchelastic's error file: {"message": {"message": ..., "extraInfo": {...}}}.
  const std::string j = lite::StrCat("{\"message\": {\"message\": ", JsonString(message),
                                     ", \"extraInfo\": {\"timestamp\": \"",
                                     static_cast<int64_t>(now),
                                     "\", \"py_callstack\": \"(C++ worker)\"}}}");
  const std::string tmp = lite::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp);
    out << j << "\n";
  }
  std::rename(tmp.c_str(), path);  // the agent never reads a half-written file
}

bool keep_freed_memory() {
  if (const char* v = std::getenv(contract::kKeepFreedMemory); v != nullptr && std::string(v) == "0") {
    return false;
  }
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "MALLOC_", 7) == 0 || std::strncmp(*e, "GLIBC_TUNABLES=", 15) == 0) {
      return false;
    }
  }
  // Every large block from the heap (no mmap), and never trim the heap's top.
  bool ok = mallopt(M_MMAP_MAX, 0) == 1;
  ok = mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max()) == 1 && ok;
  return ok;
}

bool requeue_on_signal_requested() {
  const char* want = std::getenv(contract::kRequeueOnSignal);
  const char* job = std::getenv(sched::kSlurmJobId);
  return want != nullptr && std::string(want) == "1" && job != nullptr && *job != '\0';
}

std::string requeue_slurm_job() {
  const char* job = std::getenv(sched::kSlurmJobId);
  if (job == nullptr || *job == '\0') return "SLURM_JOB_ID is unset: not a Slurm job";
  std::string id = job;
  char arg0[] = "scontrol";
  char arg1[] = "requeue";
  char* argv[] = {arg0, arg1, id.data(), nullptr};
  pid_t pid = 0;
  if (int err = posix_spawnp(&pid, "scontrol", nullptr, nullptr, argv, environ); err != 0) {
    return lite::StrCat("cannot run scontrol: ", std::strerror(err));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return lite::StrCat("scontrol requeue ", id, " failed (status ", status, ")");
  }
  return "";
}

}  // namespace dlrun::worker

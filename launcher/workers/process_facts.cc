#include "launcher/workers/process_facts.h"

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"

namespace dlrun::launcher {

double CpuSeconds(const rusage& usage) {
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

std::vector<std::string> OomKillFiles(const std::string& proc_self_cgroup,
                                      const std::string& root) {
  // v2: "0::/PATH" -> ROOT/PATH/memory.events; v1: "N:memory:/PATH" (or a list with memory)
  // -> ROOT/memory/PATH/memory.oom_control. Both carry a line "oom_kill N".
  std::vector<std::string> files;
  for (const CgroupEntry& e : ParseProcCgroup(proc_self_cgroup)) {
    if (e.v2()) {
      files.push_back(root + e.path + "/memory.events");
    } else if (e.Has("memory")) {
      files.insert(files.begin(), root + "/memory" + e.path + "/memory.oom_control");
    }
  }
  return files;
}

int64_t ReadOomKillCount(const std::vector<std::string>& files) {
  for (const std::string& f : files) {
    std::ifstream in(f);
    for (std::string key; in >> key;) {
      int64_t n = 0;
      if (!(in >> n)) break;
      if (key == "oom_kill") return n;
    }
  }
  return -1;
}

int64_t ReadOomKills(const std::string& proc_self_cgroup, const std::string& root) {
  return ReadOomKillCount(OomKillFiles(proc_self_cgroup, root));
}

ProcFsFacts::ProcFsFacts()
    : oom_kill_files_(OomKillFiles(ReadWholeFile("/proc/self/cgroup"), "/sys/fs/cgroup")) {}

int64_t ProcFsFacts::OomKills() const { return ReadOomKillCount(oom_kill_files_); }

ProcessFacts::SignalAction ProcFsFacts::Disposition(pid_t pid, int sig) const {
  if (sig < 1 || sig > 64) return SignalAction::kUnknown;
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  int found = 0;
  SignalAction action = SignalAction::kDefault;
  while (found < 2 && std::getline(status, line)) {
    const bool ign = line.rfind("SigIgn:", 0) == 0, cgt = line.rfind("SigCgt:", 0) == 0;
    if (!ign && !cgt) continue;
    ++found;
    uint64_t mask = 0;
    if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(line.substr(7)), &mask)) {
      return SignalAction::kUnknown;
    }
    if ((mask >> (sig - 1) & 1) != 0) action = ign ? SignalAction::kIgnored : SignalAction::kCaught;
  }
  return found == 2 ? action : SignalAction::kUnknown;
}

bool ProcFsFacts::Stopped(pid_t pid) const {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  std::getline(in, stat);
  const size_t paren = stat.rfind(')');  // the name in parentheses may hold anything
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T';
}

std::string ProcFsFacts::BlockedCall(pid_t pid) const {
  std::ifstream in(absl::StrCat("/proc/", pid, "/syscall"));
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace dlrun::launcher

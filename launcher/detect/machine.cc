// The machine dlrun runs on (machine.h): CPUs, GPUs, topology, host name.
#include "launcher/detect/machine.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/contract.h"

namespace dlrun::launcher {
namespace {

// The CPUs this process may run on (its affinity mask, e.g. what Slurm gave the step).
std::vector<int> AllowedCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  if (cpus.empty()) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (int c = 0; c < std::max(1L, n); ++c) cpus.push_back(c);
  }
  return cpus;
}

int CountGpus() {
  int n = 0;
  while (std::filesystem::exists("/dev/nvidia" + std::to_string(n))) ++n;
  return n;
}

std::string HostName() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

}  // namespace

std::vector<int> ParseCpuList(const std::string& list) {
  std::vector<int> out;
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    std::vector<std::string> r = absl::StrSplit(absl::StripAsciiWhitespace(item), '-');
    int lo = 0, hi = 0;
    if (r.empty() || r.size() > 2 || !absl::SimpleAtoi(r[0], &lo) ||
        !absl::SimpleAtoi(r.back(), &hi) || lo < 0 || hi < lo || hi > 1 << 20) {
      return {};
    }
    for (int c = lo; c <= hi; ++c) out.push_back(c);
  }
  return out;
}

namespace {

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

}  // namespace

CpuTopology ReadCpuTopology(const std::string& root) {
  CpuTopology t;
  for (int n = 0;; ++n) {
    const std::string dir = absl::StrCat(root, "/devices/system/node/node", n);
    if (!std::filesystem::exists(dir)) break;
    t.numa_nodes.push_back(ParseCpuList(ReadSmallFile(dir + "/cpulist")));
  }
  std::map<int, std::vector<int>> by_package;
  for (int c = 0;; ++c) {
    const std::string f =
        absl::StrCat(root, "/devices/system/cpu/cpu", c, "/topology/physical_package_id");
    if (!std::filesystem::exists(f)) break;
    int pkg = 0;
    if (absl::SimpleAtoi(ReadSmallFile(f), &pkg)) by_package[pkg].push_back(c);
  }
  for (auto& [pkg, cpus] : by_package) t.sockets.push_back(std::move(cpus));
  return t;
}

Machine DetectMachine(const LaunchOptions& o, const EnvLookup& env) {
  Machine m;
  m.cpus = AllowedCpus();
  m.gpus.visible_devices = env(contract::kCudaVisibleDevices);
  m.gpus.device_count = CountGpus();
  if (o.gpus.mode == GpuSpec::Mode::kLeastLoaded) m.gpus.loads = QueryGpuLoads();
  if (o.cpu_affinity == CpuAffinity::kNode || o.cpu_affinity == CpuAffinity::kSocket) {
    m.topology = ReadCpuTopology();
  }
  m.hostname = HostName();
  return m;
}

}  // namespace dlrun::launcher

#include "dlrun/agent_link.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace dlrun::worker {

void heartbeat() {
  static const int fd = [] {
    const char* v = std::getenv("DLRUN_HEARTBEAT_FD");
    int fd = -1;
    if (v == nullptr || !absl::SimpleAtoi(v, &fd) || fd < 0 || fcntl(fd, F_GETFD) < 0) return -1;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
  }();
  if (fd >= 0) {
    const char beat = 'h';
    (void)!write(fd, &beat, 1);  // a full pipe means the agent has beats enough: drop it
  }
}

void recordError(const std::string& message) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  nlohmann::json j;
  j["message"]["message"] = message;
  j["message"]["extraInfo"]["timestamp"] = absl::StrCat(static_cast<int64_t>(now));
  j["message"]["extraInfo"]["py_callstack"] = "(C++ worker)";
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp);
    out << j.dump() << "\n";
  }
  std::rename(tmp.c_str(), path);  // the agent never reads a half-written file
}

}  // namespace dlrun::worker

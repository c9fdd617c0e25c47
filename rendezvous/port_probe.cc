#include "rendezvous/port_probe.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/host_port.h"

namespace dlrun::rdzv {
namespace {

// The first line a peer sent, printable ASCII only, at most 60 characters.
std::string Printable(const char* buf, ssize_t n) {
  std::string out;
  for (ssize_t i = 0; i < n && out.size() < 60; ++i) {
    const char c = buf[i];
    if (c == '\r' || c == '\n') break;
    out += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  return out;
}

// Connected within 300 ms: then what the peer says in the next 300 ms ("" for nothing).
std::optional<std::string> ConnectAndListen(const addrinfo* a) {
  const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  bool up = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
  if (!up && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    up = poll(&p, 1, 300) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
         err == 0;
  }
  std::optional<std::string> said;
  if (up) {
    said = "";
    pollfd p{fd, POLLIN, 0};
    char buf[128];
    if (poll(&p, 1, 300) == 1) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n > 0) said = Printable(buf, n);
    }
  }
  close(fd);
  return said;
}

bool IsLocal(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(a);
    if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) return true;
  } else if (a->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a);
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
  }
  // Any other address of this host: a socket binds to it only if it is ours.
  const int fd = socket(a->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_storage s{};
  const socklen_t len = a->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  std::memcpy(&s, a, len);
  reinterpret_cast<sockaddr_in*>(&s)->sin_port = 0;  // the port field is at the same offset
  const bool ours = bind(fd, reinterpret_cast<sockaddr*>(&s), len) == 0;
  close(fd);
  return ours;
}

// The inodes of the sockets listening on `port` (state 0A) in /proc/net/tcp and tcp6.
std::set<std::string> ListeningInodes(int port) {
  std::set<std::string> inodes;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      const std::vector<std::string> f =
          absl::StrSplit(line, ' ', absl::SkipWhitespace());
      if (f.size() < 10 || f[3] != "0A") continue;
      const size_t colon = f[1].rfind(':');
      if (colon == std::string::npos) continue;
      if (std::strtol(f[1].c_str() + colon + 1, nullptr, 16) == port) inodes.insert(f[9]);
    }
  }
  return inodes;
}

}  // namespace

std::string LocalListener(int port) {
  const std::set<std::string> inodes = ListeningInodes(port);
  if (inodes.empty()) return "";
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return "";
  std::string found;
  while (dirent* e = readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    const std::string fds = absl::StrCat("/proc/", pid, "/fd");
    DIR* d = opendir(fds.c_str());
    if (d == nullptr) continue;
    while (dirent* f = readdir(d)) {
      char target[64];
      const ssize_t n =
          readlink(absl::StrCat(fds, "/", f->d_name).c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      absl::string_view t(target);
      if (absl::ConsumePrefix(&t, "socket:[") && absl::ConsumeSuffix(&t, "]") &&
          inodes.count(std::string(t))) {
        std::ifstream comm(absl::StrCat("/proc/", pid, "/comm"));
        std::string name;
        std::getline(comm, name);
        found = absl::StrCat(name.empty() ? "a process" : name, " (pid ", pid, ")");
        break;
      }
    }
    closedir(d);
    if (!found.empty()) break;
  }
  closedir(proc);
  return found;
}

std::optional<std::string> WhatAnswers(const std::string& endpoint) {
  const HostPort hp = SplitHostPort(endpoint);
  int port = 0;
  if (!hp.has_port || endpoint.find("://") != std::string::npos ||
      !absl::SimpleAtoi(hp.port, &port)) {
    return std::nullopt;
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(Unbracketed(hp.host).c_str(), hp.port.c_str(), &hints, &found) != 0) {
    return std::nullopt;
  }
  std::optional<std::string> what;
  for (addrinfo* a = found; a != nullptr && !what; a = a->ai_next) {
    std::optional<std::string> said = ConnectAndListen(a);
    if (!said) continue;
    const std::string owner = IsLocal(a->ai_addr) ? LocalListener(port) : "";
    what = absl::StrCat(owner, owner.empty() ? "" : " on this host",
                        said->empty() ? ""
                                      : absl::StrCat(owner.empty() ? "it" : ", which",
                                                     " said '", *said, "'"));
  }
  freeaddrinfo(found);
  return what;
}

}  // namespace dlrun::rdzv

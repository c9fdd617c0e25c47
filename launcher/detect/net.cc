#include "launcher/detect/net.h"


#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dlrun::launcher {

PortReservation::~PortReservation() {
  if (fd_ >= 0) close(fd_);
}

PortReservation& PortReservation::operator=(PortReservation&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.fd_;
    port_ = o.port_;
    o.fd_ = -1;
    o.port_ = 0;
  }
  return *this;
}

PortReservation ReservePort(const std::string& addr) {
  PortReservation r;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return r;
  // SO_REUSEADDR and no listen(): the worker's store (which sets SO_REUSEADDR, as c10d's
  // TCPStore does) can still bind the port, while the kernel hands it to nobody else's bind(0).
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_ANY);
  int port = 0;
  socklen_t len = sizeof sa;
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
    port = ntohs(sa.sin_port);
  }
  if (port == 0) {
    close(fd);
    return r;
  }
  r.fd_ = fd;
  r.port_ = port;
  return r;
}

bool IsHostPort(const std::string& endpoint) {
  const HostPort hp = SplitHostPort(endpoint);
  int port = 0;
  return !hp.host.empty() &&
         (!hp.has_port || (absl::SimpleAtoi(hp.port, &port) && port >= 0 && port <= 65535));
}

absl::Status ResolveHost(const std::string& host) {
  const std::string h = Unbracketed(host);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(h.c_str(), nullptr, &hints, &res);
  if (res != nullptr) freeaddrinfo(res);
  if (rc == 0) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("cannot resolve '", h, "': ",
                                          rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc)));
}

bool CanBind(const std::string& host, const std::string& port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) return false;
  bool ok = false;
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as gRPC's listener does
    ok = bind(fd, res->ai_addr, res->ai_addrlen) == 0;
    close(fd);
  }
  freeaddrinfo(res);
  return ok;
}

}  // namespace dlrun::launcher

#include "common/local_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace dlrun {

std::string LocalAddressFor(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return "";
  std::string out;
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {  // UDP: no packet sent
    sockaddr_in sa{};
    socklen_t len = sizeof sa;
    char buf[INET_ADDRSTRLEN];
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0 &&
        inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf)) {
      out = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

}  // namespace dlrun

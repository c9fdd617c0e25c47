#include "telemetry/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dlrun::telemetry {
namespace {

constexpr size_t kMaxHead = 16 << 10;       // a request head larger than this is refused
constexpr int kReadTimeoutS = 10;           // a client that sends nothing for this long is dropped
constexpr size_t kMaxConnections = 64;      // beyond this, 503 at once

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

std::string Wire(const HttpResponse& r, bool head_only) {
  std::string out = absl::StrCat("HTTP/1.1 ", r.status, " ", Reason(r.status),
                                 "\r\nContent-Type: ", r.content_type,
                                 "\r\nContent-Length: ", r.body.size(), "\r\nConnection: close\r\n");
  for (const auto& [k, v] : r.headers) absl::StrAppend(&out, k, ": ", v, "\r\n");
  out += "\r\n";
  if (!head_only) out += r.body;
  return out;
}

HttpResponse Plain(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

void WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace

std::string HttpServer::Respond(const std::string& head) const {
  const size_t eol = head.find("\r\n");
  const std::string line = head.substr(0, eol);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? std::string::npos : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || line.compare(sp2 + 1, 5, "HTTP/") != 0) {
    return Wire(Plain(400, "bad request line\n"), false);
  }
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (method != "GET" && method != "HEAD") {
    HttpResponse r = Plain(405, "only GET and HEAD\n");
    r.set_header("Allow", "GET, HEAD");
    return Wire(r, false);
  }
  path = path.substr(0, path.find_first_of("?#"));
  const bool head_only = method == "HEAD";
  for (const auto& [p, h] : exact_) {
    if (p == path) {
      HttpResponse r;
      h("", &r);
      return Wire(r, head_only);
    }
  }
  const std::pair<std::string, Handler>* best = nullptr;
  for (const auto& route : prefix_) {
    if (path.compare(0, route.first.size(), route.first) == 0 &&
        (best == nullptr || route.first.size() > best->first.size())) {
      best = &route;
    }
  }
  if (best != nullptr) {
    HttpResponse r;
    best->second(path.substr(best->first.size()), &r);
    return Wire(r, head_only);
  }
  return Wire(Plain(404, absl::StrCat("no ", path, " here\n")), head_only);
}

absl::StatusOr<int> HttpServer::Listen(const std::string& addr, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(addr.empty() ? nullptr : addr.c_str(), service.c_str(), &hints, &res);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot serve HTTP on '", addr, "': ", gai_strerror(rc)));
  }
  int fd = -1;
  std::string err;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
      err = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", addr, ":", port, " (",
                                               err.empty() ? "no address" : err, ")"));
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  const int bound = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                                   : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (pipe2(wake_, O_CLOEXEC) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  listen_fd_ = fd;
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  return bound;
}

void HttpServer::AcceptLoop() {
  while (!stopping_) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (p[1].revents != 0 || stopping_) return;
    if ((p[0].revents & POLLIN) == 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    // Reap the connections that finished.
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->done) {
        it->thread.join();
        close(it->fd);
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
    if (conns_.size() >= kMaxConnections) {
      WriteAll(fd, Wire(Plain(503, "too many connections\n"), false));
      close(fd);
      continue;
    }
    Connection& c = conns_.emplace_back();
    c.fd = fd;
    c.thread = std::thread([this, &c] { Serve(&c); });
  }
}

void HttpServer::Serve(Connection* c) {
  timeval tv{kReadTimeoutS, 0};
  setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string head;
  char buf[4096];
  while (head.find("\r\n\r\n") == std::string::npos && head.size() <= kMaxHead) {
    ssize_t n = recv(c->fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    head.append(buf, static_cast<size_t>(n));
  }
  if (head.find("\r\n\r\n") != std::string::npos) {
    WriteAll(c->fd, Respond(head));
  } else if (head.size() > kMaxHead) {
    WriteAll(c->fd, Wire(Plain(431, "request head too large\n"), false));
  }
  shutdown(c->fd, SHUT_WR);
  c->done = true;
}

void HttpServer::Stop() {
  if (listen_fd_ < 0) return;
  stopping_ = true;
  if (wake_[1] >= 0) (void)!write(wake_[1], "x", 1);
  if (accept_thread_.joinable()) accept_thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Connection& c : conns_) shutdown(c.fd, SHUT_RDWR);  // wakes a thread blocked in recv
    for (Connection& c : conns_) {
      c.thread.join();
      close(c.fd);
    }
    conns_.clear();
  }
  close(listen_fd_);
  listen_fd_ = -1;
  for (int& fd : wake_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

}  // namespace dlrun::telemetry

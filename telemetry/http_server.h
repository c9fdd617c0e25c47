// A small HTTP/1.1 server for the read-only telemetry endpoints (telemetry/metrics_http.cc):
// GET and HEAD only, one request per connection (Connection: close), each connection on a
// thread of its own so that a browser's idle preconnect never holds up Prometheus. Written
// here rather than taken from a library so that the rendezvous plugin has no shared-library
// dependency beyond the C library (docs/PACKAGING.md).
#pragma once

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace dlrun::telemetry {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  void set_content(std::string b, std::string type) {
    body = std::move(b);
    content_type = std::move(type);
  }
  void set_header(std::string k, std::string v) { headers.emplace_back(std::move(k), std::move(v)); }
};

class HttpServer {
 public:
  // `rest` is what follows the route's prefix (empty for an exact route).
  using Handler = std::function<void(const std::string& rest, HttpResponse* res)>;

  HttpServer() = default;
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  ~HttpServer() { Stop(); }

  // Routes, matched on the path without its query: exact first, then the longest prefix.
  void Get(std::string path, Handler h) { exact_.emplace_back(std::move(path), std::move(h)); }
  void GetPrefix(std::string prefix, Handler h) {
    prefix_.emplace_back(std::move(prefix), std::move(h));
  }
  // Binds addr:port (port 0: any free port), starts serving; returns the port.
  absl::StatusOr<int> Listen(const std::string& addr, int port);
  // Stops accepting, ends open connections and joins every thread. Idempotent.
  void Stop();

  // The response to one request's head ("GET /x HTTP/1.1\r\n..."), as it goes on the wire.
  std::string Respond(const std::string& head) const;

 private:
  struct Connection {
    int fd = -1;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  void AcceptLoop();
  void Serve(Connection* c);

  std::vector<std::pair<std::string, Handler>> exact_, prefix_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread accept_thread_;
  std::mutex mu_;
  std::list<Connection> conns_;  // guarded by mu_
  std::atomic<bool> stopping_{false};
};

}  // namespace dlrun::telemetry

// rdzv_bench: N simulated agents join one rendezvous round over real gRPC on loopback, then
// re-join after one of them reports a failure. The server runs in a child process so its memory
// can be read; the same is done for a bare gRPC "floor" server (a unary call held until all N
// have arrived), measured in the same run.
//
//   build/bin/rdzv_bench --agents 4096 [--nproc 8] [--channels 16] [--json] [--telemetry]
// --telemetry: the server keeps the job's telemetry aggregate (docs/TELEMETRY.md) and each
// heartbeat wave comes with the Publish calls on the job channel that the agents make after
// that heartbeat (each with its node's NodeTelemetry): every agent's in a job of up to
// rdzv::kPublishesPerBeat nodes, in turn beyond (rdzv::PublishesAfter, the agent's own rule).
// Each wave also reports the server's CPU seconds for it (wave_server_cpu_s, slowest wave).
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dlrun/proto/rendezvous.grpc.pb.h"
#include "rendezvous/handler.h"
#include "rendezvous/server.h"

namespace {

using dlrun::rdzv::v1::JoinRequest;
using dlrun::rdzv::v1::JoinResponse;
using dlrun::rdzv::v1::Rendezvous;

struct Flags {
  int agents = 1024;
  int nproc = 8;
  int channels = 16;
  bool json = false;
  bool telemetry = false;  // --telemetry: the server aggregates; heartbeats carry NodeTelemetry
  std::string serve;  // internal: "rdzv" or "floor" in the child
};

// The floor: holds every Join until N have arrived, then finishes them all. No state machine.
class FloorService final : public Rendezvous::CallbackService {
 public:
  explicit FloorService(int n) : n_(n) {}
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const JoinRequest*,
                                 JoinResponse*) override {
    auto* r = ctx->DefaultReactor();
    std::vector<grpc::ServerUnaryReactor*> done;
    {
      std::lock_guard<std::mutex> l(mu_);
      held_.push_back(r);
      if (static_cast<int>(held_.size()) == n_) done.swap(held_);
    }
    for (auto* d : done) d->Finish(grpc::Status::OK);
    return r;
  }

 private:
  const int n_;
  std::mutex mu_;
  std::vector<grpc::ServerUnaryReactor*> held_;
};

// Child: serve until killed; write the port to stdout.
int Serve(const Flags& f) {
  std::unique_ptr<grpc::Server> floor_server;
  std::unique_ptr<dlrun::rdzv::RendezvousServer> rdzv;
  FloorService floor(f.agents);
  int port = 0;
  if (f.serve == "floor") {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&floor);
    floor_server = b.BuildAndStart();
  } else {
    dlrun::rdzv::ServerOptions o;
    o.handler.config.min_nodes = f.agents;
    o.handler.config.max_nodes = f.agents;
    o.handler.config.max_restarts = 1;
    o.handler.config.heartbeat_interval = std::chrono::minutes(10);
    o.handler.run_id = "bench";
    o.handler.token = "bench-token";
    if (f.telemetry) o.handler.telemetry = std::make_shared<dlrun::telemetry::JobTelemetry>();
    auto s = dlrun::rdzv::RendezvousServer::Start(std::move(o));
    if (!s.ok()) {
      std::fprintf(stderr, "rdzv_bench: %s\n", std::string(s.status().message()).c_str());
      return 1;
    }
    rdzv = std::move(*s);
    port = rdzv->port();
  }
  std::printf("%d\n", port);
  std::fflush(stdout);
  pause();  // killed by the parent
  return 0;
}

struct Child {
  pid_t pid = -1;
  int port = 0;
};

Child Spawn(const char* self, const Flags& f, const std::string& mode) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    std::string agents = std::to_string(f.agents);
    execl(self, self, "--serve", mode.c_str(), "--agents", agents.c_str(),
          f.telemetry ? "--telemetry" : "--json", nullptr);
    _exit(127);
  }
  close(fds[1]);
  char buf[32] = {0};
  ssize_t n = read(fds[0], buf, sizeof buf - 1);
  close(fds[0]);
  Child c;
  c.pid = pid;
  c.port = n > 0 ? std::atoi(buf) : 0;
  return c;
}

void Kill(const Child& c) {
  if (c.pid <= 0) return;
  kill(c.pid, SIGKILL);
  waitpid(c.pid, nullptr, 0);
}

// The process's CPU seconds so far (user + system), from /proc.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream rest(all.substr(all.rfind(')') + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double PeakRssMb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  }
  return -1;
}

struct RoundResult {
  double seconds = -1;
  int errors = 0;
  std::string first_error;
  std::vector<JoinResponse> responses;
};

// `channels` stubs on distinct connections (the tag keeps each wave's connections apart).
std::vector<std::unique_ptr<Rendezvous::Stub>> Stubs(int port, int channels, int tag) {
  std::vector<std::unique_ptr<Rendezvous::Stub>> stubs;
  for (int c = 0; c < channels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", c + tag * 1000);
    stubs.push_back(Rendezvous::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args)));
  }
  return stubs;
}

void FillAuth(dlrun::rdzv::v1::Auth* a) {
  a->set_protocol_version(dlrun::rdzv::kProtocolVersion);
  a->set_run_id("bench");
  a->set_token("bench-token");
}

std::string NodeId(int i) {
  char id[32];
  std::snprintf(id, sizeof id, "node%06d", i);
  return id;
}

// Sends all joins asynchronously over `channels` channels; times first send -> last reply.
RoundResult JoinAll(int port, const Flags& f, int round_tag) {
  auto stubs = Stubs(port, f.channels, round_tag);
  struct Call {
    grpc::ClientContext ctx;
    JoinRequest req;
    JoinResponse resp;
  };
  std::vector<std::unique_ptr<Call>> calls(f.agents);
  for (int i = 0; i < f.agents; ++i) {
    calls[i] = std::make_unique<Call>();
    auto& r = calls[i]->req;
    FillAuth(r.mutable_auth());
    const std::string id = NodeId(i);
    r.mutable_node()->set_node_id(id);
    r.mutable_node()->set_hostname(id);
    r.mutable_node()->set_address("127.0.0.1");
    r.mutable_node()->set_nproc(f.nproc);
    r.mutable_node()->set_slurm_node_id(-1);
    r.mutable_node()->set_master_port(29500);
    calls[i]->ctx.set_wait_for_ready(true);
    calls[i]->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  }
  std::mutex mu;
  std::condition_variable cv;
  int remaining = f.agents;
  RoundResult res;
  const auto t0 = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point t_last;
  for (int i = 0; i < f.agents; ++i) {
    stubs[i % f.channels]->async()->Join(
        &calls[i]->ctx, &calls[i]->req, &calls[i]->resp, [&](grpc::Status s) {
          std::lock_guard<std::mutex> l(mu);
          if (!s.ok()) {
            if (res.errors++ == 0) res.first_error = s.error_message();
          }
          if (--remaining == 0) {
            t_last = std::chrono::steady_clock::now();
            cv.notify_all();
          }
        });
  }
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return remaining == 0; });
  res.seconds = std::chrono::duration<double>(t_last - t0).count();
  for (auto& c : calls) res.responses.push_back(std::move(c->resp));
  return res;
}

// One heartbeat from every agent (round 2), all in flight at once over `channels` channels;
// with `telemetry`, each agent also publishes its node's NodeTelemetry for nproc ranks on the
// job channel (what agents send every second, beside the heartbeat since protocol 3). Returns
// the time first send -> last reply, or -1 if any failed.
double HeartbeatAll(int port, pid_t pid, const Flags& f, bool telemetry, uint64_t beat,
                    double* server_cpu_s) {
  auto stubs = Stubs(port, f.channels, 9);
  std::vector<std::unique_ptr<dlrun::rdzv::v1::JobChannel::Stub>> channel_stubs;
  for (int c = 0; c < f.channels; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", c + 9 * 1000);  // the same connections as the heartbeats
    channel_stubs.push_back(dlrun::rdzv::v1::JobChannel::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args)));
  }
  struct Call {
    grpc::ClientContext ctx, publish_ctx;
    dlrun::rdzv::v1::HeartbeatRequest req;
    dlrun::rdzv::v1::HeartbeatResponse resp;
    dlrun::rdzv::v1::PublishRequest publish;
    dlrun::rdzv::v1::PublishResponse published;
  };
  std::vector<std::unique_ptr<Call>> calls(f.agents);
  std::vector<bool> publishes(f.agents);
  int publishing = 0;
  for (int i = 0; i < f.agents; ++i) {
    publishes[i] = telemetry && dlrun::rdzv::PublishesAfter(beat, i, f.agents);
    publishing += publishes[i];
    calls[i] = std::make_unique<Call>();
    auto& r = calls[i]->req;
    FillAuth(r.mutable_auth());
    const std::string id = NodeId(i);
    r.set_node_id(id);
    r.set_round(2);
    if (publishes[i]) {
      dlrun::telemetry::NodeTelemetry t;
      t.hostname = id;
      for (int k = 0; k < f.nproc; ++k) {
        dlrun::telemetry::RankTelemetry x;
        x.rank = i * f.nproc + k;
        x.local_rank = k;
        x.steps = 1000;
        x.samples = 4000;
        x.step_s = x.compute_s = 500;
        x.has_split = true;
        x.step_p50_s = x.step_p95_s = 0.5;
        x.cpu_utilization = 0.95;
        x.cpu_s = 480;
        x.rss_bytes = x.rss_peak_bytes = int64_t{3} << 30;
        t.ranks.push_back(x);
      }
      FillAuth(calls[i]->publish.mutable_auth());
      calls[i]->publish.set_node_id(id);
      dlrun::rdzv::ToProto(t, calls[i]->publish.mutable_telemetry());
    }
    calls[i]->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    calls[i]->publish_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  }
  std::mutex mu;
  std::condition_variable cv;
  int remaining = f.agents + publishing, errors = 0;
  const double cpu0 = CpuSeconds(pid);
  const auto t0 = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point t_last;
  auto done = [&](grpc::Status s) {
    std::lock_guard<std::mutex> l(mu);
    if (!s.ok()) ++errors;
    if (--remaining == 0) {
      t_last = std::chrono::steady_clock::now();
      cv.notify_all();
    }
  };
  for (int i = 0; i < f.agents; ++i) {
    stubs[i % f.channels]->async()->Heartbeat(&calls[i]->ctx, &calls[i]->req, &calls[i]->resp,
                                              done);
    if (publishes[i]) {
      channel_stubs[i % f.channels]->async()->Publish(
          &calls[i]->publish_ctx, &calls[i]->publish, &calls[i]->published, done);
    }
  }
  std::unique_lock<std::mutex> l(mu);
  cv.wait(l, [&] { return remaining == 0; });
  *server_cpu_s = CpuSeconds(pid) - cpu0;
  return errors ? -1 : std::chrono::duration<double>(t_last - t0).count();
}

bool ReportFailure(int port) {
  auto stub = Rendezvous::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  dlrun::rdzv::v1::FailureReport req;
  FillAuth(req.mutable_auth());
  req.set_node_id(NodeId(7));
  req.set_round(1);
  req.set_reason("bench: simulated worker failure");
  grpc::ClientContext ctx;
  dlrun::rdzv::v1::FailureResponse resp;
  return stub->ReportFailure(&ctx, req, &resp).ok() && resp.next_round() == 2;
}

bool Consistent(const RoundResult& r, const Flags& f, uint64_t round) {
  std::vector<bool> seen(f.agents, false);
  for (const auto& resp : r.responses) {
    const auto& a = resp.assignment();
    if (a.round() != round || a.world_size() != static_cast<uint32_t>(f.agents * f.nproc) ||
        a.node_rank() >= static_cast<uint32_t>(f.agents) || seen[a.node_rank()] ||
        a.rank_offset() != a.node_rank() * static_cast<uint32_t>(f.nproc)) {
      return false;
    }
    seen[a.node_rank()] = true;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "rdzv_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--agents") f.agents = std::atoi(next().c_str());
    else if (a == "--nproc") f.nproc = std::atoi(next().c_str());
    else if (a == "--channels") f.channels = std::atoi(next().c_str());
    else if (a == "--json") f.json = true;
    else if (a == "--telemetry") f.telemetry = true;
    else if (a == "--serve") f.serve = next();
    else {
      std::fprintf(stderr, "rdzv_bench: unknown flag '%s' (expected --agents N, --nproc N, "
                   "--channels N, --json, --telemetry)\n", a.c_str());
      return 2;
    }
  }
  if (f.agents < 1 || f.nproc < 1 || f.channels < 1) {
    std::fprintf(stderr, "rdzv_bench: --agents, --nproc and --channels must be >= 1\n");
    return 2;
  }
  if (!f.serve.empty()) return Serve(f);

  // The floor first, then dlrun's rendezvous: same clients, same channels, same machine.
  Child floor = Spawn(argv[0], f, "floor");
  RoundResult fl = JoinAll(floor.port, f, 0);
  Kill(floor);

  Child srv = Spawn(argv[0], f, "rdzv");
  RoundResult r1 = JoinAll(srv.port, f, 1);
  const bool ok1 = r1.errors == 0 && Consistent(r1, f, 1);
  const bool reported = ReportFailure(srv.port);
  RoundResult r2 = JoinAll(srv.port, f, 2);
  const bool ok2 = r2.errors == 0 && Consistent(r2, f, 2);
  // Three heartbeat waves (a second's worth each in a real job), with telemetry when asked.
  double hb = 0, hb_cpu = 0;
  for (int w = 0; w < 3 && hb >= 0; ++w) {
    double cpu = 0;
    const double t = HeartbeatAll(srv.port, srv.pid, f, f.telemetry, w, &cpu);
    hb = t < 0 ? -1 : std::max(hb, t);
    hb_cpu = std::max(hb_cpu, cpu);
  }
  const double rss = PeakRssMb(srv.pid);
  Kill(srv);

  if (f.json) {
    std::printf(
        "{\"agents\": %d, \"nproc\": %d, \"channels\": %d, \"rendezvous_s\": %.4f, "
        "\"rerendezvous_s\": %.4f, \"floor_s\": %.4f, \"ratio_to_floor\": %.2f, "
        "\"heartbeat_wave_s\": %.4f, \"wave_server_cpu_s\": %.3f, \"telemetry\": %s, "
        "\"server_rss_mb\": %.1f, \"ok\": %s}\n",
        f.agents, f.nproc, f.channels, r1.seconds, r2.seconds, fl.seconds, r1.seconds / fl.seconds,
        hb, hb_cpu, f.telemetry ? "true" : "false", rss, ok1 && ok2 && reported && hb >= 0 ? "true" : "false");
  } else {
    std::printf("agents          %d (nproc %d, %d channels)\n", f.agents, f.nproc, f.channels);
    std::printf("rendezvous_s    %.4f\n", r1.seconds);
    std::printf("rerendezvous_s  %.4f (after one failure report)\n", r2.seconds);
    std::printf("floor_s         %.4f (bare gRPC: unary call held until all arrive)\n", fl.seconds);
    std::printf("ratio_to_floor  %.2f\n", r1.seconds / fl.seconds);
    std::printf("heartbeat_wave_s %.4f (slowest of 3 waves of one heartbeat per agent%s)\n", hb,
                f.telemetry ? ", with the agents' Publish calls that follow it" : "");
    std::printf("wave_server_cpu_s %.3f (the server's CPU seconds in the slowest wave)\n", hb_cpu);
    std::printf("server_rss_mb   %.1f (peak)\n", rss);
    std::printf("assignments     %s\n", ok1 && ok2 && reported ? "consistent" : "WRONG");
  }
  if (r1.errors || r2.errors) {
    std::fprintf(stderr, "rdzv_bench: %d + %d joins failed: %s%s\n", r1.errors, r2.errors,
                 r1.first_error.c_str(), r2.first_error.c_str());
  }
  if (hb < 0) std::fprintf(stderr, "rdzv_bench: heartbeats failed\n");
  return ok1 && ok2 && reported && hb >= 0 ? 0 : 1;
}

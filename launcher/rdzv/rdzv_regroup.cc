#include "launcher/rdzv/rdzv_regroup.h"

#include <chrono>
#include <utility>

#include "spdlog/spdlog.h"

namespace dlrun::launcher {
namespace {

// How long one watch is held before it is asked again (the host answers earlier on a change).
constexpr std::chrono::seconds kWatchFor{30};
// After a failed watch (the host busy or gone: the heartbeats deal with that), the next one.
constexpr std::chrono::milliseconds kRetryAfter{200};

RegroupLink::Notice FromRdzv(const rdzv::RegroupNotice& n) {
  RegroupLink::Notice out;
  out.generation = n.generation;
  out.master_port = n.master_port;
  out.lost_ranks = n.lost_ranks;
  out.reason = n.reason;
  out.asked_by = n.asked_by;
  for (const rdzv::NodePlace& p : n.places)
    out.places.push_back({p.node_id, p.node_rank, p.rank_offset});
  out.world_size = n.world_size;
  out.master_addr = n.master_addr;
  return out;
}

}  // namespace

RdzvRegroup::RdzvRegroup(MakeClient make_client, std::string node_id)
    : make_client_(std::move(make_client)), node_id_(std::move(node_id)) {}

RdzvRegroup::~RdzvRegroup() { Stop(); }

void RdzvRegroup::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    if (cancel_) cancel_();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = false;
}

void RdzvRegroup::Begin(const std::string& endpoint, uint64_t round, uint64_t epoch) {
  Stop();
  std::shared_ptr<rdzv::RendezvousClient> client = make_client_(endpoint);
  client->set_epoch(epoch);
  std::lock_guard<std::mutex> lock(mu_);
  client_ = std::move(client);
  round_ = round;
  latest_ = {};
  latest_.round = round;
  if (wake_) StartThreadLocked();
}

void RdzvRegroup::Watch(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool running = static_cast<bool>(wake_);
  wake_ = std::move(wake);
  if (!running && client_) StartThreadLocked();
}

void RdzvRegroup::StartThreadLocked() {
  thread_ = std::thread([this, client = client_, round = round_] { Loop(client, round); });
}

RegroupLink::Notice RdzvRegroup::Latest() {
  std::lock_guard<std::mutex> lock(mu_);
  return FromRdzv(latest_);
}

bool RdzvRegroup::Take(const rdzv::RegroupNotice& n) {
  std::lock_guard<std::mutex> lock(mu_);
  // Only forward: an ask's answer may arrive after a watch brought the port already.
  const bool newer = n.generation > latest_.generation ||
                     (n.generation == latest_.generation && latest_.master_port == 0 &&
                      n.master_port != 0);
  if (n.round != round_ || !newer) return false;
  latest_ = n;
  return true;
}

absl::StatusOr<RegroupLink::Notice> RdzvRegroup::Ask(int generation,
                                                     const std::vector<int>& lost_ranks,
                                                     int master_port, const std::string& reason) {
  std::shared_ptr<rdzv::RendezvousClient> client;
  rdzv::RegroupAsk ask;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!client_) return absl::FailedPreconditionError("no round has closed yet");
    client = client_;
    ask.round = round_;
  }
  ask.generation = generation;
  ask.lost_ranks = lost_ranks;
  ask.master_port = master_port;
  ask.reason = reason.substr(0, 1024);
  auto r = client->AskRegroup(node_id_, ask);
  if (!r.ok()) return r.status();
  Take(*r);
  return FromRdzv(*r);
}

void RdzvRegroup::Loop(std::shared_ptr<rdzv::RendezvousClient> client, uint64_t round) {
  auto hook = [this](std::function<void()> cancel) {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_ = std::move(cancel);
    if (stop_ && cancel_) cancel_();  // asked to stop before the call was held
  };
  for (;;) {
    rdzv::RegroupNotice known;
    std::function<void()> wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      known = latest_;
      wake = wake_;
    }
    auto r = client->WatchRegroup(node_id_, known, kWatchFor, hook);
    if (r.ok() && r->round != round) return;  // the round is over: Begin starts the next watch
    if (r.ok()) {
      if (Take(*r) && wake) wake();
      continue;
    }
    spdlog::debug("regroup watch: {}", std::string(r.status().message()));
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, kRetryAfter, [this] { return stop_; });
  }
}

}  // namespace dlrun::launcher

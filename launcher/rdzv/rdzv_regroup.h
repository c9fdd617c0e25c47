// RegroupLink over dlrun's rendezvous (proto `service Regroup`; docs/RECOVERY.md, "Across
// nodes"): a thread holds a Watch open on the round's host, so a regroup another node asks for
// reaches this agent within a round trip, not a heartbeat interval.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "launcher/recovery/regroup_link.h"
#include "rendezvous/client.h"

namespace dlrun::launcher {

class RdzvRegroup final : public RegroupLink {
 public:
  using MakeClient =
      std::function<std::unique_ptr<rdzv::RendezvousClient>(const std::string& endpoint)>;
  RdzvRegroup(MakeClient make_client, std::string node_id);
  ~RdzvRegroup() override;  // cancels the held watch and joins its thread

  // A round closed at `endpoint` (RdzvSource's join): the watch follows it there.
  void Begin(const std::string& endpoint, uint64_t round, uint64_t epoch);

  // Ends the watch (its held call cancelled) until the next Begin.
  void Stop();

  void Watch(std::function<void()> wake) override;
  Notice Latest() override;
  absl::StatusOr<Notice> Ask(int generation, const std::vector<int>& lost_ranks, int master_port,
                             const std::string& reason) override;
  void SetInProcess(bool in_process) override { in_process_.store(in_process); }
  bool in_process() const { return in_process_.load(); }
  std::string node_id() const override { return node_id_; }

 private:
  void StartThreadLocked();
  void Loop(std::shared_ptr<rdzv::RendezvousClient> client, uint64_t round);
  // Takes `n` as the latest when it is this round's and newer (a later generation, or the port
  // of this one); returns whether it did.
  bool Take(const rdzv::RegroupNotice& n);

  const MakeClient make_client_;
  const std::string node_id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<rdzv::RendezvousClient> client_;  // guarded by mu_
  uint64_t round_ = 0;                              // guarded by mu_
  rdzv::RegroupNotice latest_;                      // guarded by mu_
  std::function<void()> wake_;                      // guarded by mu_
  std::function<void()> cancel_;  // guarded by mu_: cancels the watch held now
  bool stop_ = false;             // guarded by mu_
  std::thread thread_;
  std::atomic<bool> in_process_{false};
};

}  // namespace dlrun::launcher

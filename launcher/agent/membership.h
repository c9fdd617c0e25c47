// Membership: where the agent's place in the job comes from, fixed flags (standalone / static
// rendezvous, launcher/rdzv/static_source.h) or dlrun's gRPC rendezvous
// (launcher/rdzv/rdzv_source.h). At most 7 methods, as torch's RendezvousHandler: telemetry and
// diagnostics go through JobChannel.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/assignment.h"
#include "launcher/recovery/regroup_link.h"
#include "launcher/workers/job_channel.h"

namespace dlrun::launcher {

class MembershipSource {
 public:
  enum class Verdict { kContinue, kRestart, kStop, kFinished };
  virtual ~MembershipSource() = default;
  // The next round's assignment. May block (a rendezvous join) when NextMayBlock(): the agent
  // then runs it on a helper thread so signals still reach it.
  virtual absl::StatusOr<Assignment> Next() = 0;
  virtual bool NextMayBlock() const { return check_interval().count() > 0; }
  // A local worker failed: returns true if the job goes on (a new round), false if it is over.
  // `fatal`: it failed the same way as last time (Agent: "a failure that repeats"): the job
  // ends here; the other nodes are stopped, not given a new round (returns false).
  virtual bool OnFailure(const std::string& reason, bool fatal) = 0;
  // A failure of a program that declared in-process recovery, where the recovery was refused,
  // did not finish or could not be made: the restart from the checkpoint that takes its place
  // is not counted against --max-restarts (docs/RECOVERY.md, "Fallbacks").
  virtual bool OnFallback(const std::string& reason) { return OnFailure(reason, false); }
  // The agent itself was told to stop (SIGINT, SIGTERM): no restart follows. By default the
  // others are told as of a failure (a rendezvous opens a round without this node).
  virtual void OnStop(const std::string& reason) { OnFailure(reason, false); }
  // Called every check_interval() while workers run (never if it is zero).
  virtual Verdict Check(std::string* reason) = 0;
  virtual std::chrono::milliseconds check_interval() const = 0;
  // Every local worker succeeded. The agent then keeps calling Check() until it says kFinished
  // (every node is done), kRestart (another node failed: run again) or kStop.
  virtual void OnSuccess() = 0;
};

// What a launch's factory hands the agent: its membership and its job channel (one object
// for both in every backend so far, but the agent holds them apart).
struct JobLink {
  std::shared_ptr<MembershipSource> membership;
  std::shared_ptr<JobChannel> channel;
  // In-process recovery across nodes (null: this job's nodes cannot regroup; a single-node job
  // needs not).
  std::shared_ptr<RegroupLink> regroup;
  template <class Both>
  static JobLink Of(std::shared_ptr<Both> both) {
    return {both, both, nullptr};
  }
};

}  // namespace dlrun::launcher

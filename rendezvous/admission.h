// A node admitted into the running round (state_machine.h; docs/RECOVERY.md, "A node that
// joins"): every member recovers in process, so the round goes on at the larger size and the
// node's join is answered once the new group's port is posted. Until then, or until its deadline
// (config.admit_timeout) or its caller going away, it is held here. Bookkeeping only: the
// StateMachine decides to admit and what the round does when an admission ends unanswered.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "rendezvous/joins.h"
#include "rendezvous/types.h"

namespace dlrun::rdzv {

class Admission {
 public:
  bool active() const { return held_.has_value(); }
  // `node_id` is the node being admitted (a member that is never lost meanwhile).
  bool Holds(const std::string& node_id) const {
    return held_ && held_->join.node.node_id == node_id;
  }
  void Begin(PendingJoin p, TimePoint deadline);
  // The port came: the join to answer; nullopt when none is held or its caller went away.
  std::optional<PendingJoin> Answer();
  // The join of `node_id` with `ticket` is the one held: its caller went away; the survivors'
  // wait for it ends at once (the next Tick ends the admission). False otherwise.
  bool Cancel(const std::string& node_id, uint64_t ticket);
  // A new round opens or the job fails: the held join, unless its caller went away, for the held
  // joins; nothing is held after.
  std::optional<PendingJoin> Release();
  // Past the deadline (or cancelled): the node id to take off the roster and the reason for the
  // new round, whose opening releases the join (Release). Nullopt before it.
  struct Expiry {
    std::string node_id;
    std::string reason;
  };
  std::optional<Expiry> Expired(TimePoint now, Duration admit_timeout) const;
  std::optional<TimePoint> deadline() const;

 private:
  struct Held {
    PendingJoin join;
    TimePoint deadline;
    bool cancelled = false;
  };
  std::optional<Held> held_;
};

}  // namespace dlrun::rdzv

// In-process recovery across nodes, the job's side (proto `service Regroup`; docs/RECOVERY.md,
// "Across nodes"). A node that lost ranks of a program that recovers in process asks for the
// round's next generation; the node of global rank 0 posts the new group's port; every member
// holds a Watch open and hears both at once, so the survivors on other nodes learn of a loss
// within a network round trip instead of a heartbeat interval. Membership (Handler) says who is
// in the job and which round runs; a new round ends its regroups. Thread-safe.
#pragma once

#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "dlrun/proto/rendezvous.pb.h"
#include "rendezvous/handler.h"

namespace dlrun::rdzv {

class RegroupHandler {
 public:
  // `membership` authenticates callers and names the running round; it outlives this.
  explicit RegroupHandler(Handler& membership);

  // An ask for the round's next generation (lost_ranks set) or the port's post (lost_ranks
  // empty, master_port set). Refused with ABORTED when another regroup is under way or came
  // first, with FAILED_PRECONDITION when the request's round is over; `resp` is the regroup as
  // it stands after the call.
  absl::Status Ask(const v1::RegroupRequest& req, const std::string& peer,
                   v1::RegroupNotice* resp);

  // `done` runs exactly once: when the round's regroup differs from the caller's (generation,
  // port), the round is over, or timeout_ms passed (Tick); at once for a refused request;
  // never once CancelWatch(ticket) returned true.
  using WatchDone = std::function<void(const absl::Status&, const v1::RegroupNotice&)>;
  void Watch(const v1::WatchRegroupRequest& req, const std::string& peer, uint64_t ticket,
             WatchDone done);
  // The caller of a held watch went away, or the server shuts down: forget it. Returns whether
  // it was still held (then the caller finishes the call itself).
  bool CancelWatch(uint64_t ticket);

  // Answers the watches that are due; returns the next timeout.
  std::optional<TimePoint> Tick();

  // A node was lost and the round goes on without it, or a node was admitted (Handler's
  // resize listener, set by the constructor): the round's next generation, with the members'
  // places; its port comes from the node that now holds global rank 0, as after an ask. Once
  // an admission's port is posted, Handler::Admitted answers the admitted node's join.
  void OnResize(const Resize& resize);
  // How many watches are held now (tests wait on it).
  int HeldWatches();

 private:
  struct Watcher {
    uint64_t ticket = 0;
    std::string node_id;
    uint64_t round = 0;
    uint32_t generation = 0, master_port = 0;
    TimePoint deadline;
    WatchDone done;
  };
  using Answers = std::vector<std::pair<WatchDone, v1::RegroupNotice>>;
  // The regroup of `round` (a fresh one when the round changed). Needs mu_.
  v1::RegroupNotice& Current(uint64_t round);
  absl::Status Apply(const v1::RegroupRequest& req, uint64_t round);
  // The watches due at `now` in `round`, removed. Needs mu_.
  Answers Due(TimePoint now, uint64_t round);

  Handler& membership_;
  std::mutex mu_;
  v1::RegroupNotice current_;      // guarded by mu_
  // Guarded by mu_: the generation of current_ that admits a node (0: none); its port's post
  // answers the node's join.
  uint32_t admitting_generation_ = 0;
  std::vector<Watcher> watchers_;  // guarded by mu_
};

}  // namespace dlrun::rdzv

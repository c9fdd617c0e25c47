#include "rendezvous/regroup.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "proto/field_checks.h"

namespace dlrun::rdzv {
namespace {

using proto::CheckString;

constexpr uint32_t kMaxGeneration = 1000000;
constexpr int kMaxLostRanks = 4096;
constexpr uint32_t kMaxRank = 1000000;

absl::Status CheckRequest(const v1::RegroupRequest& req) {
  if (auto s = CheckString("node_id", req.node_id(), 256, true); !s.ok()) return s;
  if (auto s = CheckString("reason", req.reason(), 1024, false); !s.ok()) return s;
  if (req.generation() == 0 || req.generation() > kMaxGeneration) {
    return absl::InvalidArgumentError(absl::StrCat("generation ", req.generation(),
                                                   ": expected 1 to ", kMaxGeneration));
  }
  if (req.master_port() > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("master_port ", req.master_port(), ": expected 0 to 65535"));
  }
  if (req.lost_ranks_size() > kMaxLostRanks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lost_ranks has ", req.lost_ranks_size(), " ranks: expected at most ", kMaxLostRanks));
  }
  for (uint32_t r : req.lost_ranks()) {
    if (r > kMaxRank) {
      return absl::InvalidArgumentError(absl::StrCat("lost_ranks holds ", r, ": not a rank"));
    }
  }
  if (req.lost_ranks().empty() && req.master_port() == 0) {
    return absl::InvalidArgumentError(
        "neither lost_ranks nor master_port is set: expected an ask (lost_ranks) or a port");
  }
  return absl::OkStatus();
}

}  // namespace

RegroupHandler::RegroupHandler(Handler& membership) : membership_(membership) {
  membership_.SetResizeListener([this](const Resize& s) { OnResize(s); });
}

void RegroupHandler::OnResize(const Resize& resize) {
  Answers answers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    v1::RegroupNotice& cur = Current(resize.round);
    // A regroup under way (its port not posted yet) is overtaken: the new generation covers it.
    cur.set_generation(cur.generation() + 1);
    cur.set_master_port(0);
    cur.clear_lost_ranks();
    cur.set_reason(resize.reason);
    cur.set_asked_by("the rendezvous host");
    cur.clear_places();
    for (const NodePlace& p : resize.places) {
      v1::NodePlace* out = cur.add_places();
      out->set_node_id(p.node_id);
      out->set_node_rank(static_cast<uint32_t>(p.node_rank));
      out->set_rank_offset(static_cast<uint32_t>(p.rank_offset));
    }
    cur.set_world_size(static_cast<uint32_t>(resize.world_size));
    cur.set_master_addr(resize.master_addr);
    admitting_generation_ = resize.admitted.empty() ? 0 : cur.generation();
    answers = Due(membership_.Now(), membership_.round());
  }
  for (auto& [done, notice] : answers) done(absl::OkStatus(), notice);
}

v1::RegroupNotice& RegroupHandler::Current(uint64_t round) {
  if (current_.round() != round) {
    current_.Clear();
    current_.set_round(round);
    admitting_generation_ = 0;
  }
  return current_;
}

absl::Status RegroupHandler::Apply(const v1::RegroupRequest& req, uint64_t round) {
  v1::RegroupNotice& cur = Current(round);
  const uint32_t g = req.generation();
  if (!req.lost_ranks().empty()) {  // an ask
    if (cur.generation() > 0 && cur.master_port() == 0) {
      return absl::AbortedError(absl::StrCat("the regroup to generation ", cur.generation(),
                                             " (asked by ", cur.asked_by(),
                                             ") is under way: restart instead"));
    }
    if (g != cur.generation() + 1) {
      return absl::AbortedError(absl::StrCat("generation ", g, " asked, but the round is at ",
                                             cur.generation(), ": restart instead"));
    }
    cur.set_generation(g);
    cur.set_master_port(req.master_port());
    *cur.mutable_lost_ranks() = req.lost_ranks();
    cur.clear_places();  // the same nodes, ranks and size
    cur.set_world_size(0);
    cur.clear_master_addr();
    cur.set_reason(req.reason());
    cur.set_asked_by(req.node_id());
    return absl::OkStatus();
  }
  if (g == cur.generation() && cur.master_port() == req.master_port()) return absl::OkStatus();
  if (g != cur.generation() || cur.master_port() != 0) {
    return absl::AbortedError(absl::StrCat("port for generation ", g, " posted, but the round is ",
                                           "at generation ", cur.generation(), " with port ",
                                           cur.master_port()));
  }
  cur.set_master_port(req.master_port());
  return absl::OkStatus();
}

absl::Status RegroupHandler::Ask(const v1::RegroupRequest& req, const std::string& peer,
                                 v1::RegroupNotice* resp) {
  if (absl::Status s = membership_.Authorize(req.auth(), peer); !s.ok()) return s;
  if (absl::Status s = CheckRequest(req); !s.ok()) return membership_.Refuse(s, peer);
  const uint64_t round = membership_.round();
  if (req.round() != round) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", req.round(), " is over: the job is in round ", round));
  }
  Answers answers;
  absl::Status s;
  uint32_t admitted = 0;  // the generation whose port this post brought, admitting a node
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = Apply(req, round);
    *resp = current_;
    answers = Due(membership_.Now(), round);
    if (s.ok() && admitting_generation_ != 0 && current_.generation() == admitting_generation_ &&
        current_.master_port() != 0) {
      admitted = admitting_generation_;
      admitting_generation_ = 0;
    }
  }
  if (admitted != 0) {
    membership_.Admitted(round, static_cast<int>(admitted), static_cast<int>(resp->master_port()));
  }
  for (auto& [done, notice] : answers) done(absl::OkStatus(), notice);
  return s;
}

void RegroupHandler::Watch(const v1::WatchRegroupRequest& req, const std::string& peer,
                           uint64_t ticket, WatchDone done) {
  if (absl::Status s = membership_.Authorize(req.auth(), peer); !s.ok()) return done(s, {});
  if (auto s = CheckString("node_id", req.node_id(), 256, true); !s.ok()) {
    return done(membership_.Refuse(s, peer), {});
  }
  if (req.timeout_ms() == 0 || req.timeout_ms() > 600000) {
    return done(membership_.Refuse(absl::InvalidArgumentError(absl::StrCat(
                                       "timeout_ms ", req.timeout_ms(), ": expected 1 to 600000")),
                                   peer),
                {});
  }
  membership_.Heard(req.node_id());
  const uint64_t round = membership_.round();
  Answers answers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    watchers_.push_back({ticket, req.node_id(), req.round(), req.generation(), req.master_port(),
                         membership_.Now() + std::chrono::milliseconds(req.timeout_ms()),
                         std::move(done)});
    answers = Due(membership_.Now(), round);
  }
  for (auto& [d, notice] : answers) d(absl::OkStatus(), notice);
}

int RegroupHandler::HeldWatches() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(watchers_.size());
}

bool RegroupHandler::CancelWatch(uint64_t ticket) {
  std::string node_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(watchers_.begin(), watchers_.end(),
                           [&](const Watcher& w) { return w.ticket == ticket; });
    if (it == watchers_.end()) return false;
    node_id = std::move(it->node_id);
    watchers_.erase(it);
  }
  // Its caller went away: the agent's process, most likely, and with it the node's workers.
  membership_.WatchEnded(node_id);
  return true;
}

std::optional<TimePoint> RegroupHandler::Tick() {
  const uint64_t round = membership_.round();
  std::optional<TimePoint> next;
  Answers answers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    answers = Due(membership_.Now(), round);
    for (const Watcher& w : watchers_) {
      if (!next || w.deadline < *next) next = w.deadline;
    }
  }
  for (auto& [done, notice] : answers) done(absl::OkStatus(), notice);
  return next;
}

RegroupHandler::Answers RegroupHandler::Due(TimePoint now, uint64_t round) {
  const v1::RegroupNotice& cur = Current(round);
  Answers out;
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    const bool due = it->round != round || it->generation != cur.generation() ||
                     it->master_port != cur.master_port() || now >= it->deadline;
    if (!due) {
      ++it;
      continue;
    }
    out.emplace_back(std::move(it->done), cur);
    it = watchers_.erase(it);
  }
  return out;
}

}  // namespace dlrun::rdzv

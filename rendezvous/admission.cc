// A node being admitted into the running round (admission.h).
#include "rendezvous/admission.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace dlrun::rdzv {

void Admission::Begin(PendingJoin p, TimePoint deadline) {
  held_ = Held{std::move(p), deadline, false};
}

std::optional<PendingJoin> Admission::Answer() {
  if (!held_ || held_->cancelled) return std::nullopt;
  PendingJoin p = std::move(held_->join);
  held_.reset();
  return p;
}

bool Admission::Cancel(const std::string& node_id, uint64_t ticket) {
  if (!held_ || held_->cancelled || held_->join.ticket != ticket ||
      held_->join.node.node_id != node_id) {
    return false;
  }
  held_->cancelled = true;  // the survivors wait for it in vain: a new round (Tick)
  held_->join.cb = nullptr;
  held_->deadline = TimePoint::min();
  return true;
}

std::optional<PendingJoin> Admission::Release() {
  std::optional<PendingJoin> p;
  if (held_ && !held_->cancelled) p = std::move(held_->join);
  held_.reset();
  return p;
}

std::optional<Admission::Expiry> Admission::Expired(TimePoint now, Duration admit_timeout) const {
  if (!held_ || now < held_->deadline) return std::nullopt;
  const std::string& host = held_->join.node.hostname;
  Expiry e{held_->join.node.node_id,
           held_->cancelled
               ? absl::StrCat("node ", host, " went away while it was being admitted")
               : absl::StrCat("node ", host, " was not admitted into the running round within ",
                              admit_timeout.count(), " ms (the new group's port never came)")};
  return e;
}

std::optional<TimePoint> Admission::deadline() const {
  if (!held_) return std::nullopt;
  return held_->deadline;
}

}  // namespace dlrun::rdzv

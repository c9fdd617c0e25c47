#include "transfer_plan.h"

#include <optional>
#include <stdexcept>

#include "worker/src/text.h"

namespace dlrun::worker::detail {

TransferPlan DecideTransfer(const std::vector<TransferRow>& rows, const TransferModel& model) {
  TransferPlan plan;
  std::vector<int> drew;
  std::optional<bool> broadcast;
  for (int r = 0; r < static_cast<int>(rows.size()); ++r) {
    const TransferRow& row = rows[static_cast<size_t>(r)];
    if (row.drew_own_rng) drew.push_back(r);
    if (row.broadcasts >= 0) broadcast = row.broadcasts != 0;
    if (row.step > plan.best) plan.best = row.step, plan.root = r;
  }
  if (plan.best < 0) throw std::runtime_error("recovery: no rank holds a state to send");
  const TransferRow& root = rows[static_cast<size_t>(plan.root)];
  plan.updates = root.updates;
  plan.own_buffers = broadcast == false;
  std::vector<int> counts;
  for (int r = 0; r < static_cast<int>(rows.size()); ++r) {
    const TransferRow& row = rows[static_cast<size_t>(r)];
    if (row.step < plan.best) plan.behind.push_back(r);
    if (row.step == plan.best && row.updates != root.updates) counts.push_back(r);
  }
  if (!counts.empty()) {
    throw std::runtime_error(lite::StrCat(
        "refused: rank(s) ", lite::StrJoin(counts, ","), " applied another number of optimizer "
        "updates by step ", plan.best, " than rank ", plan.root, " (", root.updates,
        "): an update outside run(), or one applied twice"));
  }
  // The sender's table of every rank's generator gives a rank behind its own.
  if (!plan.behind.empty() && !drew.empty() && !root.holds_rng_table) {
    throw std::runtime_error(lite::StrCat(
        "refused: the CPU random generator differs across ranks (seeded per rank?) and rank(s) ",
        lite::StrJoin(drew, ","), " drew from it in their steps: rank(s) ",
        lite::StrJoin(plan.behind, ","), " cannot be given the lost one's "
        "(RecoveryOptions::seed_per_rank derives each rank's from the step)"));
  }
  if (!plan.behind.empty() && !model.parameter_outside.empty()) {
    throw std::runtime_error(lite::StrCat(
        "refused: parameter '", model.parameter_outside, "' is in none of the recovery's "
        "optimizers (updated by another optimizer? give them all: RecoveryHooks::optimizers, or "
        "Recoverable's list): its optimizer's state cannot be sent"));
  }
  if (!model.first_buffer.empty() && plan.best > 0 && rows.front().step < 0) {
    throw std::runtime_error(lite::StrCat(
        "refused: rank 0 was lost, and with it the module's buffers as of step ", plan.best,
        " ('", model.first_buffer, "'...: ",
        plan.own_buffers ? "its own running statistics, DDP's broadcast_buffers off"
                         : "running statistics, which DDP broadcasts from rank 0 at each forward",
        "): no other rank holds them"));
  }
  return plan;
}

}  // namespace dlrun::worker::detail

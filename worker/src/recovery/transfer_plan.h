// The state transfer's decision (recovery.cc): from every rank's row of one allgather, who sends
// (the lowest rank holding the newest whole step), who takes the state, and the refusals of what
// the transfer cannot make exact. Pure: no collective, no LibTorch (tests/worker
// transfer_plan_test.cc is its table). Internal to the worker library.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dlrun::worker::detail {

// One rank's row of the transfer's allgather.
struct TransferRow {
  int64_t step = -1;            // its last whole step (-1: none yet, as a replacement's)
  bool drew_own_rng = false;    // its steps drew from a CPU generator seeded per rank
  int broadcasts = -1;          // its DDP wrapper broadcasts buffers: 1, 0; -1: no wrapper yet
  int64_t updates = 0;          // its optimizer updates (Recovery::update()) by that step
  bool holds_rng_table = false; // it holds every rank's generator (seed_per_rank)
};

// What of the model the refusals name.
struct TransferModel {
  std::string first_buffer;       // the model's first buffer ("" when it has none)
  std::string parameter_outside;  // a parameter in none of the recovery's optimizers ("": none)
};

struct TransferPlan {
  int64_t best = -1;         // the highest committed step
  int root = -1;             // the lowest rank holding it: the sender
  std::vector<int> behind;   // the ranks that take the state
  int64_t updates = 0;       // the sender's optimizer updates by then
  bool own_buffers = false;  // DDP does not broadcast buffers: a rank behind loses its own
};

// The plan for `rows` (rank r's at index r); throws std::runtime_error("refused: ...", or
// "recovery: no rank holds a state to send") for what it cannot make exact.
TransferPlan DecideTransfer(const std::vector<TransferRow>& rows, const TransferModel& model);

}  // namespace dlrun::worker::detail

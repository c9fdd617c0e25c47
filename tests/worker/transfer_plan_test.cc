// The state transfer's decision (worker/src/recovery/transfer_plan.h), row by row: the ranks'
// rows of the allgather, what of the model the refusals name, and the plan or the refusal.
#include "recovery/transfer_plan.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dlrun::worker::detail {
namespace {

struct Row {
  const char* what;
  std::vector<TransferRow> rows;
  TransferModel model;
  // The plan (when no refusal): the sender, the ranks behind, the step and its updates.
  int root;
  std::vector<int> behind;
  int64_t best;
  int64_t updates;
  // Else the start of the refusal's text.
  std::string refused;
};

TransferRow At(int64_t step, int64_t updates = 0) {
  TransferRow r;
  r.step = step;
  r.updates = updates;
  r.broadcasts = step >= 0 ? 1 : -1;
  return r;
}

TransferRow Drew(TransferRow r, bool table = false) {
  r.drew_own_rng = true;
  r.holds_rng_table = table;
  return r;
}

TransferRow OwnBuffers(TransferRow r) {
  r.broadcasts = 0;
  return r;
}

TEST(TransferPlan, EachRowGivesThePlanOrTheRefusal) {
  const TransferModel plain, bn{"bn.running_mean", ""}, outside{"", "head.weight"};
  const std::vector<Row> table = {
      {"a replacement behind two survivors", {At(5, 6), At(5, 6), At(-1)}, plain, 0, {2}, 5, 6,
       ""},
      {"the lowest rank of the newest step sends", {At(4, 5), At(5, 6), At(5, 6)}, plain, 1, {0},
       5, 6, ""},
      {"nobody behind (told between steps)", {At(3, 3), At(3, 3)}, plain, 0, {}, 3, 3, ""},
      {"no rank holds a step", {At(-1), At(-1)}, plain, -1, {}, -1, 0,
       "recovery: no rank holds a state to send"},
      {"another number of updates at the same step", {At(5, 6), At(5, 7), At(-1)}, plain, -1, {},
       -1, 0, "refused: rank(s) 1 applied another number of optimizer updates by step 5"},
      {"generators seeded per rank, drawn, no table", {Drew(At(5)), Drew(At(5)), At(-1)}, plain,
       -1, {}, -1, 0, "refused: the CPU random generator differs across ranks"},
      {"generators seeded per rank, the sender holds every rank's",
       {Drew(At(5), true), Drew(At(5), true), At(-1)}, plain, 0, {2}, 5, 0, ""},
      {"generators seeded per rank, nobody behind", {Drew(At(5)), Drew(At(5))}, plain, 0, {}, 5,
       0, ""},
      {"a parameter no optimizer holds, a rank behind", {At(5), At(-1)}, outside, -1, {}, -1, 0,
       "refused: parameter 'head.weight' is in none of the recovery's optimizers"},
      {"a parameter no optimizer holds, nobody behind", {At(5), At(5)}, outside, 0, {}, 5, 0, ""},
      {"rank 0 lost with the buffers DDP broadcasts", {At(-1), At(5), At(5)}, bn, -1, {}, -1, 0,
       "refused: rank 0 was lost, and with it the module's buffers as of step 5 "
       "('bn.running_mean'...: running statistics, which DDP broadcasts"},
      {"rank 0 lost with its own buffers", {At(-1), OwnBuffers(At(5)), OwnBuffers(At(5))}, bn,
       -1, {}, -1, 0, "refused: rank 0 was lost, and with it the module's buffers as of step 5 "
       "('bn.running_mean'...: its own running statistics"},
      {"rank 0 lost in the first step: nothing to lose yet", {At(-1), At(0), At(0)}, bn, 1, {0},
       0, 0, ""},
      {"rank 2 lost with buffers", {At(5), At(5), At(-1)}, bn, 0, {2}, 5, 0, ""},
  };
  for (const Row& row : table) {
    SCOPED_TRACE(row.what);
    if (!row.refused.empty()) {
      try {
        DecideTransfer(row.rows, row.model);
        ADD_FAILURE() << "no refusal";
      } catch (const std::runtime_error& e) {
        EXPECT_EQ(std::string(e.what()).substr(0, row.refused.size()), row.refused) << e.what();
      }
      continue;
    }
    const TransferPlan plan = DecideTransfer(row.rows, row.model);
    EXPECT_EQ(plan.root, row.root);
    EXPECT_EQ(plan.behind, row.behind);
    EXPECT_EQ(plan.best, row.best);
    EXPECT_EQ(plan.updates, row.updates);
  }
}

TEST(TransferPlan, OwnBuffersAreSaidWhenNoWrapperBroadcasts) {
  EXPECT_TRUE(DecideTransfer({OwnBuffers(At(5)), At(-1)}, {}).own_buffers);
  EXPECT_FALSE(DecideTransfer({At(5), At(-1)}, {}).own_buffers);
}

}  // namespace
}  // namespace dlrun::worker::detail

// The C++ library's NCCL side of in-process recovery, as far as it runs without a GPU: the order
// of the agent's word, the communicators' abort and the main thread's regroup; the group's own
// error; the rule that a step whose sums may miss the lost peer is never applied; PyTorch's NCCL
// teardown turned off under dlrun. The NCCL group itself is a stand-in backend here (a
// c10d::Backend that records its abort and reports the error it is given); scripts/gpu-check
// runs the real one (issue 59).
#include <torch/torch.h>

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "recovery/agent_word.h"
#include "dlrun/recovery.h"
#include "dlrun/worker.h"
#include "group.h"
#include "gtest/gtest.h"

namespace dlrun::worker {
namespace {

class FakeBackend : public c10d::Backend {
 public:
  FakeBackend() : c10d::Backend(0, 1) {}
  c10d::ErrorType getError() override { return error; }
  void abort() override {
    ++aborts;
    if (throw_on_abort) throw std::runtime_error("abort failed\nsecond line");
  }
  const std::string getBackendName() const override { return "fake"; }
  c10d::ErrorType error = c10d::ErrorType::SUCCESS;
  int aborts = 0;
  bool throw_on_abort = false;
};

c10::intrusive_ptr<c10d::ProcessGroup> GroupOf(const c10::intrusive_ptr<FakeBackend>& b) {
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(0, 1);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, b);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return pg;
}

TEST(NcclRecovery, AStepsUpdateIsAppliedOnlyWhenItsSumsAreWhole) {
  // Gloo: the library's waits already ended in PeerLost; whatever came after, the sums were whole.
  EXPECT_TRUE(detail::SettledStepMayApply(false, true, true));
  // NCCL: the sums ran behind the CPU; the word or the group's error means one may miss the peer.
  EXPECT_TRUE(detail::SettledStepMayApply(true, false, false));
  EXPECT_FALSE(detail::SettledStepMayApply(true, true, false));
  EXPECT_FALSE(detail::SettledStepMayApply(true, false, true));
  EXPECT_FALSE(detail::SettledStepMayApply(true, true, true));
}

TEST(NcclRecovery, TheGroupsOwnErrorIsSeenAndItsAbortReachesTheBackend) {
  auto b = c10::make_intrusive<FakeBackend>();
  auto pg = GroupOf(b);
  EXPECT_FALSE(detail::GroupFailed(*pg));
  b->error = c10d::ErrorType::REMOTE_ERROR;
  EXPECT_TRUE(detail::GroupFailed(*pg));
  detail::AbortGroup(*pg);
  EXPECT_EQ(b->aborts, 1);
  // A failing abort is a line on stderr, not an exception on the words' thread.
  b->throw_on_abort = true;
  ::testing::internal::CaptureStderr();
  EXPECT_NO_THROW(detail::AbortGroup(*pg));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "dlrun::worker: aborting the NCCL group: abort failed\n");
}

TEST(NcclRecovery, TheWordIsMarkedThenTheHookAbortsThenTheMainThreadHearsOfIt) {
  bool announced_in_hook = false, heard_in_hook = true;
  int calls = 0;
  detail::SetPeerLossHook([&] {
    ++calls;
    announced_in_hook = detail::PeerLossAnnounced();
    heard_in_hook = detail::AwaitRegroup(std::chrono::milliseconds(0)).has_value();
  });
  const int next = detail::CurrentGeneration() + 1;
  detail::AnnounceForTesting({next, 23456});
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(announced_in_hook) << "collectives must be given up before the abort ends them";
  EXPECT_FALSE(heard_in_hook) << "the main thread must not regroup before the old group is aborted";
  const auto word = detail::AwaitRegroup(std::chrono::milliseconds(0));
  ASSERT_TRUE(word.has_value());
  EXPECT_EQ(word->master_port, 23456);
  detail::AnnounceForTesting({next, 23456});  // a repeated word: no second abort
  EXPECT_EQ(calls, 1);
  detail::SetPeerLossHook({});
  detail::AnnounceForTesting({next + 1, 23457});
  EXPECT_EQ(calls, 1);
  detail::EnterGeneration(next + 1);
}

TEST(NcclRecovery, PyTorchsNcclTeardownIsOffUnderDlrunOverItsDefaultNeverOverTheUsers) {
  unsetenv("DLRUN_CONTROL_FD");
  setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", 1);
  detail::TurnOffNcclTeardownForRecovery();
  EXPECT_STREQ(std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1") << "outside dlrun";
  setenv("DLRUN_CONTROL_FD", "9", 1);
  setenv("DLRUN_NCCL_ERROR_HANDLING_DEFAULT", "1", 1);
  setenv("NCCL_ASYNC_ERROR_HANDLING", "1", 1);
  detail::TurnOffNcclTeardownForRecovery();
  EXPECT_STREQ(std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "0");
  EXPECT_STREQ(std::getenv("NCCL_ASYNC_ERROR_HANDLING"), "0");
  unsetenv("DLRUN_NCCL_ERROR_HANDLING_DEFAULT");
  setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3", 1);  // the user's own
  detail::TurnOffNcclTeardownForRecovery();
  EXPECT_STREQ(std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "3");
  unsetenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  detail::TurnOffNcclTeardownForRecovery();
  EXPECT_STREQ(std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "0") << "unset: turned off";
  unsetenv("DLRUN_CONTROL_FD");
}

// A Recovery over a context whose group is the stand-in ("nccl", or "gloo"), under an agent link
// whose control pipe this test writes: with NCCL the word aborts the group on the reader thread,
// and a step whose update comes after the word is given up with its update not applied.
struct RecoveryStep : ::testing::Test {
  void SetUp() override {
    ASSERT_EQ(pipe(fds), 0);
    setenv("DLRUN_CONTROL_FD", std::to_string(fds[0]).c_str(), 1);
    backend = c10::make_intrusive<FakeBackend>();
    ctx.backend = "nccl";
    ctx.env.rank = 0;
    ctx.env.world_size = 1;
    ctx.env.master_addr = "127.0.0.1";
    ctx.pg = GroupOf(backend);
    torch::manual_seed(1);
  }
  void TearDown() override { unsetenv("DLRUN_CONTROL_FD"); }
  // The agent's word, then the wait until the reader thread has handled it.
  void Word() {
    const std::string w = "regroup " + std::to_string(detail::CurrentGeneration() + 1) + " 1\n";
    ASSERT_EQ(write(fds[1], w.data(), w.size()), static_cast<ssize_t>(w.size()));
    ASSERT_TRUE(detail::AwaitRegroup(std::chrono::seconds(10)).has_value());
  }
  int fds[2] = {-1, -1};
  c10::intrusive_ptr<FakeBackend> backend;
  Context ctx;
  torch::nn::Linear model{4, 2};
  torch::optim::SGD opt{model->parameters(), torch::optim::SGDOptions(0.1)};
};

TEST_F(RecoveryStep, AWordDuringTheStepAbortsTheGroupAndItsUpdateIsNotApplied) {
  Recovery rec(ctx, *model, opt);
  ASSERT_TRUE(rec.enabled());
  const torch::Tensor before = model->weight.detach().clone();
  std::string error;
  try {
    rec.run([&] {
      model->forward(torch::ones({3, 4})).sum().backward();
      Word();  // the peer is lost while the step's sums run
      EXPECT_EQ(backend->aborts, 1) << "the word aborts the current group's communicators";
      rec.update();  // waits for the sums: they may miss the peer
      ADD_FAILURE() << "update() applied a step whose sums may miss the lost peer";
    });
  } catch (const std::exception& e) {
    error = e.what();  // the regroup itself needs a GPU: here it fails after the give-up
  }
  EXPECT_NE(error.find("in-process recovery failed (generation"), std::string::npos) << error;
  EXPECT_TRUE(torch::equal(model->weight, before)) << "the update must not have been applied";
}

TEST_F(RecoveryStep, AnUpdateOfTheTrainersOwnBeforeAWordRefusesTheRecoveryLoudly) {
  Recovery rec(ctx, *model, opt);
  std::string error;
  try {
    rec.run([&] {
      model->forward(torch::ones({3, 4})).sum().backward();
      Word();
      opt.step();     // no update(), no await_collectives(): applied, perhaps with partial sums
      rec.commit(1);  // finds the word: the step is given up, but its update cannot be
    });
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("refused: the parameters changed in step 1"), std::string::npos) << error;
}

TEST_F(RecoveryStep, OnGlooTheUpdateIsAppliedAsBeforeAndNoGroupIsAborted) {
  ctx.backend = "gloo";
  Recovery rec(ctx, *model, opt);
  const torch::Tensor before = model->weight.detach().clone();
  const auto r = rec.run([&] {
    model->forward(torch::ones({3, 4})).sum().backward();
    rec.await_collectives();  // nothing to wait for: Gloo's sums ended in the library's waits
    rec.update();
    rec.commit(1);
  });
  EXPECT_FALSE(r.recovered);
  EXPECT_FALSE(torch::equal(model->weight, before));
  EXPECT_EQ(rec.committed(), 1);
  Word();  // no hook was set: nothing is aborted
  EXPECT_EQ(backend->aborts, 0);
}

// LibTorch's SGD updates through Tensor::data(), which leaves the parameters' version counters as
// they were: the step's change is seen by comparing them with a copy. A logging collective after
// opt.step() meets the lost peer; the step cannot be given up (its update went outside
// update()), so the recovery is refused loudly, not done with the update applied and the step
// counted as not done (a silent second update at the step's replay).
TEST_F(RecoveryStep, AnSgdUpdateOutsideUpdateBeforeALostPeerRefusesTheRecovery) {
  ctx.backend = "gloo";
  Recovery rec(ctx, *model, opt);
  std::string error;
  try {
    const auto r = rec.run([&] {
      model->forward(torch::ones({3, 4})).sum().backward();
      opt.step();
      Word();
      interruption_point();  // the logging all-reduce after the update: PeerLost
      rec.commit(1);
    });
    error = r.recovered ? "recovered" : "not recovered";
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("refused: the parameters changed in step 1"), std::string::npos) << error;
}

}  // namespace
}  // namespace dlrun::worker

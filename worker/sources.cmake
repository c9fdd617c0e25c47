# The worker library's sources, relative to the project root. worker/CMakeLists.txt and
# common/CMakeLists.txt build them; the wheel installs them and its CMake package
# (cmake/dlrunSourceConfig.cmake.in) builds the same list against a user's own LibTorch.
set(DLRUN_COMMON_SOURCES common/env.cc common/local_address.cc common/cpus.cc common/files.cc)
# LibTorch-free: environment parsing, agent link, crash traces, shared-memory allreduce, NVTX
# ranges, the agent's words and the state transfer's plan (in-process recovery).
set(DLRUN_DIST_ENV_SOURCES worker/src/dist_env.cc worker/src/agent_link.cc worker/src/crash_handler.cc
  worker/src/shm_allreduce.cc worker/src/nvtx_ranges.cc worker/src/recovery/agent_word.cc
  worker/src/recovery/transfer_plan.cc)
# LibTorch: process groups, DDP, LR schedule, checkpoints, SyncBatchNorm, the sampler (its
# shuffle is torch.randperm, as PyTorch's DistributedSampler).
set(DLRUN_WORKER_SOURCES worker/src/init.cc worker/src/ddp.cc worker/src/ddp_impl.cc
  worker/src/shm_reducer.cc worker/src/lr_schedule.cc
  worker/src/checkpoint.cc worker/src/checkpoint_file.cc worker/src/sync_batch_norm.cc worker/src/sampler.cc worker/src/recovery/recovery.cc worker/src/recovery/state_transfer.cc worker/src/recovery/step_state.cc
  worker/src/recovery/peer_loss.cc)

// The contract between the dlrun agent, its workers and the job scripts: every environment
// variable and file they exchange, named once. LibTorch-free and header-only; the launcher, the
// rendezvous and the worker library include it, and no other non-test source spells these
// names (tests/launcher/contract_test.cc checks that).
//
// The worker's side of the contract is read by dlrun::worker::parse_dist_env (dlrun/dist_env.h);
// the agent's side is written by dlrun::launcher::BuildWorkerEnv (launcher/workers/worker_env.h).
#pragma once

namespace dlrun::contract {

// --- torchrun's worker environment (what any torch.distributed program reads) ---------------
inline constexpr char kRank[] = "RANK";
inline constexpr char kLocalRank[] = "LOCAL_RANK";
inline constexpr char kGroupRank[] = "GROUP_RANK";  // the node rank
inline constexpr char kRoleRank[] = "ROLE_RANK";
inline constexpr char kRoleName[] = "ROLE_NAME";
inline constexpr char kWorldSize[] = "WORLD_SIZE";
inline constexpr char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";
inline constexpr char kGroupWorldSize[] = "GROUP_WORLD_SIZE";
inline constexpr char kRoleWorldSize[] = "ROLE_WORLD_SIZE";
inline constexpr char kMasterAddr[] = "MASTER_ADDR";
inline constexpr char kMasterPort[] = "MASTER_PORT";
inline constexpr char kRestartCount[] = "TORCHELASTIC_RESTART_COUNT";
inline constexpr char kMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";
inline constexpr char kRunId[] = "TORCHELASTIC_RUN_ID";
inline constexpr char kUseAgentStore[] = "TORCHELASTIC_USE_AGENT_STORE";
// torchrun 2.x: the --signals-to-handle list, as given (default SIGTERM,SIGINT,SIGHUP,SIGQUIT).
inline constexpr char kSignalsToHandle[] = "TORCHELASTIC_SIGNALS_TO_HANDLE";
// JSON written by a failing worker ({"message": {"message": ..., "extraInfo": {"timestamp"}}}),
// read by the agent to name the root cause. Path: RUN_DIR/attempt_K/LOCAL_RANK/error.json.
inline constexpr char kErrorFile[] = "TORCHELASTIC_ERROR_FILE";
inline constexpr char kErrorFileName[] = "error.json";
inline constexpr char kOmpNumThreads[] = "OMP_NUM_THREADS";
inline constexpr char kNcclAsyncErrorHandling[] = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
inline constexpr char kNcclAsyncErrorHandlingOld[] = "NCCL_ASYNC_ERROR_HANDLING";
inline constexpr char kCudaVisibleDevices[] = "CUDA_VISIBLE_DEVICES";
inline constexpr char kPythonExec[] = "PYTHON_EXEC";            // torchrun: the interpreter
inline constexpr char kPythonUnbuffered[] = "PYTHONUNBUFFERED";  // set for Python workers
// dlrun appends the directory of its Python helper (dlrun_report.py) to the workers' search
// path: after the user's entries, so a copy of their own wins.
inline constexpr char kPythonPath[] = "PYTHONPATH";

// --- dlrun's additions, agent -> worker -------------------------------------------------------
// A pipe's write end, inherited by the worker: any byte written is a heartbeat (the agent's
// --hang-timeout clock restarts). Non-blocking; a full pipe never blocks the worker.
inline constexpr char kHeartbeatFd[] = "DLRUN_HEARTBEAT_FD";
// A warm spare (docs/RECOVERY.md): the read end of a pipe on which the agent writes the worker's
// whole environment (NUL-separated KEY=VALUE entries, then end of file) when it promotes the
// spare to a worker. End of file with nothing written: the spare is not needed, exit 0.
inline constexpr char kSpareFd[] = "DLRUN_SPARE_FD";
// The node's fork server of a Python program (launcher/workers/fork_server.h): its end of the
// agent's socket (SOCK_SEQPACKET), on which it says "ready" once it has imported torch, then
// takes one request per process to fork (the fds it passes, as SCM_RIGHTS) and answers its pid.
inline constexpr char kForkServerFd[] = "DLRUN_FORK_SERVER_FD";
// In-process recovery (docs/RECOVERY.md, "A fault costs one step"): the read end of a pipe on
// which the agent writes one line per word to a surviving worker of a program that declared
// in-process recovery (a step record "C recovery" on the heartbeat pipe):
//   regroup <generation> <master_port>\n   a rank was lost; the group's next generation meets
//                                          at MASTER_ADDR:<master_port>, same ranks and size
//   regroup <generation> <master_port> <rank> <world_size> <master_addr>\n
//                                          a node was lost: the same, with this rank's new place
inline constexpr char kControlFd[] = "DLRUN_CONTROL_FD";
inline constexpr char kRegroupWord[] = "regroup";
// Set in the environment of a process that replaces a lost rank in a running group: the
// generation it joins. It takes the model and training state from a survivor instead of a
// checkpoint (dlrun::worker::Recovery::receive, dlrun_report.recoverable).
inline constexpr char kRecoveryGen[] = "DLRUN_RECOVERY_GEN";
// "1" when TORCH_NCCL_ASYNC_ERROR_HANDLING and NCCL_ASYNC_ERROR_HANDLING are dlrun's default (the
// user set neither): dlrun_recovery then turns PyTorch's NCCL teardown off, whose watchdog would
// end a survivor at the lost peer's error before the group is rebuilt.
inline constexpr char kNcclErrorHandlingDefault[] = "DLRUN_NCCL_ERROR_HANDLING_DEFAULT";

// --- set by `dlrun slurm --preemptible` job scripts, read by the worker library ----------------
// "1": after a SIGUSR1 checkpoint, rank 0 runs `scontrol requeue $SLURM_JOB_ID`.
inline constexpr char kRequeueOnSignal[] = "DLRUN_REQUEUE_ON_SIGNAL";

// --- the worker library's own switches (set by users) -------------------------------------------
inline constexpr char kKeepFreedMemory[] = "DLRUN_KEEP_FREED_MEMORY";  // "0": glibc defaults
inline constexpr char kDdpShm[] = "DLRUN_DDP_SHM";                  // "0": Gloo, not shared memory
inline constexpr char kInitTimeout[] = "DLRUN_INIT_TIMEOUT";        // seconds for init()

// --- agent and rendezvous settings (set by users and job scripts, read by dlrun) ---------------
inline constexpr char kRdzvToken[] = "DLRUN_RDZV_TOKEN";  // the job's secret, never a flag
inline constexpr char kRdzvPort[] = "DLRUN_RDZV_PORT";    // pods: the master pod's port
inline constexpr char kRdzvTlsCa[] = "DLRUN_RDZV_TLS_CA";
inline constexpr char kRdzvTlsCert[] = "DLRUN_RDZV_TLS_CERT";
inline constexpr char kRdzvTlsKey[] = "DLRUN_RDZV_TLS_KEY";
inline constexpr char kRdzvTlsServerName[] = "DLRUN_RDZV_TLS_SERVER_NAME";
// Set by the generated Slurm script: an agent whose job succeeded prints
// "dlrun: MARK: the job succeeded" last, and the script exits 0 when its output has it, even
// though srun passes on a lost agent's status (job_templates/dlrun.sbatch).
inline constexpr char kOutcomeMark[] = "DLRUN_OUTCOME_MARK";

// The NVML library dlrun loads for --gpus least-loaded (default libnvidia-ml.so.1); the tests
// point it at a fake (tests/compat/fake_nvml.c).
inline constexpr char kNvmlLibrary[] = "DLRUN_NVML_LIBRARY";

// The stack dump tools of `dlrun stacks` and the capture before kill (docs/STACKS.md), when not
// next to the worker's interpreter (py-spy) or on PATH.
inline constexpr char kPySpy[] = "DLRUN_PY_SPY";
inline constexpr char kEuStack[] = "DLRUN_EU_STACK";

// Per-rank profiling (docs/PROFILING.md): set only in the profiled ranks' environment. The tool
// (nsys, perf, py-spy, torch), the steps to capture ("A:B"; the worker library brackets them with
// cudaProfilerStart/Stop for nsys, and dlrun_report runs torch's profiler over them), and the
// torch trace's path. DLRUN_PERF and DLRUN_NSYS name the tools when they are not on PATH.
inline constexpr char kProfile[] = "DLRUN_PROFILE";
inline constexpr char kProfileSteps[] = "DLRUN_PROFILE_STEPS";
inline constexpr char kProfileFile[] = "DLRUN_PROFILE_FILE";
inline constexpr char kPerfTool[] = "DLRUN_PERF";
inline constexpr char kNsysTool[] = "DLRUN_NSYS";

// PyTorch's Flight Recorder (docs/STACKS.md): dlrun sets these for its workers unless they are
// in its own environment already; the dumps go to LOG_DIR/attempt_K/flight_recorder/rank_R.
inline constexpr char kFrBufferSize[] = "TORCH_FR_BUFFER_SIZE";
inline constexpr char kNcclTraceBufferSize[] = "TORCH_NCCL_TRACE_BUFFER_SIZE";  // before 2.8
inline constexpr char kFrDumpOnTimeout[] = "TORCH_FR_DUMP_ON_TIMEOUT";
inline constexpr char kNcclDumpOnTimeout[] = "TORCH_NCCL_DUMP_ON_TIMEOUT";
inline constexpr char kFrDumpTempFile[] = "TORCH_FR_DUMP_TEMP_FILE";  // a prefix: + the rank
inline constexpr char kNcclDebugInfoTempFile[] = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE";
inline constexpr char kFrDir[] = "flight_recorder";
inline constexpr char kFrFilePrefix[] = "rank_";
// Python's faulthandler: a worker that crashes (SIGSEGV, SIGABRT, ...) prints its Python stack to
// stderr, where the agent finds the faulting frame (docs/STACKS.md, "Crashes"). Set to 1 for
// every worker unless it is in dlrun's environment already.
inline constexpr char kPythonFaultHandler[] = "PYTHONFAULTHANDLER";
// 0: the worker library's init() leaves fatal signals alone (no native crash trace).
inline constexpr char kCrashTrace[] = "DLRUN_CRASH_TRACE";

}  // namespace dlrun::contract

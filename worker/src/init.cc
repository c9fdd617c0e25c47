// The process-group headers expose their backends only with these defined (LibTorch's own build
// and its CMake target define them); Gloo is in every LibTorch, NCCL where it has CUDA.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#if defined(DLRUN_WITH_CUDA) && !defined(USE_C10D_NCCL)
#define USE_C10D_NCCL
#endif
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>
#ifdef DLRUN_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <thread>

#include "common/contract.h"
#include "text.h"
#include "dlrun/agent_link.h"
#include "dlrun/worker.h"
#include "group.h"
#include "fnv1a.h"

namespace dlrun::worker {
namespace {

// Waits until something listens on addr:port (or the deadline passes), trying every 10 ms.
// LibTorch's TCPStore client sleeps a whole second after a refused connection; after a restart
// the other ranks are often ready a few ms before rank 0's store listens, so without this wait
// they lost that second (bench/recovery: "promotion to init() done 1.01 s" instead of 0.02 s).
void AwaitListener(const std::string& addr, int port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    bool refused = false;
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) continue;
      const int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
      const int err = errno;
      close(fd);
      if (rc == 0) {
        freeaddrinfo(res);
        return;
      }
      refused = refused || err == ECONNREFUSED;
    }
    // Anything but "refused" (unreachable, timed out) is left to TCPStore and its error message.
    if (!refused || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  freeaddrinfo(res);
}

// LibTorch 2.x: a ProcessGroup holds one Backend per device type. Collectives on CPU tensors
// go to Gloo; with NCCL, CUDA tensors go to NCCL and CPU tensors (a CPU barrier, a digest's
// allgather) still find Gloo.
c10::intrusive_ptr<c10d::ProcessGroup> MakeProcessGroup(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    c10::intrusive_ptr<c10d::Backend> gloo, c10::intrusive_ptr<c10d::Backend> nccl) {
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  if (nccl) {
    pg->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
    pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
  } else {
    pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  }
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  return pg;
}

// Gloo over its own view of the store (as torch.distributed does), so that its keys cannot
// collide with another backend's.
c10::intrusive_ptr<c10d::Backend> GlooBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                              int rank, int size,
                                              std::shared_ptr<::gloo::transport::Device> device,
                                              std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->timeout = timeout;
  opts->devices.push_back(std::move(device));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(
      c10::make_intrusive<c10d::PrefixStore>("gloo", store), rank, size, opts);
}

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

// The interface Gloo binds: GLOO_SOCKET_IFNAME, else loopback for a loopback master, else the
// address that routes to the master (right with several interfaces, and where the host name
// resolves to loopback: containers, pods, network namespaces), else the host's default.
std::shared_ptr<::gloo::transport::Device> GlooDeviceFor(const std::string& master_addr) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  if (IsLoopback(master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  if (const std::string local = local_address_for(master_addr); !local.empty()) {
    return c10d::ProcessGroupGloo::createDeviceForHostname(local);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

#ifdef DLRUN_WITH_CUDA
// NCCL on one GPU per process: the device of LOCAL_RANK (or the one visible device when dlrun
// narrows CUDA_VISIBLE_DEVICES), over its own view of the store.
c10::intrusive_ptr<c10d::Backend> NcclBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                              const DistEnv& e, std::chrono::milliseconds timeout) {
  const int ndev = static_cast<int>(torch::cuda::device_count());
  if (ndev == 0) {  // init() checks before; a regroup on a machine whose GPUs went away may not
    throw std::runtime_error("backend 'nccl' needs a GPU, and none is visible to this process");
  }
  const auto dev = static_cast<c10::DeviceIndex>(ndev == 1 ? 0 : e.local_rank % ndev);
  c10::cuda::set_device(dev);
  detail::TurnOffNcclTeardownForRecovery();  // read by ProcessGroupNCCL's constructor
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(
      c10::make_intrusive<c10d::PrefixStore>("nccl", store), e.rank, e.world_size, opts);
  nccl->setBoundDeviceId(c10::Device(c10::DeviceType::CUDA, dev));
  return nccl;
}
#endif

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size, const std::string& address,
                                                    std::chrono::milliseconds timeout) {
  return MakeProcessGroup(store, rank, size,
                          GlooBackend(store, rank, size,
                                      address.empty()
                                          ? c10d::ProcessGroupGloo::createDefaultDevice()
                                          : c10d::ProcessGroupGloo::createDeviceForHostname(address),
                                      timeout),
                          nullptr);
}

std::string resolve_backend(const std::string& requested) {
  if (requested != "auto" && requested != "gloo" && requested != "nccl") {
    throw std::runtime_error(lite::StrCat("unknown backend '", requested,
                                          "': expected auto, gloo or nccl"));
  }
#ifdef DLRUN_WITH_CUDA
  const bool have_gpu = torch::cuda::is_available();
  if (requested == "auto") return have_gpu ? "nccl" : "gloo";
  if (requested == "nccl" && !have_gpu) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw std::runtime_error(lite::StrCat(
        "backend 'nccl' needs a GPU, and none is visible to this process (CUDA_VISIBLE_DEVICES='",
        visible ? visible : "(unset)", "', ", torch::cuda::device_count(),
        " device(s)): use gloo, or run where a GPU is"));
  }
#else
  if (requested == "auto") return "gloo";
  if (requested == "nccl") {
    throw std::runtime_error(
        "backend 'nccl' is not available: this LibTorch build has no CUDA (a CPU-only torch); use "
        "gloo, or build dlrun against a CUDA build of torch");
  }
#endif
  return requested;
}

namespace detail {

void TurnOffNcclTeardownForRecovery() {
  if (std::getenv(contract::kControlFd) == nullptr) return;
  const char* dflt = std::getenv(contract::kNcclErrorHandlingDefault);
  const bool dlrun_default = dflt != nullptr && std::string(dflt) == "1";
  setenv(contract::kNcclAsyncErrorHandling, "0", dlrun_default ? 1 : 0);
  if (dlrun_default) setenv(contract::kNcclAsyncErrorHandlingOld, "0", 1);
}

void ConnectGroup(Context& ctx, const std::string& backend, std::chrono::milliseconds timeout) {
  const DistEnv& e = ctx.env;
  c10d::TCPStoreOptions so;
  // A single process has no one to meet: its store takes a free port, so a job that runs alone
  // (a test, a quick try) never fails on a MASTER_PORT another job on the node holds.
  so.port = e.world_size == 1 ? 0 : static_cast<uint16_t>(e.master_port);
  so.isServer = e.rank == 0;
  // Under torchrun the agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True): every rank is
  // a client, and each attempt's keys live under their own prefix, as torch.distributed's env://
  // does; a restarted group must not find the last attempt's Gloo addresses.
  const char* agent_store = std::getenv(contract::kUseAgentStore);
  const bool torchrun_store = agent_store != nullptr && std::string(agent_store) == "True" &&
                              e.world_size > 1;
  if (torchrun_store) so.isServer = false;
  so.numWorkers = e.world_size;
  so.waitWorkers = false;
  so.timeout = timeout;
  if (e.rank != 0 || torchrun_store) AwaitListener(e.master_addr, e.master_port, timeout);
  try {
    ctx.store = c10::make_intrusive<c10d::TCPStore>(e.master_addr, so);
    if (torchrun_store) {
      ctx.store = c10::make_intrusive<c10d::PrefixStore>(
          lite::StrCat("/worker/attempt_", e.restart_count), ctx.store);
    }
  } catch (const std::exception& ex) {
    std::string what = ex.what();
    what = what.substr(0, what.find('\n'));
    throw std::runtime_error(lite::StrCat(
        e.rank == 0 ? "rank 0 cannot host the c10d store on " : "cannot reach the c10d store at ",
        e.master_addr, ":", e.master_port, " within ", timeout.count() / 1000.0,
        " s (MASTER_ADDR/MASTER_PORT): ", what));
  }
  auto gloo = GlooBackend(ctx.store, e.rank, e.world_size, GlooDeviceFor(e.master_addr), timeout);
  c10::intrusive_ptr<c10d::Backend> nccl;
#ifdef DLRUN_WITH_CUDA
  if (backend == "nccl") nccl = NcclBackend(ctx.store, e, timeout);
#endif
  ctx.pg = MakeProcessGroup(ctx.store, e.rank, e.world_size, gloo, nccl);
}

}  // namespace detail

Context init(const InitOptions& options) {
  // A warm spare waits here for the attempt it will run (docs/RECOVERY.md).
  std::optional<std::chrono::steady_clock::time_point> promoted_at;
  if (await_promotion()) promoted_at = std::chrono::steady_clock::now();
  if (options.keep_freed_memory) keep_freed_memory();
  if (options.crash_trace) install_crash_trace();
  // dlrun starts C++ workers with SIGPIPE's default (an ignored signal would survive exec into any
  // program); a survivor's write to a lost peer's socket must fail with EPIPE, not kill it.
  if (options.ignore_sigpipe) ignore_sigpipe_unless_handled();
  Context ctx;
  try {
    ctx.env = parse_dist_env(process_environment());
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());  // init() reports its errors as runtime_error
  }
  ctx.promoted_at = promoted_at;

  std::chrono::milliseconds timeout = options.timeout;
  if (const char* t = std::getenv(contract::kInitTimeout)) {
    double s = 0;
    if (!lite::SimpleAtod(t, &s) || s <= 0) {
      throw std::runtime_error(lite::StrCat("environment variable ", contract::kInitTimeout, "='", t,
                                            "' is invalid: expected seconds > 0"));
    }
    timeout = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  }
  const std::string backend = resolve_backend(options.backend);
  ctx.backend = backend;
  detail::ConnectGroup(ctx, backend, timeout);
  profile_capture_at_start();  // --profile nsys --profile-steps 0:B (dlrun/nvtx_ranges.h)
  return ctx;
}

torch::Tensor Context::all_reduce(torch::Tensor t, c10d::ReduceOp op) const {
  std::vector<torch::Tensor> v{t};
  c10d::AllreduceOptions o;
  o.reduceOp = op;
  detail::WaitWork(pg->allreduce(v, o));
  return t;
}

std::vector<torch::Tensor> Context::all_gather(const torch::Tensor& t) const {
  std::vector<torch::Tensor> in{t.contiguous()};
  std::vector<std::vector<torch::Tensor>> out(1);
  for (int r = 0; r < pg->getSize(); ++r) out[0].push_back(torch::empty_like(in[0]));
  detail::WaitWork(pg->allgather(out, in));
  return out[0];
}

torch::Tensor Context::broadcast(torch::Tensor t, int root) const {
  if (root < 0 || root >= pg->getSize()) {
    throw std::invalid_argument(lite::StrCat("broadcast: root ", root, " is not a rank of this ",
                                             pg->getSize(), "-rank group"));
  }
  std::vector<torch::Tensor> v{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  detail::WaitWork(pg->broadcast(v, o));
  return t;
}

void Context::barrier() const { detail::WaitWork(pg->barrier()); }

std::vector<int> Context::ranks_differing(uint64_t value) const {
  // The 64 bits as an int64 (Gloo has no uint64 allgather).
  const auto all = all_gather(torch::tensor({static_cast<int64_t>(value)}, torch::kLong));
  std::vector<int> differ;
  const int64_t first = all[0].item<int64_t>();
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r].item<int64_t>() != first) differ.push_back(static_cast<int>(r));
  }
  return differ;
}

bool Context::ranks_agree(uint64_t value) const { return ranks_differing(value).empty(); }

uint64_t digest(const std::vector<torch::Tensor>& tensors) {
  uint64_t h = detail::kFnv1aOffset;
  for (const auto& t : tensors) {
    torch::Tensor c = t.detach().contiguous().cpu();
    h = detail::WordHash(c.data_ptr(), c.numel() * c.element_size(), h);
  }
  return h;
}

}  // namespace dlrun::worker

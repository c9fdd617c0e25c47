// The train_unet program: the SC22 tutorial's U-Net trainer on LibTorch + dlrun::worker.
#include "unet/trainer_impl.h"

namespace train_unet_internal {

// The tutorial's loss: L1, plus lambda_rho x L1 of exp(14 x) on channel 0 (the density), which
// weights the dense regions.
torch::Tensor Loss(const torch::Tensor& gen, const torch::Tensor& tar, double lambda_rho) {
  torch::Tensor loss = torch::l1_loss(gen, tar);
  if (lambda_rho > 0) {
    loss = loss + lambda_rho * torch::l1_loss(torch::exp(14 * gen.select(1, 0)),
                                              torch::exp(14 * tar.select(1, 0)));
  }
  return loss;
}

// SIGUSR1 (e.g. Slurm's --signal=USR1@90 before preemption, forwarded by dlrun): checkpoint at
// the end of the current step.
std::atomic<bool> g_checkpoint_requested{false};
void OnSigusr1(int) { g_checkpoint_requested = true; }

// This process replaces a lost rank (contract::kRecoveryGen: a generation after the first).
bool IsReplacement() {
  const char* gen = std::getenv(dlrun::contract::kRecoveryGen);
  return gen != nullptr && std::atoi(gen) > 0;
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Seconds since this process started (its exec, before LibTorch was loaded), from
// /proc/self/stat's start time in clock ticks since boot; -1 if unknown.
double SecondsSinceProcessStart() {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos) return -1;
  std::istringstream fields(stat.substr(paren + 2));
  std::string f;
  for (int i = 3; i < 22 && fields >> f; ++i) {
  }
  unsigned long long start_ticks = 0;
  if (!(fields >> start_ticks)) return -1;
  timespec now{};
  clock_gettime(CLOCK_BOOTTIME, &now);
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9 -
         static_cast<double>(start_ticks) / ticks;
}

// This process' peak resident memory (VmHWM), bytes; 0 when unreadable.
int64_t PeakRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}


void Trainer::ResolveSizes() {
  s_.rank = s_.ctx.rank();
  s_.world = s_.ctx.world_size();
  if (s_.a.global_batch_size > 0 && !s_.a.local_batch_given) {
    if (s_.a.global_batch_size % s_.world != 0) {
      throw std::runtime_error(lite::StrCat("global_batch_size ", s_.a.global_batch_size,
                                            " does not split over ", s_.world,
                                            " ranks: expected a multiple of the world size"));
    }
    s_.a.local_batch_size = s_.a.global_batch_size / s_.world;
  }
  // The global (effective) batch of one optimizer step: K micro-batches on every rank. The LR
  // scaling, the epochs and samples/s count it.
  s_.sizes.global_batch = s_.a.local_batch_size * s_.world * s_.a.accumulation_steps;
  // Epochs as in the tutorial: Nsamples per epoch over the global batch; without a config an
  // epoch is --max-steps steps (the whole run unless --num-epochs says more).
  s_.sizes.steps_per_epoch = s_.a.nsamples > 0
                                 ? std::max<int64_t>(1, s_.a.nsamples / s_.sizes.global_batch)
                                 : s_.a.max_steps;
  if (s_.a.num_epochs > 0 && (s_.a.nsamples == 0 || !s_.a.max_steps_given)) {
    s_.a.max_steps = s_.a.num_epochs * s_.sizes.steps_per_epoch;
  }
  if (s_.a.warmup_steps >= s_.a.max_steps) s_.a.warmup_steps = 0;
  s_.sizes.val_steps =
      s_.a.nsamples_val > 0 ? std::max<int64_t>(1, s_.a.nsamples_val / s_.sizes.global_batch) : 0;
}

// The model and its optimizer are built before init(): a warm spare waits inside init() until
// it is promoted, so a spare has them built already when it replaces a lost rank (only the
// group and the state from a peer are left). The environment gives the local rank and size.
void Trainer::Init() {
  dlrun::worker::DistEnv env;
  try {
    env = dlrun::worker::parse_dist_env(dlrun::worker::process_environment());
  } catch (const std::invalid_argument&) {
    // init() below reports it, in its own words.
  }
  SetThreads(env.local_world_size);
  BuildModel(env.local_rank);
  s_.ctx = dlrun::worker::init();
  s_.init_done_s = s_.ctx.promoted_at ? Seconds(*s_.ctx.promoted_at) : SecondsSinceProcessStart();
}

void Trainer::BuildModel(int local_rank) {
  torch::manual_seed(s_.a.seed);  // identical init everywhere; rank 0's values are broadcast anyway
  s_.model = dlrun::examples::UNet(
      dlrun::examples::UNetOptions{4, 5, s_.a.base_channels, s_.a.checkpoint_activations});
  // The GPU path (never run here: no GPU): the rank's device, cuDNN/TF32, channels-last,
  // autocast with loss scaling. On the CPU only channels-last can be asked for.
  s_.device = dlrun::examples::PickDevice(s_.a.device, local_rank);
  dlrun::examples::ConfigureBackends(s_.device, s_.a.tf32, s_.a.deterministic);
  s_.model->to(s_.device);
  s_.model->setBetweenLevels(dlrun::worker::interruption_point);  // a lost peer: give up at once
  s_.channels_last = s_.a.channels_last < 0 ? s_.device.is_cuda() : s_.a.channels_last > 0;
  if (s_.channels_last) dlrun::examples::ToChannelsLast(s_.model->parameters());
  s_.data.SetDevice(s_.device, s_.channels_last);
  s_.scaler = std::make_unique<dlrun::examples::GradScaler>(s_.a.amp && s_.device.is_cuda());
  s_.params = s_.model->parameters();
  s_.initial_digest = dlrun::worker::digest(s_.params);
  for (const auto& p : s_.params) s_.sizes.nparams += p.numel();
  s_.opt = std::make_unique<torch::optim::Adam>(s_.params, torch::optim::AdamOptions(s_.a.lr));
}

void Trainer::BuildSchedule() {
  s_.sched.start_lr = s_.a.lr;
  s_.sched.end_lr = s_.a.end_lr;
  s_.sched.tot_steps = s_.a.max_steps;
  s_.sched.warmup_steps = s_.a.lr_warmup_steps;
  s_.sched.global_batch_size = s_.sizes.global_batch;
  s_.sched.base_batch_size =
      s_.a.base_batch_size > 0 ? s_.a.base_batch_size : s_.sizes.global_batch;
  s_.sched.scaling = s_.a.lr_scaling;
  dlrun::worker::validate(s_.sched);
  if (s_.rank == 0) {
    for (const std::string& note : dlrun::worker::ineffective_settings(s_.sched)) {
      std::fprintf(stderr, "train_unet: note: %s\n", note.c_str());
    }
  }
  s_.progress.lr = s_.a.lr;
}

// Resume after an elastic restart or a requeue: the collective resume, so every rank loads the
// newest checkpoint any rank holds (the directory may be shared or node-local: the file goes to
// the ranks without it in one broadcast); a replacement of a lost rank takes the state from a
// survivor instead. Then the DDP wrapper, as with PyTorch: dlrun::worker::Recoverable does all
// three, and makes the wrapper anew after a recovery.
void Trainer::Resume() {
  if (s_.a.fail_replacement == "hang" && IsReplacement()) {  // testing: one that never joins
    std::fprintf(stderr, "train_unet: --fail-replacement hang: not joining\n");
    std::fflush(stderr);
    for (;;) pause();
  }
  dlrun::worker::RecoverableOptions o;
  o.ddp.bucket_cap_mb = s_.a.bucket_cap_mb;
  o.ddp.broadcast_buffers = s_.a.broadcast_buffers;
  o.ddp.fp16_compression = s_.a.fp16_grad_compression;
  o.state.capture = [this] {
    dlrun::worker::TrainingState st;
    if (s_.scaler->enabled()) {  // the AMP loss scale (CUDA), so a resume goes on with it
      st.values["amp.scale"] = s_.scaler->currentScale();
      st.values["amp.good_steps"] = s_.scaler->goodSteps();
    }
    return st;
  };
  o.state.restore = [this](const dlrun::worker::TrainingState& st) {
    if (s_.a.fail_replacement == "differs") {  // testing: replicas that differ must be refused
      torch::NoGradGuard no_grad;
      s_.params[0].add_(1e-3);
    }
    const auto& v = st.values;
    if (s_.scaler->enabled() && v.count("amp.scale") && v.count("amp.good_steps")) {
      s_.scaler->restore(v.at("amp.scale").toDouble(), v.at("amp.good_steps").toInt());
    }
  };
  o.on_warning = [](const std::string& w) {
    std::fprintf(stderr, "train_unet: warning: %s\n", w.c_str());
  };
  o.on_recovery = [this](const dlrun::worker::Recovery::Outcome& r) { AfterRecovery(r); };
  if (!s_.a.checkpoint_dir.empty()) {
    s_.ckpt.emplace(dlrun::worker::CheckpointOptions{.dir = s_.a.checkpoint_dir, .keep_last = 3});
    o.checkpoint = &*s_.ckpt;
  }
  s_.rec.emplace(s_.ctx, s_.model, *s_.opt, std::move(o));
  s_.start_step = s_.rec->start_step();
  if (s_.rec->resumed() && s_.rank == 0) {
    // The restart's phases inside the worker (bench/recovery reads them).
    std::printf("resumed from step %ld (%s to init() done %.3f s, checkpoint load %.3f s)\n",
                s_.start_step, s_.ctx.promoted_at ? "promotion" : "process start", s_.init_done_s,
                s_.rec->resume_seconds());
  }
  if (s_.rec->replacement()) steps_.SaveIfLost(s_.start_step);
  std::signal(SIGUSR1, OnSigusr1);
}

// A peer was lost and the group regrouped: every rank now holds the state of step r.step, and
// the DDP wrapper is the new group's. The data streams go on after r.step, so the interrupted
// step is done again with the same samples.
// A lost node: the survivors go on at the smaller world size with their local batch (the
// global batch shrinks with it; the LR schedule and the epochs' length stay as they were), each
// rank's data stream now the one of its new rank.
void Trainer::AfterRecovery(const dlrun::worker::Recovery::Outcome& r) {
  const auto t = Clock::now();
  if (r.resized) {
    s_.rank = s_.ctx.rank();
    s_.world = s_.ctx.world_size();
    s_.sizes.global_batch = s_.a.local_batch_size * s_.world * s_.a.accumulation_steps;
  }
  OpenData(r.step);
  if (s_.rank == 0) {
    std::printf(
        "recovered in process at step %ld (generation %d, %.3f s; data again %.3f s): going on "
        "with step %ld%s\n",
        r.step, r.generation, r.seconds, Seconds(t), r.step + 1,
        r.resized ? lite::StrCat(" on ", s_.world, " rank(s)").c_str() : "");
    std::fflush(stdout);
  }
}

// The data streams where `at_step` steps left them (batch_feed.h), and on rank 0 (a survivor
// that became rank 0 too) the TensorBoard writer.
void Trainer::OpenData(int64_t at_step) {
  s_.data.Open(s_.a, s_.sizes.steps_per_epoch, s_.sizes.val_steps, s_.rank, s_.threads.loader,
               at_step);
  if (!s_.a.tensorboard_dir.empty() && s_.rank == 0 && !s_.tb) {
    auto w = dlrun::examples::EventWriter::Open(s_.a.tensorboard_dir);
    if (!w.ok()) throw std::runtime_error(std::string(w.status().message()));
    s_.tb = std::move(*w);
  }
}

void Trainer::PrintHeader() {
  if (s_.rank != 0) return;
  std::printf(
      "train_unet: %d rank(s), base width %ld (%.2f M parameters), %ld^3 crops, "
      "local batch %ld, %d thread(s) per rank, gradient sync %s, device %s%s%s\n",
      s_.world, s_.a.base_channels, s_.sizes.nparams / 1e6, s_.a.data_size, s_.a.local_batch_size,
      torch::get_num_threads(), s_.a.grad_sync ? "on" : "off", s_.device.str().c_str(),
      s_.scaler->enabled() ? ", AMP" : "", s_.channels_last ? ", channels-last" : "");
  std::printf("threads per rank: %d loader + %d intra-op (%d CPU(s) per rank)%s%s%s%s\n",
              s_.threads.loader, s_.threads.intra, s_.threads.cpus_per_rank,
              s_.a.accumulation_steps > 1 ? lite::StrCat(", ", s_.a.accumulation_steps,
                                                         " micro-batches per step (effective "
                                                         "global batch ",
                                                         s_.sizes.global_batch, ")")
                                                .c_str()
                                          : "",
              s_.a.checkpoint_activations ? ", activation checkpointing" : "",
              s_.device.is_cuda() && !s_.a.tf32 ? ", TF32 off" : "",
              s_.data.from_files() && s_.a.rotate_on_device ? ", rotations on the device" : "");
  std::printf("%s\n", s_.ddp().bucket_report().c_str());
  std::fflush(stdout);
}

// The thread budget: a rank's loader threads plus its intra-op threads fit the CPUs allocated
// to it (the CPUs this process may use, over the ranks of this node), unless the user chose
// the loader threads. Synthetic data needs no loader threads.
void Trainer::SetThreads(int local_world_size) {
  const dlrun::CpuAllocation cpus = dlrun::AllocatedCpus();
  const int local_world = std::max(1, local_world_size);
  s_.threads.cpus_per_rank = std::max(1, static_cast<int>(cpus.cpus / local_world));
  s_.threads.loader = s_.a.data.empty() ? 0 : s_.a.num_data_workers;
  if (s_.threads.loader > 0 && !s_.a.num_data_workers_given) {
    s_.threads.loader = std::clamp(s_.threads.cpus_per_rank - 1, 1, s_.a.num_data_workers);
  }
  s_.threads.intra =
      std::max(1, std::min(torch::get_num_threads(), s_.threads.cpus_per_rank - s_.threads.loader));
  torch::set_num_threads(s_.threads.intra);
}

// The last checkpoint, the summary, and every rank's parameter digest (so scripts can check
// the ranks agree bit for bit).
int Trainer::Finish() {
  if (s_.start_step < s_.a.max_steps &&
      !(s_.a.checkpoint_every > 0 && s_.a.max_steps % s_.a.checkpoint_every == 0)) {
    steps_.Save(s_.a.max_steps);
  }
  const int64_t timed_steps =
      std::max<int64_t>(1, s_.a.max_steps - s_.start_step - s_.a.warmup_steps);
  const double secs = Seconds(s_.progress.start);
  const double sps = timed_steps * s_.sizes.global_batch / secs;
  const uint64_t final_digest = dlrun::worker::digest(s_.params);
  double grad_sq = 0;
  for (const torch::Tensor& p : s_.params) {
    if (p.grad().defined()) grad_sq += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  }
  const double grad_norm = std::sqrt(grad_sq);
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(s_.device);
  std::vector<torch::Tensor> mine{torch::tensor({static_cast<int64_t>(final_digest)}, long_opts)};
  std::vector<std::vector<torch::Tensor>> all(1);
  for (int r = 0; r < s_.world; ++r) all[0].push_back(torch::zeros({1}, long_opts));
  all[0] = s_.ctx.all_gather(mine[0]);
  if (s_.rank != 0) return 0;
  std::printf("Time taken for %ld steps is %.3f sec, avg %.3f samples/sec\n", timed_steps, secs,
              sps);
  std::printf("final loss %.5f (first step %.5f), %.3f samples/s over %d rank(s)\n",
              s_.progress.last_loss, s_.progress.first_loss, sps, s_.world);
  if (s_.a.metrics_json.empty()) return 0;
  nlohmann::json j;
  j["world_size"] = s_.world;
  j["steps"] = s_.a.max_steps;
  j["local_batch_size"] = s_.a.local_batch_size;
  j["accumulation_steps"] = s_.a.accumulation_steps;
  j["global_batch_size"] = s_.sizes.global_batch;  // effective: ranks x local batch x micro-batches
  j["checkpoint_activations"] = s_.a.checkpoint_activations;
  j["peak_rss_bytes"] = PeakRssBytes();
  const int64_t peak_device = dlrun::examples::PeakDeviceMemoryBytes(s_.device);
  j["peak_device_memory_bytes"] = peak_device >= 0 ? nlohmann::json(peak_device) : nlohmann::json();
  // The most tensor memory allocated at once during the steps: max_memory_allocated on CUDA,
  // LibTorch's CPU allocation reports on the CPU.
  j["peak_allocated_bytes"] = peak_device >= 0 ? nlohmann::json(peak_device)
                              : s_.cpu_peak    ? nlohmann::json(s_.cpu_peak->peakBytes())
                                               : nlohmann::json();
  j["grad_norm"] = grad_norm;  // the last step's averaged gradient
  j["loader_threads"] = s_.threads.loader;
  j["intra_op_threads"] = s_.threads.intra;
  if (s_.a.target_loss > 0) {
    j["target_loss"] = s_.a.target_loss;
    j["target_loss_step"] =
        s_.progress.target_step >= 0 ? nlohmann::json(s_.progress.target_step) : nlohmann::json();
    j["target_loss_s"] =
        s_.progress.target_step >= 0 ? nlohmann::json(s_.progress.target_s) : nlohmann::json();
    j["target_loss_of"] =
        s_.progress.target_step >= 0 ? nlohmann::json(s_.progress.target_of) : nlohmann::json();
  }
  j["samples_per_sec"] = sps;
  j["start_step"] = s_.start_step;
  j["final_lr"] = s_.progress.lr;
  j["final_loss"] = s_.progress.last_loss;
  j["first_loss"] = s_.progress.first_loss;
  j["parameters"] = s_.sizes.nparams;
  j["initial_param_digest"] = std::to_string(s_.initial_digest);
  j["param_digests"] = nlohmann::json::array();
  for (const auto& t : all[0]) {
    j["param_digests"].push_back(std::to_string(static_cast<uint64_t>(t.item<int64_t>())));
  }
  std::ofstream out(s_.a.metrics_json);
  out << j.dump(2) << "\n";
  if (!out) {
    std::fprintf(stderr, "train_unet: cannot write --metrics-json %s\n", s_.a.metrics_json.c_str());
    return 1;
  }
  return 0;
}

int Trainer::Run() {
  Init();
  ResolveSizes();
  BuildSchedule();
  Resume();
  OpenData(s_.start_step);
  PrintHeader();
  if (s_.a.benchy) return steps_.Benchy();
  s_.progress.t0 = s_.progress.start = s_.progress.epoch_start = Clock::now();
  if (!s_.device.is_cuda() && s_.a.measure_allocations) {
    s_.cpu_peak = std::make_unique<dlrun::examples::CpuAllocationPeak>();
  }
  s_.rec->run(s_.a.max_steps, [&](int64_t step) {  // a step a lost peer interrupted comes again
    if (step == s_.start_step + s_.a.warmup_steps + 1) s_.progress.start = Clock::now();
    steps_.Step(step);  // its update ends the step: committed there
    if (step % s_.sizes.steps_per_epoch == 0 || step == s_.a.max_steps) steps_.EndOfEpoch(step);
  });
  return Finish();
}

}  // namespace train_unet_internal

namespace dlrun::examples {

using train_unet_internal::Trainer;

int TrainUnetMain(int argc, char** argv) {
  TrainArgs a;
  if (const int rc = ParseTrainArgs(argc, argv, &a); rc >= 0) return rc;
  try {
    const int rc = Trainer(a).Run();  // the trainer, its threads and group are gone after it
    if (rc == 0) dlrun::worker::report_done();
    return rc;
  } catch (const std::exception& e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    dlrun::worker::record_error("train_unet: " + what);
    std::fprintf(stderr, "train_unet: %s\n", what.c_str());
    return 1;
  }
}

}  // namespace dlrun::examples

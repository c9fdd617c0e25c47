// A process group's ranks as threads of one test: Gloo over one c10d::HashStore, on loopback.
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <functional>
#include <thread>
#include <vector>

#include "dlrun/worker.h"

namespace dlrun::testing {

// Runs `rank_main(ctx)` for each of `world` ranks, each in its own thread (rank 0 on this
// one), every context on the same store; returns when all have returned.
inline void RunRanksInThreads(int world, const std::function<void(worker::Context&)>& rank_main) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto run = [&](int rank) {
    worker::Context ctx;
    ctx.env.rank = rank;
    ctx.env.world_size = world;
    ctx.store = store;
    ctx.pg = worker::make_gloo_group(store, rank, world, "127.0.0.1", std::chrono::seconds(30));
    rank_main(ctx);
  };
  std::vector<std::thread> others;
  for (int rank = 1; rank < world; ++rank) others.emplace_back(run, rank);
  run(0);
  for (std::thread& t : others) t.join();
}

}  // namespace dlrun::testing

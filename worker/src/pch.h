// Precompiled header for the worker library and the examples: LibTorch's headers dominate the
// compile time on 2 cores (about 25 s per translation unit without this). Gloo's and NCCL's
// process-group headers are left out: only init.cc includes them.
#pragma once
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

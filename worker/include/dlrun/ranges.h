// The NVTX ranges' old name, kept for trainers that include it: use dlrun/nvtx_ranges.h.
#pragma once

#include "dlrun/nvtx_ranges.h"

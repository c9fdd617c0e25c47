// Defaults that several parts of dlrun share, each declared once: the ports (torchrun's own,
// so a job moves between the launchers unchanged). Plain constants, no dependencies.
#pragma once

namespace dlrun::defaults {

inline constexpr int kRdzvPort = 29400;    // the rendezvous server (torchrun's c10d rendezvous)
inline constexpr int kMasterPort = 29500;  // MASTER_PORT: the c10d store of node rank 0

}  // namespace dlrun::defaults

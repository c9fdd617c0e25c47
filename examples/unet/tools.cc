#include "unet/tools.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "unet/data.h"
#include "worker/src/text.h"

namespace dlrun::examples {

int MakeUnetDataMain(int argc, char** argv) {
  if (argc < 2 || argc > 4 || argv[1][0] == '-') {
    std::fprintf(stderr, "usage: make_unet_data OUT.h5 [EDGE=128] [SEED=1]\n");
    return argc >= 2 && std::string(argv[1]) == "--help" ? 0 : 2;
  }
  const long edge = argc > 2 ? std::atol(argv[2]) : 128;
  const long seed = argc > 3 ? std::atol(argv[3]) : 1;
  if (edge < 1 || edge > 2048) {
    std::fprintf(stderr, "make_unet_data: invalid EDGE '%s': expected 1-2048\n", argv[2]);
    return 2;
  }
  lite::Status s = WriteSyntheticFile(argv[1], edge, static_cast<uint64_t>(seed));
  if (!s.ok()) {
    std::fprintf(stderr, "make_unet_data: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("wrote %s: Nbody [4, %ld^3], Hydro [5, %ld^3]\n", argv[1], edge, edge);
  return 0;
}

}  // namespace dlrun::examples

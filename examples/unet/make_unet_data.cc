// make_unet_data: writes a valid U-Net data file (datasets Nbody [4, L^3], Hydro [5, L^3]) for
// tests and demos.   make_unet_data OUT.h5 [EDGE=128] [SEED=1]
#include "unet/tools.h"

int main(int argc, char** argv) { return dlrun::examples::MakeUnetDataMain(argc, argv); }

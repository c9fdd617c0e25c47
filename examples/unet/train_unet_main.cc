// train_unet: the SC22 tutorial's U-Net trainer on LibTorch + dlrun::worker.
//   dlrun --standalone --nproc-per-node 2 build/bin/train_unet --synthetic --max-steps 10
#include "unet/trainer.h"

int main(int argc, char** argv) { return dlrun::examples::TrainUnetMain(argc, argv); }

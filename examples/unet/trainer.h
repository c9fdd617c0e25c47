#pragma once

namespace dlrun::examples {

// The whole train_unet program (flags, training, reports); returns the exit code.
int TrainUnetMain(int argc, char** argv);

}  // namespace dlrun::examples

#pragma once

namespace dlrun::examples {
int MakeUnetDataMain(int argc, char** argv);
}  // namespace dlrun::examples

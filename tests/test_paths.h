// The paths a test executable needs (the built dlrun and trainers, the tests' Python, the source
// tree), as variables that one small source generated per executable defines
// (tests/CMakeLists.txt, dlrun_test_paths), not as -D string literals on every test source's
// command line: those name this clone's paths, and would make every test source a ccache miss
// in another clone of the same commit (cmake/DlrunCcache.cmake). An executable defines only the
// ones it uses; HAVE_NVTX_RECORD_LIB says whether the NVTX injection library was built.
#pragma once

namespace dlrun_test_paths {
extern const char kDlrunBin[], kSourceDir[], kTestPython[], kFakeNvmlLib[], kCrashProbe[],
    kBuildShareDir[], kTrainUnetBin[], kMakeUnetDataBin[], kDdpCheckBin[], kDdpTwinPy[],
    kNvtxRecordLib[];
}  // namespace dlrun_test_paths

#define DLRUN_BIN ::dlrun_test_paths::kDlrunBin
#define SOURCE_DIR ::dlrun_test_paths::kSourceDir
#define TEST_PYTHON ::dlrun_test_paths::kTestPython
#define FAKE_NVML_LIB ::dlrun_test_paths::kFakeNvmlLib
#define CRASH_PROBE ::dlrun_test_paths::kCrashProbe
#define BUILD_SHARE_DIR ::dlrun_test_paths::kBuildShareDir
#define TRAIN_UNET_BIN ::dlrun_test_paths::kTrainUnetBin
#define MAKE_UNET_DATA_BIN ::dlrun_test_paths::kMakeUnetDataBin
#define DDP_CHECK_BIN ::dlrun_test_paths::kDdpCheckBin
#define DDP_TWIN_PY ::dlrun_test_paths::kDdpTwinPy
#define NVTX_RECORD_LIB ::dlrun_test_paths::kNvtxRecordLib

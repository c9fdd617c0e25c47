// Flame graphs of sampled stacks (docs/PROFILING.md): `perf script` output folded into one line
// per distinct stack ("root;...;leaf COUNT", the format of FlameGraph's stackcollapse scripts and
// of `py-spy record --format raw`), drawn as an SVG, and the frames where a rank spent its time
// ("41% in at::native::conv3d (libtorch_cpu.so)") for the end-of-job report.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dlrun::launcher {

// Stack (frames root first, ';'-joined) -> samples.
using Folded = std::map<std::string, int64_t>;

// `perf script` output (its default fields, with call chains from -g) folded: the root is the
// command name, each frame its symbol without the offset ("[module]" where perf has none),
// kernel frames marked "_[k]".
Folded FoldPerfScript(const std::string& text);
// "a;b;c 12" lines (py-spy's raw format, or a saved .folded file); a line that is not one is an
// error naming it.
absl::StatusOr<Folded> ParseFolded(const std::string& text);
std::string FoldedText(const Folded& f);
int64_t TotalSamples(const Folded& f);

// An SVG flame graph (roots at the bottom, a frame's width its share of the samples), each frame
// titled with its name, samples and share; readable in any browser.
std::string FlameGraphSvg(const Folded& f, const std::string& title);

// The frames with the most samples of their own (where the samples' innermost frame is; a frame
// without a name, "[module]" or "[unknown]", counts for its nearest named caller, and samples
// with no named frame below the root, such as JIT-compiled kernels', are not ranked), largest
// first, at most `n`, with their share of all samples. A Python frame's lines count together
// ("f (file.py:12)" and "f (file.py:14)" are "f (file.py)").
struct HotFrame {
  std::string frame;
  double fraction = 0;
};
std::vector<HotFrame> HotFrames(const Folded& f, size_t n);
// A C++ frame as people say it: template arguments and parameter lists dropped, a std::function
// call named by its callable ("dnnl::impl::cpu::jit_gemm_convolution_utils::im2col_3d::{lambda}
// ::operator()" for "std::_Function_handler<void (long), ...{lambda(long)#1}>::_M_invoke").
std::string ShortCxxName(const std::string& name);
// "41% in f (file.py:12), 12% in g": for the report.
std::string HotFramesText(const std::vector<HotFrame>& hot);

}  // namespace dlrun::launcher

# Sourced by the package tests that build a user's CMake project (build_example.sh,
# build_unet.sh): their own speed-up, not the user's.
#   ccache_launcher DIR   sets the array `launcher` to the CMake arguments that compile through
#                         ccache where it is installed (a build of the same sources from another
#                         temporary directory DIR is then a cache hit; cmake/DlrunCcache.cmake),
#                         empty otherwise, and exports ccache's settings.
ccache_launcher() {
  launcher=()
  if command -v ccache >/dev/null && [[ -z "${CCACHE_DISABLE:-}" ]]; then
    # __FILE__ (in every TORCH_CHECK of the worker's sources) names this run's temporary
    # directory: mapped away, or no run would find the last one's objects.
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache "-DCMAKE_CXX_FLAGS=-fmacro-prefix-map=$1/=")
    export CCACHE_BASEDIR=$1 CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=15G \
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  fi
}

# ccache (Debian's package; scripts/install-deps) in front of every compiler of every tree: the
# development build, the wheel's build/wheel, the sanitizer and fuzz trees. Its cache lives
# outside the checkout (ccache's default, ~/.cache/ccache, as the torch environment does), so a
# second clone on the same machine (CI's) compiles little; a machine without ccache builds as
# before. docs/BUILD.md has the measured effect.
#   - base_dir = the source tree: the paths under it are hashed relative to the build directory,
#     so two clones at different paths share entries;
#   - max_size 15G: every tree of one clone (the default 5G held about two);
#   - hash_dir off: the compile directory (only in the debug information) does not split entries;
#   - __FILE__ relative to the source tree (-fmacro-prefix-map; gtest's and every logging macro's
#     file names): otherwise the preprocessed text, and so the entry, differs between clones;
#     CMake's unity files include each source by its absolute path, so they are found in
#     ccache's preprocessed mode (a few seconds for a LibTorch batch), not its direct one;
#   - sloppiness pch_defines,time_macros,include_file_mtime,include_file_ctime: the worker's
#     precompiled header (CMake's cmake_pch.hxx.gch) can be cached and used.
# -DDLRUN_CCACHE=OFF, or CCACHE_DISABLE=1 in the environment, turns it off.
option(DLRUN_CCACHE "Compile through ccache when it is installed" ON)
if(DLRUN_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(DLRUN_CCACHE_PROGRAM ccache)
  if(DLRUN_CCACHE_PROGRAM)
    set(_dlrun_ccache env CCACHE_BASEDIR=${PROJECT_SOURCE_DIR} CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=15G
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      ${DLRUN_CCACHE_PROGRAM})
    set(CMAKE_C_COMPILER_LAUNCHER ${_dlrun_ccache})
    set(CMAKE_CXX_COMPILER_LAUNCHER ${_dlrun_ccache})
    add_compile_options(-fmacro-prefix-map=${PROJECT_SOURCE_DIR}/=)
  endif()
endif()

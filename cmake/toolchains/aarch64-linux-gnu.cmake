# Cross-compiling dlrun for aarch64 (Grace nodes) on an x86_64 Debian machine (scripts/build-wheel
# --arch aarch64; docs/PACKAGING.md): Debian's cross compiler (g++-aarch64-linux-gnu) against a
# sysroot of Debian 12's arm64 -dev packages (scripts/arm64-sysroot): the same gcc 12, the same
# versions of gRPC, protobuf and abseil as the x86_64 build. Programs (protoc, grpc_cpp_plugin,
# Python) are the build machine's; libraries, headers and CMake packages the sysroot's only.
#   cmake -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake -DDLRUN_SYSROOT=DIR ...
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
if(NOT DLRUN_SYSROOT AND DEFINED ENV{DLRUN_SYSROOT})
  set(DLRUN_SYSROOT "$ENV{DLRUN_SYSROOT}")
endif()
if(NOT DLRUN_SYSROOT OR NOT EXISTS "${DLRUN_SYSROOT}/usr/include/grpcpp/grpcpp.h")
  message(FATAL_ERROR "DLRUN_SYSROOT='${DLRUN_SYSROOT}' is no arm64 sysroot with gRPC's headers: "
                      "expected the directory scripts/arm64-sysroot prints")
endif()
# try_compile projects see the variable too.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES DLRUN_SYSROOT)
set(CMAKE_SYSROOT "${DLRUN_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH "${DLRUN_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(ENV{PKG_CONFIG_SYSROOT_DIR} "${DLRUN_SYSROOT}")
set(ENV{PKG_CONFIG_LIBDIR}
    "${DLRUN_SYSROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:${DLRUN_SYSROOT}/usr/share/pkgconfig")

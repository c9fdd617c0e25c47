# Finds LibTorch for the worker library and the examples, checks it, and says which one in one
# line. Where it comes from, first match wins:
#   1. Torch_DIR (a cache or environment variable): a user's own LibTorch (the zip from PyTorch's
#      site, a conda env, a cluster module);
#   2. a Torch under CMAKE_PREFIX_PATH (cache or environment);
#   3. the project's Python: DLRUN_PYTHON (cache or environment), else .venv/bin/python3 made by
#      scripts/install-deps, asked for torch.utils.cmake_prefix_path.
# Reads DLRUN_PYTHON_EXE (cmake/DlrunPython.cmake). Sets DLRUN_TORCH_CUDA (ON when this LibTorch
# has CUDA and the GPU path is built), DLRUN_NCCL_INCLUDE_DIR and DLRUN_GLOO_INCLUDE_DIR. Every
# problem is one line that names the fix (dlrun_fail), then the configure stops.

set(DLRUN_TORCH_MIN 2.4)        # scripts/install-torch checks the same minimum
set(DLRUN_TORCH_TESTED 2.15.0)  # the version the README's set-up installs and CI runs
set(DLRUN_CUDA AUTO CACHE STRING
  "The GPU path (NCCL, CUDA streams): AUTO (when LibTorch has CUDA), ON (required) or OFF")
set_property(CACHE DLRUN_CUDA PROPERTY STRINGS AUTO ON OFF)
# One line on stderr (FATAL_ERROR's text is re-wrapped at 80 columns), then the stop.
function(dlrun_fail msg)
  message(NOTICE "dlrun: ${msg}")
  message(FATAL_ERROR "dlrun: configuration stopped (the line above names the problem and the fix)")
endfunction()

# 1 and 2: a TorchConfig.cmake the user pointed at.
set(_prefixes ${CMAKE_PREFIX_PATH})
if(DEFINED ENV{CMAKE_PREFIX_PATH})
  string(REPLACE ":" ";" _env_prefixes "$ENV{CMAKE_PREFIX_PATH}")
  list(APPEND _prefixes ${_env_prefixes})
endif()
set(_torch_dir "")
if(Torch_DIR)
  set(_torch_dir "${Torch_DIR}")
elseif(DEFINED ENV{Torch_DIR})
  set(_torch_dir "$ENV{Torch_DIR}")
else()
  foreach(p IN LISTS _prefixes)
    foreach(sub share/cmake/Torch lib/cmake/Torch . Torch)
      if(EXISTS "${p}/${sub}/TorchConfig.cmake")
        get_filename_component(_torch_dir "${p}/${sub}" ABSOLUTE)
        break()
      endif()
    endforeach()
    if(_torch_dir)
      break()
    endif()
  endforeach()
endif()
set(_torch_from "Torch_DIR/CMAKE_PREFIX_PATH")
if(_torch_dir AND DLRUN_TORCH_FROM_PYTHON AND _torch_dir STREQUAL DLRUN_TORCH_FROM_PYTHON_DIR)
  set(_torch_from "${DLRUN_TORCH_FROM_PYTHON}")  # found through the Python at the first configure
endif()
# 3: the project's Python.
if(NOT _torch_dir)
  if(NOT DLRUN_PYTHON_EXE)
    dlrun_fail("no LibTorch: run scripts/install-deps (it makes .venv with torch ${DLRUN_TORCH_TESTED}), or set DLRUN_PYTHON to a Python with torch >= ${DLRUN_TORCH_MIN}, or Torch_DIR to a LibTorch's share/cmake/Torch")
  endif()
  execute_process(
    COMMAND "${DLRUN_PYTHON_EXE}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _py_prefix ERROR_VARIABLE _py_err RESULT_VARIABLE _py_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _py_rc EQUAL 0)
    string(REGEX MATCH "[^\n]*\n?$" _py_last "${_py_err}")
    string(STRIP "${_py_last}" _py_last)
    dlrun_fail("'${DLRUN_PYTHON_EXE}' cannot import torch (${_py_last}): run scripts/install-deps, or set DLRUN_PYTHON to a Python with torch >= ${DLRUN_TORCH_MIN}")
  endif()
  set(_torch_dir "${_py_prefix}/Torch")
  set(_torch_from "${DLRUN_PYTHON_EXE}")
  set(DLRUN_TORCH_FROM_PYTHON "${DLRUN_PYTHON_EXE}" CACHE INTERNAL "")
  set(DLRUN_TORCH_FROM_PYTHON_DIR "${_torch_dir}" CACHE INTERNAL "")
endif()
if(NOT EXISTS "${_torch_dir}/TorchConfig.cmake")
  dlrun_fail("no TorchConfig.cmake in '${_torch_dir}': point Torch_DIR at a LibTorch's share/cmake/Torch")
endif()

# The version, before TorchConfig runs (an old one may fail inside it in other ways).
set(_torch_version "")
if(EXISTS "${_torch_dir}/TorchConfigVersion.cmake")
  file(STRINGS "${_torch_dir}/TorchConfigVersion.cmake" _v REGEX "PACKAGE_VERSION \"[0-9.]+\"")
  string(REGEX MATCH "[0-9]+\\.[0-9]+(\\.[0-9]+)?" _torch_version "${_v}")
endif()
if(NOT _torch_version)
  dlrun_fail("cannot read LibTorch's version from ${_torch_dir}/TorchConfigVersion.cmake")
endif()
if(_torch_version VERSION_LESS DLRUN_TORCH_MIN)
  dlrun_fail("LibTorch ${_torch_version} in ${_torch_dir} is too old: dlrun needs torch >= ${DLRUN_TORCH_MIN} (tested: ${DLRUN_TORCH_TESTED}); run scripts/install-deps, or set Torch_DIR or DLRUN_PYTHON to a newer one")
endif()

# CUDA: does this LibTorch have it, with which CUDA version (pip: version.py; the zip:
# build-version, "2.x.y+cu126")?
get_filename_component(_torch_prefix "${_torch_dir}/../../.." ABSOLUTE)
set(_torch_has_cuda OFF)
set(_torch_cuda_version "")
if(EXISTS "${_torch_prefix}/lib/libtorch_cuda.so")
  set(_torch_has_cuda ON)
  if(EXISTS "${_torch_prefix}/version.py")
    file(STRINGS "${_torch_prefix}/version.py" _v REGEX "^cuda")
    string(REGEX MATCH "[0-9]+\\.[0-9]+" _torch_cuda_version "${_v}")
  elseif(EXISTS "${_torch_prefix}/build-version")
    file(READ "${_torch_prefix}/build-version" _v)
    string(REGEX MATCH "cu([0-9]+)([0-9])" _m "${_v}")
    if(_m)
      set(_torch_cuda_version "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
    endif()
  endif()
endif()
if(DLRUN_CUDA STREQUAL "ON" AND NOT _torch_has_cuda)
  dlrun_fail("DLRUN_CUDA=ON but LibTorch ${_torch_version} in ${_torch_prefix} is a CPU-only build: use a CUDA build of torch, or DLRUN_CUDA=AUTO/OFF")
endif()
set(DLRUN_TORCH_CUDA OFF)
set(_cuda_note "CPU only")
if(_torch_has_cuda)
  # TorchConfig needs the CUDA toolkit for a CUDA build; without it, its own error is a wall.
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    dlrun_fail("LibTorch ${_torch_version} in ${_torch_prefix} is a CUDA ${_torch_cuda_version} build and needs the CUDA toolkit to build against: install it (nvcc on PATH, or CUDAToolkit_ROOT), or use a CPU-only LibTorch")
  endif()
  if(_torch_cuda_version)
    string(REGEX MATCH "^[0-9]+" _torch_cuda_major "${_torch_cuda_version}")
    if(NOT _torch_cuda_major EQUAL CUDAToolkit_VERSION_MAJOR)
      dlrun_fail("nvcc's CUDA ${CUDAToolkit_VERSION} (${CUDAToolkit_BIN_DIR}) does not match LibTorch's CUDA ${_torch_cuda_version}: use a CUDA ${_torch_cuda_major}.x toolkit (CUDAToolkit_ROOT) or a torch built for CUDA ${CUDAToolkit_VERSION_MAJOR}")
    endif()
  endif()
  if(NOT DLRUN_CUDA STREQUAL "OFF")
    set(DLRUN_TORCH_CUDA ON)
  endif()
  set(_cuda_note "CUDA ${_torch_cuda_version} (toolkit ${CUDAToolkit_VERSION} at ${CUDAToolkit_BIN_DIR})")
endif()

# dlrun compiles no CUDA kernels of its own (only host code against LibTorch's CUDA API), so the
# architectures do not matter; naming some skips TorchConfig's GPU probe (a try_run that fails
# without a GPU and under C++20).
if(DLRUN_TORCH_CUDA AND NOT TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
endif()
set(Torch_DIR "${_torch_dir}" CACHE PATH "LibTorch's share/cmake/Torch" FORCE)
find_package(Torch CONFIG REQUIRED PATHS "${_torch_dir}" NO_DEFAULT_PATH)

# PyPI's torch: link the CUDA runtime, NVRTC and NCCL of its nvidia-* wheels (DlrunTorchWheel.cmake).
include(${CMAKE_CURRENT_LIST_DIR}/DlrunTorchWheel.cmake)
dlrun_torch_wheel_fixes("${_torch_prefix}")
add_link_options(${DLRUN_TORCH_LINK_OPTIONS})

# Gloo's headers: ProcessGroupGloo.hpp includes <gloo/...>. PyPI's wheel ships none; the zip
# may. Only worker/src/init.cc includes it.
find_path(DLRUN_GLOO_INCLUDE_DIR gloo/context.h HINTS ${TORCH_INCLUDE_DIRS})
if(NOT DLRUN_GLOO_INCLUDE_DIR)
  dlrun_fail("Gloo's headers (gloo/context.h) are missing: apt-get install libgloo-dev (scripts/install-deps does)")
endif()

set(_nccl_note "")
if(DLRUN_TORCH_CUDA)
  # The nccl.h torch was built with (pip: nvidia-nccl beside torch), else the toolkit's.
  find_path(DLRUN_NCCL_INCLUDE_DIR nccl.h NO_DEFAULT_PATH
    PATHS "${_torch_prefix}/../nvidia/nccl/include" ${CUDAToolkit_INCLUDE_DIRS})
  if(NOT DLRUN_NCCL_INCLUDE_DIR)
    find_path(DLRUN_NCCL_INCLUDE_DIR nccl.h)
  endif()
  if(NOT DLRUN_NCCL_INCLUDE_DIR)
    dlrun_fail("LibTorch has CUDA but nccl.h is missing: install NCCL's headers (libnccl-dev or pip's nvidia-nccl), or DLRUN_CUDA=OFF")
  endif()
  file(STRINGS "${DLRUN_NCCL_INCLUDE_DIR}/nccl.h" _n REGEX "#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE "[^0-9;]" "" _n "${_n}")
  string(REPLACE ";" "." _n "${_n}")
  set(_nccl_note ", NCCL ${_n}")
endif()

message(STATUS "dlrun: LibTorch ${_torch_version} from ${_torch_from} (${_torch_prefix}), "
  "${_cuda_note}${_nccl_note}; GPU path ${DLRUN_TORCH_CUDA}")

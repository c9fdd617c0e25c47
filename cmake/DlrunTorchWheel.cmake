# PyPI's torch (a CUDA build) loads the CUDA runtime, NVRTC and NCCL it was built with from the
# nvidia-* wheels beside it. A program linking it next to a CUDA toolkit must link those too, not
# the toolkit's: the toolkit's libcudart.so.N, loaded first, would also serve libtorch_cuda.so,
# and the linker would resolve libtorch_cuda.so's NCCL in the toolkit (an older one: undefined
# references). Used by cmake/DlrunTorch.cmake and by the installed dlrunConfig.cmake.
#   dlrun_torch_wheel_fixes(<torch install prefix>)
# Re-points CUDA::cudart and TORCH_LIBRARIES' libnvrtc at the wheels' copies and sets
# DLRUN_TORCH_LINK_OPTIONS (-rpath-link to the wheels' lib directories). Does nothing for a
# LibTorch without nvidia-* wheels beside it (the zip, a conda env, Debian's).
macro(dlrun_torch_wheel_fixes _dlrun_prefix)
  set(DLRUN_TORCH_LINK_OPTIONS "")
  file(GLOB _dlrun_wheel_cudart "${_dlrun_prefix}/../nvidia/*/lib/libcudart.so.*")
  file(GLOB _dlrun_wheel_nvrtc "${_dlrun_prefix}/../nvidia/*/lib/libnvrtc.so.*")
  file(GLOB _dlrun_wheel_libdirs LIST_DIRECTORIES true "${_dlrun_prefix}/../nvidia/*/lib")
  if(_dlrun_wheel_cudart AND TARGET CUDA::cudart)
    list(GET _dlrun_wheel_cudart 0 _dlrun_wheel_cudart)
    set_target_properties(CUDA::cudart PROPERTIES IMPORTED_LOCATION "${_dlrun_wheel_cudart}")
  endif()
  if(_dlrun_wheel_nvrtc)
    list(GET _dlrun_wheel_nvrtc 0 _dlrun_wheel_nvrtc)
    list(TRANSFORM TORCH_LIBRARIES REPLACE ".*/libnvrtc\\.so$" "${_dlrun_wheel_nvrtc}")
  endif()
  foreach(_dlrun_d IN LISTS _dlrun_wheel_libdirs)
    list(APPEND DLRUN_TORCH_LINK_OPTIONS "LINKER:-rpath-link,${_dlrun_d}")
  endforeach()
endmacro()

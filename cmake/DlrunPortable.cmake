# DLRUN_PORTABLE=ON: `dlrun` and its rendezvous plugin need nothing at run time but the C
# library (libc, libm, libdl, libpthread, librt and the dynamic loader), so the wheel runs on any
# Linux with the build machine's glibc or newer (docs/PACKAGING.md):
#   - libstdc++ and libgcc linked statically;
#   - spdlog and fmt header-only (dlrun_spdlog, used everywhere instead of spdlog::spdlog);
#   - every imported library that Debian also ships as a static archive (abseil, gRPC, protobuf,
#     c-ares, re2, upb, OpenSSL, zlib) re-pointed at its .a (dlrun_prefer_static);
#   - the plugin's symbols from those archives kept inside it (--exclude-libs), so two copies
#     (the launcher's abseil and the plugin's) never interpose on each other.
# OFF (the default, the development build): the shared libraries, as Debian links them.
option(DLRUN_PORTABLE "Link dlrun and its rendezvous plugin statically (the wheel)" OFF)
# DLRUN_GLIBC_STUBS=DIR (scripts/glibc-stubs, which scripts/build-wheel passes): the portable
# executable links against an older glibc's symbol set (2.28): DIR's start file and libc.so
# stubs come before the build machine's (-B, -L), so each call binds to a version glibc 2.28
# has; launcher/portable_glibc.cc defines what the static C++ runtime needs beyond it.
set(DLRUN_GLIBC_STUBS "" CACHE PATH "Link the portable dlrun against these glibc stubs")

add_library(dlrun_spdlog INTERFACE)
if(DLRUN_PORTABLE)
  find_package(fmt CONFIG REQUIRED)
  get_target_property(_spdlog_inc spdlog::spdlog INTERFACE_INCLUDE_DIRECTORIES)
  get_target_property(_fmt_inc fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
  target_include_directories(dlrun_spdlog SYSTEM INTERFACE ${_spdlog_inc} ${_fmt_inc})
  target_compile_definitions(dlrun_spdlog INTERFACE SPDLOG_FMT_EXTERNAL FMT_HEADER_ONLY)
  target_link_libraries(dlrun_spdlog INTERFACE Threads::Threads)
else()
  target_link_libraries(dlrun_spdlog INTERFACE spdlog::spdlog)
endif()

# Re-points each imported target reachable from `tgt` whose library is a .so at the .a beside it,
# where there is one. Libraries with no archive stay shared and show in the wheel check
# (tests/package/wheel_test.sh), which allows only the C library's.
function(dlrun_prefer_static tgt)
  if(NOT TARGET "${tgt}")
    return()
  endif()
  get_target_property(_aliased "${tgt}" ALIASED_TARGET)
  if(_aliased)
    set(tgt "${_aliased}")
  endif()
  get_property(_seen GLOBAL PROPERTY DLRUN_STATIC_SEEN)
  if("${tgt}" IN_LIST _seen)
    return()
  endif()
  set_property(GLOBAL APPEND PROPERTY DLRUN_STATIC_SEEN "${tgt}")
  get_target_property(_imported "${tgt}" IMPORTED)
  if(_imported)
    foreach(_p IMPORTED_LOCATION IMPORTED_LOCATION_NONE IMPORTED_LOCATION_NOCONFIG
               IMPORTED_LOCATION_RELEASE IMPORTED_LOCATION_RELWITHDEBINFO IMPORTED_LOCATION_DEBUG)
      get_target_property(_loc "${tgt}" ${_p})
      if(_loc AND _loc MATCHES "^(.*)\\.so(\\.[0-9.]+)?$")
        if(EXISTS "${CMAKE_MATCH_1}.a")
          set_target_properties("${tgt}" PROPERTIES ${_p} "${CMAKE_MATCH_1}.a")
        endif()
      endif()
    endforeach()
  endif()
  get_target_property(_deps "${tgt}" INTERFACE_LINK_LIBRARIES)
  if(_deps)
    set(_new "")
    foreach(_d IN LISTS _deps)
      string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" _dep "${_d}")
      if(TARGET "${_dep}")
        dlrun_prefer_static("${_dep}")
      elseif(_imported AND _dep MATCHES "^-l?([A-Za-z0-9_+.-]+)$")
        # A bare "re2" or "-lre2" (gRPC's Findre2, from pkg-config): the archive when there is
        # one; never the C library's own (libm.a, libdl.a ...) or the compiler's.
        set(_name "${CMAKE_MATCH_1}")
        if(NOT _name MATCHES "^(c|m|dl|rt|pthread|atomic|gcc_s|stdc\\+\\+)$")
          find_library(_lib NAMES "lib${_name}.a" NO_CACHE)
          if(_lib)
            set(_d "${_lib}")
          endif()
        endif()
      endif()
      list(APPEND _new "${_d}")
    endforeach()
    if(_imported)
      set_target_properties("${tgt}" PROPERTIES INTERFACE_LINK_LIBRARIES "${_new}")
    endif()
  endif()
endfunction()

# The link options of a portable executable or module.
function(dlrun_portable_link tgt)
  if(NOT DLRUN_PORTABLE)
    return()
  endif()
  target_link_options(${tgt} PRIVATE -static-libstdc++ -static-libgcc -Wl,--exclude-libs,ALL
    -Wl,--as-needed)
  if(DLRUN_GLIBC_STUBS)
    if(NOT EXISTS "${DLRUN_GLIBC_STUBS}/libc.so" OR NOT EXISTS "${DLRUN_GLIBC_STUBS}/Scrt1.o")
      message(FATAL_ERROR "DLRUN_GLIBC_STUBS='${DLRUN_GLIBC_STUBS}' holds no libc.so and Scrt1.o: "
                          "expected the directory scripts/glibc-stubs prints")
    endif()
    target_link_options(${tgt} PRIVATE -B${DLRUN_GLIBC_STUBS} -L${DLRUN_GLIBC_STUBS})
  endif()
endfunction()

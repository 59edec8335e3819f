# Loading a package's CMake config in a child CMake run.
#
#   trident_config_loads(<Package> <state-var> <why-var>)
#
# A package config may itself call find_package(... REQUIRED) for something that only a
# Debian *Recommends* brings in: oneDNN's dnnl-config.cmake calls find_package(OpenCL REQUIRED),
# and OpenCL's development files (ocl-icd-opencl-dev) are not a dependency of libdnnl-dev. In this
# configure such a failure would be a fatal CMake error that no QUIET can catch, so an optional
# package is loaded first in a throw-away project with the same compilers and search paths.
# <state-var> is LOADS when the config loads there, MISSING when no config of <Package> is
# installed, BROKEN when one is installed but fails to load; then <why-var> holds the first line
# that says why (e.g. "Could NOT find OpenCL (missing: OpenCL_LIBRARY OpenCL_INCLUDE_DIR)").
function(trident_config_loads pkg state_var why_var)
  set(dir "${CMAKE_BINARY_DIR}/CMakeFiles/trident_probe_${pkg}")
  file(REMOVE_RECURSE "${dir}")
  file(WRITE "${dir}/CMakeLists.txt"
       "cmake_minimum_required(VERSION 3.20)\nproject(trident_probe_${pkg} LANGUAGES C CXX)\n"
       "find_package(${pkg} CONFIG REQUIRED)\n")
  set(args -S "${dir}" -B "${dir}/build" -G "${CMAKE_GENERATOR}"
      "-DCMAKE_C_COMPILER=${CMAKE_C_COMPILER}" "-DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}")
  foreach(var CMAKE_PREFIX_PATH CMAKE_FIND_ROOT_PATH ${pkg}_DIR ${pkg}_ROOT)
    if(DEFINED ${var} AND NOT "${${var}}" STREQUAL "")
      string(REPLACE ";" "\\;" value "${${var}}")
      list(APPEND args "-D${var}=${value}")
    endif()
  endforeach()
  execute_process(COMMAND "${CMAKE_COMMAND}" ${args}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  file(REMOVE_RECURSE "${dir}")
  set(${why_var} "" PARENT_SCOPE)
  if(rc EQUAL 0)
    set(${state_var} LOADS PARENT_SCOPE)
    return()
  endif()
  if(err MATCHES "Could not find a package configuration file provided by \"${pkg}\"")
    set(${state_var} MISSING PARENT_SCOPE)
    return()
  endif()
  set(${state_var} BROKEN PARENT_SCOPE)
  # the most specific line: a dependency that was not found, else the first error text
  string(REGEX MATCH "Could NOT find [^\n]*" why "${err}")
  if(NOT why)
    string(REGEX MATCH "CMake Error[^\n]*\n[ \t]*([^\n]+)" _ "${err}")
    set(why "${CMAKE_MATCH_1}")
  endif()
  if(NOT why)
    set(why "its CMake config failed to load (exit ${rc})")
  endif()
  string(STRIP "${why}" why)
  set(${why_var} "${why}" PARENT_SCOPE)
endfunction()

# Test helpers.
#   trident_add_unit_test(name SOURCES ...)        one rank, GoogleTest, discovered cases
#   trident_add_mpi_test(name NP n COMMAND ...)   runs COMMAND under mpiexec -n n
include(GoogleTest)

function(trident_add_unit_test name)
  cmake_parse_arguments(A "" "" "SOURCES" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  trident_kokkos_sources(${A_SOURCES})  # CUDA builds: compiled as CUDA (they include Kokkos)
  target_link_libraries(${name} PRIVATE trident_core GTest::gtest trident_test_main)
  # gtest_discover_tests flattens list-valued properties, so unit tests carry the one label.
  # exit code 77: a CUDA build on a machine without a GPU (tests/test_main.cpp) -> skipped.
  # CUDA builds list the tests when CTest runs (a build host may lack the driver's libcuda).
  set(mode POST_BUILD)
  if(TRIDENT_ENABLE_CUDA)
    set(mode PRE_TEST)
  endif()
  gtest_discover_tests(${name} PROPERTIES LABELS unit TIMEOUT 300 SKIP_RETURN_CODE 77 DISCOVERY_TIMEOUT 60
                       DISCOVERY_MODE ${mode})
endfunction()

function(trident_add_mpi_test name)
  cmake_parse_arguments(A "" "NP;TIMEOUT" "COMMAND;LABELS;FIXTURES" ${ARGN})
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 600)
  endif()
  add_test(NAME ${name}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${A_NP} ${MPIEXEC_PREFLAGS} ${A_COMMAND} ${MPIEXEC_POSTFLAGS})
  set_tests_properties(${name} PROPERTIES LABELS "mpi;np${A_NP};${A_LABELS}" TIMEOUT ${A_TIMEOUT}
                                         PROCESSORS ${A_NP} SKIP_RETURN_CODE 77)
  if(A_FIXTURES)
    set_tests_properties(${name} PROPERTIES FIXTURES_REQUIRED "${A_FIXTURES}")
  endif()
endfunction()

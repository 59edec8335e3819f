# Test helpers.
#   trident_add_unit_test(name SOURCES ...)        one rank, GoogleTest, discovered cases
#   trident_add_mpi_test(name NP n COMMAND ...)   runs COMMAND under mpiexec -n n
#
# Against a Kokkos whose host execution space runs threads (OpenMP, e.g. -DKokkos_ROOT=<a Kokkos
# built with Kokkos_ENABLE_OPENMP>), every MPI test (and each tests/mpi check driver's check) runs
# with TRIDENT_TEST_THREADS (default 4)
# threads per rank and carries the label `threads`, and each unit-test executable gets one more
# test, threads_<name>, that runs all its cases at that many threads: `ctest -L threads` is the race
# check (a kernel that scatters without atomics, or reads what another thread writes, fails there
# as it would on a GPU). OMP_WAIT_POLICY=passive keeps idle threads off the cores MPI polls on.
include(GoogleTest)
set(TRIDENT_KOKKOS_THREADS OFF)
if(COMMAND kokkos_check)
  kokkos_check(DEVICES OpenMP RETURN_VALUE TRIDENT_KOKKOS_THREADS)
endif()
set(TRIDENT_TEST_THREADS 4 CACHE STRING "Threads per rank of the `threads` tests (threaded Kokkos builds)")
set(TRIDENT_THREADS_ENV "OMP_NUM_THREADS=${TRIDENT_TEST_THREADS};OMP_WAIT_POLICY=passive;OMP_PROC_BIND=false")
if(TRIDENT_KOKKOS_THREADS)
  message(STATUS "Kokkos runs host threads (OpenMP): tests labelled `threads` run at ${TRIDENT_TEST_THREADS} threads per rank")
endif()
# One thread per declared slot. CTest runs tests side by side (ctest -j N), each on the PROCESSORS it
# declares (default 1). A one-slot test's processes would otherwise each start a thread per core
# (Trident's GEMMs when OMP_NUM_THREADS is unset, PyTorch, OpenBLAS), so two such tests on 2 cores
# ran 4+ spinning threads: measured here, validation_t5_tiny_np1 beside validation_bert_tiny_np1
# took 61 s, 35 s at one thread each. trident_test_directory() at the top of a CMakeLists.txt gives
# every one-slot test of that directory (except RUN_SERIAL and `threads` ones) OMP_NUM_THREADS,
# OPENBLAS_NUM_THREADS and MKL_NUM_THREADS of 1 once the directory is read. Multi-slot tests keep
# the defaults (the apps share the node's cores among their ranks).
set(TRIDENT_ONE_THREAD_ENV "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;MKL_NUM_THREADS=1")
function(trident_one_thread_per_slot)
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(t ${tests})
    get_test_property(${t} PROCESSORS procs)
    get_test_property(${t} LABELS labels)
    get_test_property(${t} RUN_SERIAL serial)  # the whole machine (the Slurm cluster)
    if((NOT procs OR procs EQUAL 1) AND NOT serial AND NOT "threads" IN_LIST labels)
      set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "${TRIDENT_ONE_THREAD_ENV}")
    endif()
  endforeach()
endfunction()
macro(trident_test_directory)
  cmake_language(DEFER CALL trident_one_thread_per_slot)
endmacro()
# the top-level directory holds perf/'s tests (declared at its end, perf/CMakeLists.txt)
cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL trident_one_thread_per_slot)

# trident_threads_test(name...): in a threaded Kokkos build, these tests run at
# TRIDENT_TEST_THREADS threads per rank and carry the label `threads`
function(trident_threads_test)
  if(NOT TRIDENT_KOKKOS_THREADS)
    return()
  endif()
  foreach(t ${ARGN})
    set_property(TEST ${t} APPEND PROPERTY LABELS threads)
    set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "${TRIDENT_THREADS_ENV}")
  endforeach()
endfunction()

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
  # one value per property (above): OMP_NUM_THREADS=1 alone, the threads of the GEMMs and kernels
  gtest_discover_tests(${name} PROPERTIES LABELS unit TIMEOUT 300 SKIP_RETURN_CODE 77 ENVIRONMENT OMP_NUM_THREADS=1
                       DISCOVERY_TIMEOUT 60 DISCOVERY_MODE ${mode})
  if(TRIDENT_KOKKOS_THREADS)
    add_test(NAME threads_${name} COMMAND ${name})
    set_tests_properties(threads_${name} PROPERTIES LABELS threads TIMEOUT 900 SKIP_RETURN_CODE 77
                         ENVIRONMENT "${TRIDENT_THREADS_ENV}")
  endif()
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
  trident_threads_test(${name})
  if(A_FIXTURES)
    set_tests_properties(${name} PROPERTIES FIXTURES_REQUIRED "${A_FIXTURES}")
  endif()
endfunction()

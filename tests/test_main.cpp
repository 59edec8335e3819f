// GoogleTest main for Trident's unit tests: MPI and Kokkos are initialised once per process.
// Listing the tests (gtest_discover_tests, at build time) needs neither. In CUDA builds, on a
// machine without a GPU every test exits with code 77, which CTest reports as skipped
// (SKIP_RETURN_CODE), after saying why.
#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <cstring>

#include "comm/mpi_job.hpp"
#if defined(TRIDENT_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--gtest_list_tests") == 0) {
      ::testing::InitGoogleTest(&argc, argv);
      return RUN_ALL_TESTS();  // lists only
    }
#if defined(TRIDENT_ENABLE_CUDA)
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device on this machine: the GPU unit tests are skipped\n");
    return 77;
  }
#endif
  MPI_Init(&argc, &argv);
  trident::mpi_job::choose_wait_policy("auto");  // as the apps do: ranks sharing cores yield
  int rc = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    rc = RUN_ALL_TESTS();
    // a run whose every case skipped itself (GTEST_SKIP, with its reason printed) is a skip for
    // CTest (exit code 77), never a pass
    const auto* ut = ::testing::UnitTest::GetInstance();
    if (rc == 0 && ut->skipped_test_count() > 0 && ut->successful_test_count() == 0) rc = 77;
  }
  MPI_Finalize();
  return rc;
}

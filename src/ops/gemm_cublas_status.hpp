// The status check of cuBLAS and cuBLASLt calls (gemm_cuda.cpp, gemm_lt_cuda.cpp; CUDA builds only,
// after cublas_v2.h or cublasLt.h): a failed call throws one error naming the library, the call,
// its status and where it was made.
#pragma once
#include <sstream>

#include "common/error.hpp"

#define TRIDENT_CUBLAS_STATUS(library, call)                                                                  \
  do {                                                                                                        \
    cublasStatus_t trident_st_ = (call);                                                                      \
    if (trident_st_ != CUBLAS_STATUS_SUCCESS) {                                                               \
      std::ostringstream trident_os_;                                                                         \
      trident_os_ << library " call " #call " failed with status " << static_cast<int>(trident_st_) << " at " \
                  << __FILE__ << ":" << __LINE__;                                                             \
      throw ::trident::Error::one(trident_os_.str());                                                         \
    }                                                                                                         \
  } while (0)

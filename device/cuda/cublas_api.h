// cuBLAS, loaded on first use instead of at program start.
//
// Linking libcublas loads libcublasLt with it, whose load-time initialisation costs about
// 80 ms of page faults in every process, GPU work or not: each `qat` call, each test
// process, each `import qatgraph`. So qatgraph links no cuBLAS library; the first GEMM
// opens libcublas and resolves the few functions used here.
#pragma once

#include <cublas_v2.h>

namespace qg::cuda {

// The cuBLAS functions qatgraph calls. Each member has the type of the C function it names
// (cublas_v2.h maps cublasCreate to cublasCreate_v2 and the like; these are the _v2 ones).
struct CublasApi {
  decltype(&::cublasCreate_v2) Create;
  decltype(&::cublasDestroy_v2) Destroy;
  decltype(&::cublasSetStream_v2) SetStream;
  decltype(&::cublasSetMathMode) SetMathMode;
  decltype(&::cublasGetStatusString) GetStatusString;
  // C++ also sees an inline cublasGemmEx overload taking cudaDataType as the compute type;
  // the exported function is the one taking cublasComputeType_t, spelled out here.
  cublasStatus_t (*GemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                           const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                           int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                           cublasGemmAlgo_t);
  decltype(&::cublasDgemm_v2) Dgemm;
  decltype(&::cublasSgemmStridedBatched) SgemmStridedBatched;
  decltype(&::cublasDgemmStridedBatched) DgemmStridedBatched;
  cublasStatus_t (*GemmStridedBatchedEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                         int, int, const void*, const void*, cudaDataType, int,
                                         long long, const void*, cudaDataType, int, long long,
                                         const void*, void*, cudaDataType, int, long long, int,
                                         cublasComputeType_t, cublasGemmAlgo_t);
};

// Opens libcublas on the first call (thread-safe) and returns its functions. A library that
// cannot be opened, or that lacks one of them, is a qg::Error naming the file and why.
const CublasApi& cublas_api();

}  // namespace qg::cuda

// cuBLAS is opened on first use (device/cuda/cublas_api.h). Opening it and resolving its
// functions needs no GPU, so this runs wherever the CUDA backend is built.
#include <gtest/gtest.h>

#include <string>

#ifdef QG_WITH_CUDA
#include "device/cuda/cublas_api.h"

namespace qg::cuda {
namespace {

TEST(CublasApi, OpensTheLibraryAndResolvesEveryFunction) {
  const CublasApi& api = cublas_api();
  EXPECT_NE(api.Create, nullptr);
  EXPECT_NE(api.Destroy, nullptr);
  EXPECT_NE(api.SetStream, nullptr);
  EXPECT_NE(api.SetMathMode, nullptr);
  EXPECT_NE(api.GetStatusString, nullptr);
  EXPECT_NE(api.GemmEx, nullptr);
  EXPECT_NE(api.Dgemm, nullptr);
  EXPECT_NE(api.SgemmStridedBatched, nullptr);
  EXPECT_NE(api.DgemmStridedBatched, nullptr);
  EXPECT_NE(api.GemmStridedBatchedEx, nullptr);
  // A call through a resolved pointer: cuBLAS names its own status codes.
  EXPECT_EQ(std::string(api.GetStatusString(CUBLAS_STATUS_SUCCESS)), "success");
  EXPECT_EQ(&cublas_api(), &api);  // opened once
}

}  // namespace
}  // namespace qg::cuda
#else
TEST(CublasApi, OpensTheLibraryAndResolvesEveryFunction) {
  GTEST_SKIP() << "built without CUDA";
}
#endif
